"""Run generated code where it cannot take the agent down.

Every stage that runs generated code (build, parity, bench, profile) goes through `run_isolated`:
a child in its own session, a wall-clock timeout, and a typed outcome. When the child ends, for
any reason, `kill_tree` stops and kills everything in its session and every descendant found
through parent links (a compiler that ninja put in a process group of its own included), so no
helper of a hung kernel or a timed-out build outlives it. A CUDA fault poisons the context of
the process it happens in; here that process is always a throwaway child.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from enum import Enum
from pathlib import Path

from pydantic import BaseModel

from tools.isolation.capture import STAGE_MARK, CappedPopen  # noqa: F401 (STAGE_MARK: re-exported)
from tools.isolation.proctree import KILL_WAIT_S, kill_tree
from tools.isolation.scratch import Scratch

REPO_ROOT = Path(__file__).resolve().parents[2]   # tools/isolation/sandbox.py -> the repository


class ProcStatus(str, Enum):
    ok = "ok"                # exit code 0
    failed = "failed"        # non-zero exit code
    crashed = "crashed"      # killed by a signal it did not ask for (SIGSEGV, SIGABRT, ...)
    timeout = "timeout"      # ran past its limit; the process group was killed
    not_started = "not_started"  # the executable is missing


class ProcResult(BaseModel):
    status: ProcStatus
    returncode: int | None = None
    signal: str | None = None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    argv: list[str]
    # bytes of stdout and stderr left out between what was kept of each (tools/isolation/capture.py)
    dropped_bytes: int = 0

    def tail(self, n: int = 20) -> str:
        lines = (self.stderr or self.stdout).strip().splitlines()
        return "\n".join(lines[-n:])

    def reason(self) -> str:
        """One line for the reader who must act on it."""
        said = self._reason()
        return said + (f" ({self.dropped_bytes} bytes of its output dropped)" if self.dropped_bytes else "")

    def _reason(self) -> str:
        if self.status == ProcStatus.timeout:
            return f"timed out after {self.seconds:.1f}s (process group killed)"
        if self.status == ProcStatus.crashed:
            return f"crashed with {self.signal}: {self.tail(3)}"
        if self.status == ProcStatus.not_started:
            return f"could not start {self.argv[0]}: {self.stderr.strip()}"
        if self.status == ProcStatus.failed:
            return f"exit code {self.returncode}: {self.tail(5)}"
        return "ok"


def _child_setup(parent: int | None = None) -> None:
    """In the child, before exec: its own session (process group), and death with the parent.

    If the agent itself is killed (SIGKILL cannot be caught, so no timeout can fire), the kernel
    sends the child SIGKILL: a hung candidate never outlives the agent.
    """
    os.setsid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass
    # the agent may have died between fork and prctl, when no death signal can come any more; such a
    # child must not run on alone
    if parent is not None and os.getppid() != parent:
        os._exit(137)
    # SIGINT was blocked by the parent around the fork (see run_isolated); the child, now in its own
    # session, takes it normally again (a Ctrl-C that came in the window is the parent's, not ours)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_isolated(argv: list[str], timeout_s: float, cwd: Path | str | None = None,
                 env: dict[str, str] | None = None, stdin: str | None = None) -> ProcResult:
    """Run argv in a new session; when it ends (or times out) kill its tree. Never raises for the child."""
    t0 = time.monotonic()
    proc = _spawn(argv, cwd, env, pipe_stdin=bool(stdin))
    if isinstance(proc, ProcResult):
        return proc
    return _finish(proc, argv, t0, timeout_s, stdin)


class Prestarted:
    """A child started early, so that its start-up (importing torch, a CUDA context) overlaps other
    work, and given its job on stdin later: `run(job, timeout_s)` has run_isolated's guarantees
    (own session, death with the agent, the group killed on timeout, a typed outcome). A child never
    given a job is ended by close(), or sees end-of-file on stdin when the agent dies."""

    def __init__(self, argv: list[str], cwd: Path | str | None = None, env: dict[str, str] | None = None,
                 scratch: Scratch | None = None):
        self.argv, self.scratch = argv, scratch
        self._proc = _spawn(argv, cwd, env, pipe_stdin=True)
        self.used = False

    @property
    def alive(self) -> bool:
        return not isinstance(self._proc, ProcResult) and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The child's exit status once it has ended (negative: ended by a signal, as close() ends one never given its
        job); None while it runs."""
        return self._proc.returncode

    def tell(self, line: str) -> bool:
        """One line on the child's stdin before its job (a step it takes while it waits); False where it has ended."""
        if self.used or not self.alive or self._proc.stdin is None:
            return False
        import io
        line = line if line.endswith("\n") else line + "\n"
        try:     # a pipe of bytes (Popen), or of text (a fork server's child, tools/isolation/forked.py)
            self._proc.stdin.write(line if isinstance(self._proc.stdin, io.TextIOBase) else line.encode())
            self._proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def run(self, job: str, timeout_s: float, clock=None) -> ProcResult:
        """Hand the child its job (one line on stdin) and wait for it, at most timeout_s from now (and, with a
        `clock`, tools.judge.budgets.StageClock, at most its stage's budget). ProcResult.seconds counts from now,
        not from the start."""
        if self.used:
            raise RuntimeError("a pre-started child runs one job")
        self.used = True
        if isinstance(self._proc, ProcResult):
            self.close()
            return self._proc
        try:
            return _finish(self._proc, self.argv, time.monotonic(), timeout_s, job if job.endswith("\n") else job + "\n",
                           clock)
        finally:
            self.close()

    def close(self) -> None:
        """End the child if it never got its job (or is still running); idempotent."""
        if not isinstance(self._proc, ProcResult) and self._proc.poll() is None:
            kill_tree(self._proc.pid)
            try:
                self._proc.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError, OSError):
                pass
        self.used = True
        if self.scratch is not None:
            self.scratch.close()

    def __enter__(self) -> Prestarted:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# children started from the agent's fork server (tools/isolation/forkserver.py), not afresh: `python -m` of these.
