"""tools/backends/jitcache.py: the judge's children share one CUDA JIT cache (CUDA_CACHE_PATH), the processes that
load a candidate's code never see it. Real processes: the judge child started as the loop and `agent check` start it,
its host forked from it (and started afresh, as under compute-sanitizer's wrapper); the task's own code reports what
each process holds by what it computes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.cpu_faults.faults import make_task
from tools.isolation.confine import landlock_abi
from tools.backends.jitcache import judge_env, shared_dir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                                reason="needs g++ and Linux")

# the task's reference runs in the judge, its run in the host: each is wrong where its process holds the wrong cache
PROBE = '''
import os as _os
_reference, _run = reference, run


def reference(shape, a, b):
    out = _reference(shape, a, b)
    return out if _os.environ.get("CUDA_CACHE_PATH") == _os.environ.get("JIT_EXPECTED") else out + 1.0


def run(lib, shape, out, a, b):
    _run(lib, shape, out, a, b)
    if not (_os.environ.get("CUDA_CACHE_PATH") or "").startswith(_os.environ["AGENT_SCRATCH"] + "/"):
        a.mul_(2.0)      # input_mutated: told apart from the reference's mismatch
'''


def _probe_task(tmp_path: Path):
    task, lib = make_task(tmp_path, "correct")
    with open(task.root / "task.py", "a") as f:
        f.write(PROBE)
    from tools.task import load_task
    return load_task(task.root), lib


@pytest.mark.parametrize("entry", ["run_parity", "run_candidate"])
def test_the_judge_shares_the_cache_and_its_host_keeps_its_own(tmp_path, monkeypatch, entry):
    """Shared (AGENT_JIT_CACHE a path): the judge's reference sees it, the host's run its own scratch's; both right.
    Unset (the default) shares the same way, in $AGENT_CACHE/cuda-jit. Off (AGENT_JIT_CACHE=0): the judge keeps its
    cache in its scratch directory, and the reference says so. Where the kernel has no Landlock sharing is off whatever is asked."""
    from tools.judge.candidate import prestart_candidate, run_candidate
    from tools.measure.parity import run_parity
    task, lib = _probe_task(tmp_path)
    shared = tmp_path / "jit"
    monkeypatch.setenv("JIT_EXPECTED", str(shared))

    def parity():
        if entry == "run_parity":
            return run_parity(task, lib, scratch_root=tmp_path / "scratch")
        warm = prestart_candidate(task, tmp_path / "scratch")   # the loop's child, started before its job
        return run_candidate(task, lib, None, warm=warm, scratch_root=tmp_path / "scratch").parity

    monkeypatch.setenv("AGENT_JIT_CACHE", str(shared))
    res = parity()
    if landlock_abi() == 0:
        assert res.status.value == "mismatch" and not shared.exists(), res.message
        return
    assert res.status.value == "ok", res.message
    assert shared.is_dir(), "the shared folder is made before the child starts"
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AGENT_JIT_CACHE")
    monkeypatch.setenv("JIT_EXPECTED", str((tmp_path / "cache" / "cuda-jit").resolve()))
    res = parity()
    assert res.status.value == "ok", f"the default is to share, under AGENT_CACHE: {res.message}"
    for off in ("0", "off"):
        monkeypatch.setenv("AGENT_JIT_CACHE", off)
        res = parity()
        assert res.status.value == "mismatch", f"the reference saw the shared cache with sharing off: {res.message}"


def test_a_host_never_inherits_the_judges_cache(tmp_path):
    """A host forked from a judge whose environment names the shared cache, and one started afresh under a wrapper
    (compute-sanitizer's way): each has CUDA_CACHE_PATH in its own scratch directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"from tests.test_jitcache import _hosts; _hosts({str(tmp_path)!r})"
    env = {**os.environ, "CUDA_CACHE_PATH": str(tmp_path / "shared")}
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


def _hosts(tmp: str) -> None:
    import torch  # noqa: F401  (the judge has it imported before it makes its host: the host is forked)
    from tools.judge.hostclient import HostClient
    from tools.judge.hostfork import Forked
    tmp_path = Path(tmp)
    task, _lib = make_task(tmp_path, "correct")
    for wrap in (None, ["env"]):
        root = tmp_path / f"judge-{bool(wrap)}"
        root.mkdir()
        host = HostClient(task.root, root, wrap=wrap)
        try:
            host.ready()
            got = host.info.get("jit_cache")
            assert got == str(host.scratch.dir / ".nv" / "ComputeCache"), (wrap, got)
            assert isinstance(host.proc, Forked) == (wrap is None), "forked without a wrapper, afresh with one"
        finally:
            host.close()
    print("ok")


def test_where_the_cache_is(tmp_path, monkeypatch):
    """AGENT_JIT_CACHE: 0, off; unset or 1, under AGENT_CACHE; a path, there (a relative one made absolute in the
    agent's process: a judge child's working directory is its scratch). Never where the kernel has no Landlock."""
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AGENT_JIT_CACHE", "0")
    assert shared_dir() is None and judge_env() == {}
    fenced = landlock_abi() > 0
    for on in ("1", None):
        if on is None:
            monkeypatch.delenv("AGENT_JIT_CACHE")
        else:
            monkeypatch.setenv("AGENT_JIT_CACHE", on)
        assert shared_dir() == ((tmp_path / "cache" / "cuda-jit").resolve() if fenced else None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENT_JIT_CACHE", "mine")
    mine = str((tmp_path / "mine").resolve())
    assert judge_env() == ({"CUDA_CACHE_PATH": mine} if fenced else {})
    assert (tmp_path / "mine").is_dir() == fenced
