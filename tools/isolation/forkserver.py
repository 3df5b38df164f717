"""A warm parent for the judge: one process per agent that has imported torch and the judge's modules
once, and forks each judge child from itself, so that a check does not start Python and import torch
afresh (1.3-1.6 s of CPU a check on a 2-core machine; the suite starts some 200 judges). The other
children that import torch are forked from it too (tools/isolation/sandbox.py FORKED: the launch check's,
a sweep's batch judge, the signature reader, the KernelBench probe).

    server = forkserver(python_env())            # started on first use, ended with this process
    child = server.spawn("tools.judge.judge", args, cwd=..., env=..., stdin=True)   # a Popen-like child

The child keeps run_isolated's guarantees (tools/isolation/sandbox.py): a session of its own, death with its
parent (the server, which dies with the agent), every descriptor closed but the three pipes given to
it, its own working directory and environment, and the agent's typed outcome: its exit status comes
back from the server, which reaps it. It is not the agent's child, so only the server can wait for it;
kill_tree reaches it as before (by its session and its descendants, from /proc). The server never
initialises CUDA (a forked CUDA context is unusable), and the child's environment (CUDA_VISIBLE_DEVICES
among it) is its own from the moment it starts. /proc/PID/cmdline of a child is the server's: its
working directory (its scratch directory) says whose it is.

Protocol: a SOCK_SEQPACKET socket pair (message boundaries kept). A request is one JSON message with
the child's three pipe ends attached (SCM_RIGHTS); the server answers {"id", "pid"} at once and
{"exit": pid, "code": N} when the child ends (N < 0: killed by signal -N, as subprocess reports it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from tools.isolation.capture import Capture, pump
from tools.isolation.proctree import end_adopted, subreaper

_SERVER: ForkServer | None = None
_LOCK = threading.Lock()
# imported once in the server: what every judge imports (not tools.judge.judge itself: runpy runs it afresh)
WARM = ("torch", "tools.judge.hostclient", "tools.measure.bench", "tools.measure.parity", "tools.measure.launch",
        "tools.measure.probes", "tools.task")


def forkserver(env: dict[str, str]) -> ForkServer | None:
    """This process's fork server (started on first use with `env` over this process's environment);
    None where forking cannot be had (not Linux)."""
    global _SERVER
    if not sys.platform.startswith("linux"):
        return None
    with _LOCK:
        if _SERVER is None or not _SERVER.alive():
            _SERVER = ForkServer(env)
        return _SERVER


class ForkServer:
    """The agent's side of the server: spawn children, learn how they ended."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = env
        # -P: the agent's working directory (the user's repository) is not put on the server's path, where a
        # package of the user's named like one of ours (a tools/ folder) would be imported in its place
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "tools.isolation.forkserver", str(theirs.fileno())],
                                     env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                                     pass_fds=[theirs.fileno()], preexec_fn=die_with_parent, start_new_session=True)
        theirs.close()
        self.sock, self.exits, self.lock, self.next_id = ours, {}, threading.Lock(), 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, module: str, args: list[str], cwd: str, env: dict[str, str], stdin: bool) -> ForkedChild:
        """Fork `python -m module args...` with exactly `env` as its environment."""
        fds = [os.pipe() for _ in range(3)]
        if not stdin:
            os.close(fds[0][1])
            fds[0] = (os.open(os.devnull, os.O_RDONLY), None)
        with self.lock:
            self.next_id += 1
            req = {"id": self.next_id, "module": module, "args": args, "cwd": str(cwd), "env": env}
            try:
                socket.send_fds(self.sock, [json.dumps(req).encode()], [fds[0][0], fds[1][1], fds[2][1]])
            finally:
                for fd in (fds[0][0], fds[1][1], fds[2][1]):
                    os.close(fd)
            pid = None
            while pid is None:
                msg = self._recv(None)
                if msg is None:
                    raise OSError("the fork server is gone")
                if msg.get("id") == req["id"]:
                    pid = msg["pid"]
        return ForkedChild(self, pid, [module, *args], fds[0][1], fds[1][0], fds[2][0])

    def _recv(self, timeout: float | None) -> dict | None:
        """One message (exit notices are filed as they come); None on timeout or a server gone."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        data = self.sock.recv(1 << 16)
        if not data:
            return None
        msg = json.loads(data)
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
        return msg

    def returncode(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code once the server has reaped it, waiting at most timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while pid not in self.exits:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self._recv(left) is None:     # nothing came in time (a timeout of 0: a poll)
                    if not self.alive():
                        return -signal.SIGKILL   # the server died: its children died with it
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
            return self.exits.pop(pid)


class ForkedChild:
    """What tools.isolation.sandbox uses of subprocess.Popen, over a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], stdin_w, stdout_r: int, stderr_r: int):
        self.server, self.pid, self.args = server, pid, args
        self.stdin = os.fdopen(stdin_w, "w") if stdin_w is not None else None
        self._fds = {stdout_r: Capture(), stderr_r: Capture()}
        self._out, self._err = stdout_r, stderr_r
        self._open = {stdout_r, stderr_r}
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def communicate(self, input: str | None = None, timeout: float | None = None, clock=None) -> tuple[str, str]:
        """Write input, read both pipes to their end and wait for the exit, within timeout; on
        TimeoutExpired what was read so far is kept, and a second call goes on from there."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            self.stdin = None
        pump(self._fds, self._open, deadline, lambda: self.poll() is not None, os.close,
             lambda: subprocess.TimeoutExpired(self.args, timeout, output=self._text(self._out),
                                               stderr=self._text(self._err)), clock, self._err)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._text(self._out), self._text(self._err)

    def close_pipes(self) -> None:
        for fd in list(self._open):
            os.close(fd)
        self._open.clear()

    def _text(self, fd: int) -> str:
        return self._fds[fd].text()

    @property
    def dropped(self) -> int:
        return sum(c.dropped for c in self._fds.values())

    def __del__(self) -> None:
        try:
            self.close_pipes()
        except OSError:
            pass


def die_with_parent() -> None:
    """SIGKILL for this process when its parent dies (PR_SET_PDEATHSIG)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def become_child(parent: int, fds: list[int], cwd: str, env: dict[str, str], *, replace_env: bool) -> None:
    """In a process just forked from `parent`, before any of its own code: death with the parent (and
    exit if it is already gone), SIGINT as by default, `fds` as its stdin, stdout (and stderr), every
    other descriptor closed (nothing of the parent's: its answer channel, its sockets), `cwd`, `env`
    (over the parent's, or instead of it), and sys's streams rebuilt over the new descriptors."""
    die_with_parent()
    if os.getppid() != parent:       # the parent died before the death signal was set
        os._exit(137)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in {int(f) for f in os.listdir("/proc/self/fd")} - {0, 1, 2}:
        try:
            os.close(fd)
        except OSError:
            pass
    os.chdir(cwd)
    if replace_env:
        os.environ.clear()
    os.environ.update(env)
    import tempfile
    tempfile.tempdir = None
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.environ.get("PYTHONUNBUFFERED") else -1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)