# Each imports torch and the task's modules, 1.1-1.2 s of CPU a start on 2 cores that a fork does not pay: the judge,
# the launch check's plan and trace, a sweep's batch judge, the signature reader behind `agent init` and the
# KernelBench probe (the `import torch` of these starts was a quarter of the fast tier's CPU, py-spy, 2026-11-29).
# Not the KernelBench export's check (tools.kernelbench.evalkb): its claim is a fresh process, as KernelBench's own.
FORKED = ("tools.judge.judge", "tools.judge._plan_child", "tools.judge._batch_child", "tools.signature",
          "tools.kernelbench.probe")


def _spawn(argv: list[str], cwd: Path | str | None, env: dict[str, str] | None,
           pipe_stdin: bool) -> subprocess.Popen | ProcResult:
    """Popen in a new session that dies with the agent; a ProcResult (not_started) if argv[0] is missing.
    A judge (`python -m tools.judge.judge`, with this repository's Python path) is forked from the agent's
    fork server instead, with the same guarantees, where the server can be had."""
    full_env = {**os.environ, **(env or {})}
    if len(argv) > 2 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in FORKED:
        from tools.isolation.forkserver import forkserver
        server = forkserver(python_env())
        if server is not None and full_env.get("PYTHONPATH") == server.env["PYTHONPATH"]:
            try:
                return server.spawn(argv[2], argv[3:], str(cwd or os.getcwd()), full_env, pipe_stdin)
            except OSError:
                pass        # the server is gone: this child starts afresh
    # a Ctrl-C to the agent's process group that lands between fork and setsid would reach the child,
    # not the agent, and be lost (the run would go on). So SIGINT is held around the fork and delivered
    # to the agent right after it.
    held = _hold_sigint()
    try:
        proc = CappedPopen(argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE if pipe_stdin else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=functools.partial(_child_setup, os.getpid()))
    except BaseException as e:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if isinstance(e, (FileNotFoundError, PermissionError)):
            return ProcResult(status=ProcStatus.not_started, seconds=0.0, stderr=str(e), argv=argv)
        raise
    try:
        if held:   # a held Ctrl-C is raised here (pthread_sigmask runs the handler), and the child goes
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except KeyboardInterrupt:
        kill_tree(proc.pid)
        proc.communicate()
        raise
    return proc


