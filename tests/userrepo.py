"""A user's repository for loop tests: a real git repo in a temp dir holding a copy of the CPU task,
with a smaller main shape and shorter bench budgets so an iteration takes a few seconds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_fast(*values):
    """A parametrized family's cases with the first in the fast tier and the rest marked slow: the fast tier runs each
    mechanism once between commits (README.md, Tests), the full suite every case (CI)."""
    import pytest
    return [pytest.param(v, marks=() if i == 0 else pytest.mark.slow) for i, v in enumerate(values)]


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "user", "GIT_AUTHOR_EMAIL": "user@example.com",
           "GIT_COMMITTER_NAME": "user", "GIT_COMMITTER_EMAIL": "user@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


# a test of the runtime probes allows every rule of the source scan before the build (tools/build/scan.py), which
# would stop its stateful, printing, file, clock and process forms before they build (tests/test_scan.py tests it)
def scan_allow_all() -> str:
    from tools.build.scan import allow_all
    return allow_all("the runtime probes' own test")


# the loop tests' bench: 5 ms of warm-up and 15 ms a round, 6 rounds, one input set (the defaults, 25 ms, 100 ms, 10 rounds
# and 4 input sets, measure a kernel to a few percent and cost 3-4 s a bench on 2 cores; a test of a path, not of a
# speed, needs the verdict, not the precision)
FAST_BENCH = "[bench]\nwarmup_ms = 5\nrep_ms = 15\nrounds = 6\ninput_sets = 1\n\n"


def fast_bench(task: Path) -> None:
    """A task's task.toml (a folder `agent init` or `agent import` wrote) given the loop tests' bench (FAST_BENCH), in
    place of its own [bench] or beside its other tables: for a test of a path, before the task is committed."""
    toml = task / "task.toml"
    text = toml.read_text()
    text = re.sub(r"(?m)^\[bench\][^\[]*", FAST_BENCH, text) if re.search(r"(?m)^\[bench\]", text) \
        else text.rstrip() + "\n\n" + FAST_BENCH
    toml.write_text(text)


def make_user_repo(root: Path, fast: bool = True, scan_allow: bool = False) -> Path:
    """root/ becomes a git repo with kernels/matmul_cpu committed on branch main, plus uncommitted work. `scan_allow`:
    task.toml allows every rule of the source scan (scan_allow_all)."""
    root.mkdir(parents=True, exist_ok=True)
    dst = root / "kernels" / "matmul_cpu"
    shutil.copytree(REPO / "kernels" / "matmul_cpu", dst, ignore=shutil.ignore_patterns("__pycache__"))
    if fast:
        toml = dst / "task.toml"
        text = toml.read_text()
        text = text.replace("main_shape = 2", "main_shape = 1")
        text = text.replace("seeds = 2\nhidden_shapes = 2", "seeds = 1\nhidden_shapes = 1")
        toml.write_text(text)
        fast_bench(dst)
    if scan_allow:
        toml = dst / "task.toml"
        toml.write_text(toml.read_text() + scan_allow_all())
    (root / "README.md").write_text("user project\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "user: initial")
    # uncommitted work of the user's, which no run may touch
    (root / "README.md").write_text("user project\nwork in progress\n")
    (root / "scratch.txt").write_text("untracked notes\n")
    return root


def agent(cwd: Path, *args: str, timeout: float = 600, env: dict | None = None,
          safe_path: bool = False) -> subprocess.CompletedProcess:
    # the repository first; an existing PYTHONPATH kept (where the dependencies were installed with --target)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    for k in ("AGENT_BASE_URL", "AGENT_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_API_KEY"):
        full_env.pop(k, None)
    full_env.update(env or {})
    argv = [sys.executable, *(["-P"] if safe_path else []), "-m", "agent", *args]
    if safe_path or os.environ.get("AGENT_TEST_FRESH_CLI") == "1":
        # safe_path (-P): the working directory (the user's repository) not on sys.path, as for the installed `agent`
        # script: a fresh interpreter, which a fork cannot be
        return subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    child = _warm_parent(path).spawn("tests._agent_cli_child", list(args), str(cwd), full_env, stdin=False)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    assert not child.dropped, f"agent {' '.join(args)} printed more than the capture keeps"
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def shared_by_workers(tmp_path_factory, name: str, make):
    """What `make(folder)` returns, made once for the whole test run and read by every pytest-xdist worker that asks
    (a session fixture is otherwise made once a worker: a run whose records several tests read, 25-30 s, made by both
    workers when the work stealing splits its file between them). The first worker to ask makes it under the run's
    shared temporary folder, holding a lock, and leaves it pickled there; a worker that asks later (or waits on the
    lock meanwhile) loads it. Only for what the tests then read, never write: both workers may read it at once.
    Without xdist, made here."""
    import fcntl
    import pickle
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(tmp_path_factory.mktemp(name))
    base = tmp_path_factory.getbasetemp().parent          # the run's folder, above each worker's own
    kept = base / f"shared-{name}.pickle"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                   # released when the file closes, or the worker dies
        if kept.exists():
            return pickle.loads(kept.read_bytes())
        folder = base / f"shared-{name}"
        shutil.rmtree(folder, ignore_errors=True)          # a worker that died making it left a part
        folder.mkdir()
        value = make(folder)
        part = kept.with_suffix(".part")
        part.write_bytes(pickle.dumps(value))
        os.replace(part, kept)
        return value


_WARM: dict[str, object] = {}


def _warm_parent(path: str):
    """The tests' warm parent (one per test process and PYTHONPATH): a fork server (tools/isolation/forkserver.py)
    that has imported torch and the judge's modules once, and forks each `agent` command the tests run
    (tests/_agent_cli_child.py). The command is the CLI's own main in a process of its own (its own session, working
    directory, environment and pipes, killed at its timeout), as `python -m agent`; what it saves is the interpreter's
    start and, where the command checks a candidate, its fork server's import of torch (its server is forked from
    it: tools/isolation/forkserver.py warm_here), 2.3 s of CPU on the tenth session's machine, 139 times a run.
    The parent imports two more things each command would import again (py-spy over the fast tier, the fourteenth
    session): the CLI's command modules, which its argument parser imports whatever the command (0.67 s of CPU a
    command, 23 s of the fast tier), and torch._dynamo, which torch imports at the first operator run on the meta
    device (the KernelBench probe's sizes) or traced by torch.export (its scaffold): 2.5 s of CPU an import.
    AGENT_TEST_FRESH_CLI=1 runs each command in a fresh interpreter instead; the kill tests and the README's own
    command (.ci/run) start the installed CLI as users do."""
    from agent.cli import COMMAND_MODULES
    from tools.isolation.forkserver import ForkServer
    server = _WARM.get(path)
    if server is None or not server.alive():
        server = _WARM[path] = ForkServer({"PYTHONPATH": path}, fresh=True,
                                          warm=("torch._dynamo", "agent.cli", *COMMAND_MODULES))
    return server


def snapshot(root: Path) -> tuple[str, str, str, str, str]:
    """What must not change in the user's repo: HEAD, branch, status, the README's bytes, branch list."""
    return (git(root, "rev-parse", "HEAD"), git(root, "branch", "--show-current"),
            git(root, "status", "--porcelain", "--untracked-files=all"), (root / "README.md").read_text(),
            git(root, "for-each-ref", "refs/heads/main"))


def configure_llm(root: Path, base_url: str, timeout_s: float = 2.0, max_attempts: int = 3) -> None:
    """The user's pyproject names the scripted endpoint (tests/fake_openai.py), fast retries, a short client timeout;
    committed, as a user would."""
    (root / "pyproject.toml").write_text(
        "[tool.agent]\n"
        f'base_url = "{base_url}"\nmodel = "fake-model"\n'
        f"timeout_s = {timeout_s}\nmax_attempts = {max_attempts}\nbackoff_base_s = 0.01\nbackoff_max_s = 0.05\n")
    git(root, "add", "pyproject.toml")
    git(root, "commit", "-qm", "configure the agent")