def exit_with(body) -> None:
    """Run body() in a forked child and leave the process with its code: never returns into the code
    the child was forked from (SystemExit's code, 1 for any other exception, with its traceback)."""
    rc = 1
    try:
        rc = body()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 0)


# --- the server ---------------------------------------------------------------------------------
def serve(fd: int) -> int:
    import importlib
    import gc
    # no collection while the imports run: they make some 180,000 objects that live as long as the server, and
    # the collector's passes over them are a fifth of the imports' CPU (1.10 -> 0.89 s: scripts/judge_costs.py), paid by
    # every agent command that checks a candidate. Python's gc docs give this order for a parent that forks:
    # disable early, freeze before the forks, enable again
    gc.disable()
    try:
        for name in WARM:
            importlib.import_module(name)
    finally:
        # what is here now lives as long as the server: out of every collection, so that a child's
        # collections do not write to (and copy) the pages it shares with the server (Python's gc docs)
        gc.freeze()
        gc.enable()
    sock = socket.socket(fileno=fd)
    me = os.getpid()
    mine: set[int] = set()
    subreaper()
    while True:
        ended = False
        while True:   # reap and report every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            if pid in mine:
                mine.discard(pid)
                ended = True
                _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if ended:
            end_adopted(me, mine)
        ready, _, _ = select.select([sock], [], [], 0.02)
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            return 0     # the agent is gone
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            _child(req, fds, me)      # never returns
        mine.add(pid)
        for f in fds:
            os.close(f)
        _send(sock, {"id": req["id"], "pid": pid})


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        os._exit(0)      # the agent is gone: so are we, and our children with us (their death signal)


def _child(req: dict, fds: list[int], server: int) -> None:
    def body() -> int:
        import runpy
        os.setsid()
        become_child(server, fds, req["cwd"], req["env"], replace_env=True)
        sys.argv = [req["module"], *req["args"]]
        sys.path.insert(0, os.getcwd())     # as `python -m` puts its working directory (the child's scratch) first
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        return 0
    exit_with(body)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