def _finish(proc: subprocess.Popen, argv: list[str], t0: float, timeout_s: float, stdin: str | None,
            clock=None) -> ProcResult:
    """Wait for a spawned child (feeding it `stdin`), killing its group on timeout (or its stage's budget, by
    `clock`) or Ctrl-C."""
    try:
        out, err = proc.communicate(input=stdin, timeout=timeout_s, clock=clock)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = _drain(proc)
        return ProcResult(status=ProcStatus.timeout, seconds=time.monotonic() - t0, stdout=out or "",
                          stderr=err or "", argv=argv, dropped_bytes=getattr(proc, "dropped", 0))
    except KeyboardInterrupt:
        kill_tree(proc.pid)
        raise
    # a finished leader may leave children behind (e.g. a build's compiler): end them too
    kill_tree(proc.pid)
    if (lost := getattr(proc, "lost", None)):     # a fork server that died first: its code is made up, and says so
        err = f"{err or ''}\n[agent] {lost}".lstrip("\n")
    dt = time.monotonic() - t0
    rc = proc.returncode
    if rc == 0:
        status, sig = ProcStatus.ok, None
    elif rc < 0:
        status, sig = ProcStatus.crashed, signal.Signals(-rc).name
    else:
        status, sig = ProcStatus.failed, None
    return ProcResult(status=status, returncode=rc, signal=sig, seconds=dt, stdout=out, stderr=err, argv=argv,
                      dropped_bytes=getattr(proc, "dropped", 0))


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """The output of a killed child, waiting at most KILL_WAIT_S: a descendant that escaped the kill
    (it left the session and its parent was already gone) may hold the pipes open for ever."""
    try:
        return proc.communicate(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired as e:
        if hasattr(proc, "close_pipes"):     # a fork server's child (tools/isolation/forkserver.py)
            proc.close_pipes()
        for f in (getattr(proc, "stdout", None), getattr(proc, "stderr", None)):
            if f is not None and not isinstance(f, int):
                f.close()
        proc.wait(timeout=KILL_WAIT_S)
        dec = (lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or ""))
        return dec(e.output), dec(e.stderr)


def _hold_sigint() -> bool:
    """Block SIGINT; True if this call blocked it (False: already blocked by the caller, or unsupported)."""
    try:
        return signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, ValueError, OSError):
        return False


def run_python_json(module: str, args: list[str], timeout_s: float, scratch_root: Path | str | None = None,
                    env: dict[str, str] | None = None) -> tuple[ProcResult, dict | None]:
    """Run `python -m module args...` isolated, in a scratch directory of its own under scratch_root
    (tools/isolation/scratch.py); parse the last stdout line that is a JSON object.

    The child prints its result as one JSON line last; anything a kernel printed before is kept
    in stdout but ignored. Returns (process outcome, parsed JSON or None).
    """
    with Scratch(scratch_root, _label(module, args)) as s:
        res = run_isolated([sys.executable, "-m", module, *args], timeout_s, cwd=s.dir, env=python_env(env, s))
    return res, child_json(res.stdout)


def _label(module: str, args: list[str]) -> str:
    return module.rsplit(".", 1)[-1].lstrip("_") + (f"-{args[0]}" if args and not args[0].startswith("-") else "")


def python_env(env: dict[str, str] | None = None, scratch: Scratch | None = None) -> dict[str, str]:
    """The environment of a `python -m` child: this repository importable, output unbuffered, HOME
    and TMPDIR in its scratch directory."""
    return {**(scratch.env() if scratch else {}),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1", **(env or {})}


def prestart_python(module: str, args: list[str], scratch_root: Path | str | None = None,
                    env: dict[str, str] | None = None) -> Prestarted:
    """`python -m module args...` started now, isolated, in a scratch directory of its own, to be given
    its job later (Prestarted.run)."""
    s = Scratch(scratch_root, _label(module, args))
    return Prestarted([sys.executable, "-m", module, *args], cwd=s.dir, env=python_env(env, s), scratch=s)


def child_json(stdout: str) -> dict | None:
    """last_json, less `scratch_files`: what the child listed of a scratch directory it made and closed
    itself (the judge, its host's), which goes into this process's scratch log for the record."""
    data = last_json(stdout)
    if data is not None and isinstance(data.get("scratch_files"), list):
        from tools.results import ScratchFile
        from tools.isolation.scratch import record
        try:
            record([ScratchFile.model_validate(f) for f in data.pop("scratch_files")])
        except ValueError:
            pass
    return data


def last_json(stdout: str) -> dict | None:
    """The last stdout line that is a JSON object (the child's result), or None."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return None
