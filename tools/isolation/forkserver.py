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

from tools.isolation.birth import become_child, close_all_but, die_with, die_with_parent, exit_with
from tools.isolation.forked import ForkedChild
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

    def __init__(self, env: dict[str, str], fresh: bool = False, warm: tuple[str, ...] = ()) -> None:
        """`fresh`: a new interpreter even where this process is warm (a parent whose state its children must not
        inherit: the tests' own process). `warm`: modules the server imports beside WARM, started afresh or forked
        from here, for children that would each import them (the tests' warm parent: the CLI's command modules,
        torch's compiler front end)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = env
        if not fresh and warm_here():
            self.proc = _fork_server(theirs.fileno(), env, warm)
        else:
            # -P: the agent's working directory (the user's repository) is not put on the server's path, where a
            # package of the user's named like one of ours (a tools/ folder) would be imported in its place
            # the death signal comes when the *thread* that started the server ends: off the main thread (a sweep's pool)
            # the server watches for the agent's end itself (serve), or a judge it forked died "with SIGKILL"
            main = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen([sys.executable, "-P", "-m", "tools.isolation.forkserver",
                                          str(theirs.fileno()), *warm], env={**os.environ, **self.env},
                                         stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                         preexec_fn=die_with_parent if main else None, start_new_session=True)
        theirs.close()
        self.sock, self.exits, self.lock, self.next_id = ours, {}, threading.Lock(), 0
        self.lost: dict[int, str] = {}      # children whose end the server died before reporting: why their code is made up

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
                    if not self.alive():     # the server died: its children died with it
                        self.lost[pid] = (f"the fork server (pid {self.proc.pid}) ended ({self.proc.poll()}) before "
                                          f"it reported how its child {pid} ended: the agent's, not the child's")
                        return -signal.SIGKILL
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
            return self.exits.pop(pid)


def warm_here() -> bool:
    """Whether this process can be the server's image: it has imported what the server imports (a process that
    embeds the agent, or an agent forked from a warm parent) and runs no thread but the main one (a fork copies only
    the caller: a lock another thread held stays held in the copy) and the one importing torch starts, idle on a
    futex from then on, which a fresh server has too and forks every judge beside. Not a process that has made its
    CUDA context (the agent asks torch for the device's limits, tools/backends/device.py): torch refuses CUDA in every
    copy of it ("Cannot re-initialize CUDA in forked subprocess", every judge of a CUDA task on an H200)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return False
        return (threading.active_count() == 1 and all(name in sys.modules for name in WARM)
                and len(os.listdir("/proc/self/task")) <= 2)
    except (OSError, AttributeError):
        return False


class _ServerProc:
    """What ForkServer uses of Popen (pid, poll), over a server forked from this process."""
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_server(fd: int, env: dict[str, str], warm: tuple[str, ...] = ()) -> _ServerProc:
    """The server forked from this warm process (warm_here), not started afresh to import torch again (0.9-2.3 s of
    CPU, once per agent command that checks a candidate: 315 s of a suite run, the tenth session); set up as the
    fresh one: its own session, death with us, stdin from /dev/null, only its end of the socket, a fresh
    interpreter's signals, our environment with `env` over it, no working directory on its path (-P's)."""
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):     # nothing of ours left in a buffer the copy could write out
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    # a signal to the agent's group (Ctrl-C) between the fork and the copy's setsid would run the agent's handlers
    # in the copy: held across the fork, and in the copy dropped before its handlers are reset
    ours = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGALRM)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, ours)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return _ServerProc(pid)
    code = 1
    try:
        os.setsid()
        die_with(parent)
        for sig in ours:
            signal.signal(sig, signal.SIG_IGN)           # what is pending is dropped when unblocked
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for sig in (*ours, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        close_all_but({0, 1, 2, fd})
        os.environ.update(env)
        cwd = os.getcwd()
        sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
        code = serve(fd, warm)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


# --- the server ---------------------------------------------------------------------------------
def serve(fd: int, warm: tuple[str, ...] = ()) -> int:
    import importlib
    import gc
    # no collection while the imports run: they make some 180,000 objects that live as long as the server, and
    # the collector's passes over them are a fifth of the imports' CPU (1.10 -> 0.89 s: scripts/judge_costs.py), paid by
    # every agent command that checks a candidate. Python's gc docs give this order for a parent that forks:
    # disable early, freeze before the forks, enable again
    gc.disable()      # (in a server forked from a warm agent, _fork_server: every import below is already made)
    try:
        for name in (*WARM, *warm):
            importlib.import_module(name)
    finally:
        # what is here now lives as long as the server: out of every collection, so that a child's
        # collections do not write to (and copy) the pages it shares with the server (Python's gc docs)
        gc.freeze()
        gc.enable()
    sock = socket.socket(fileno=fd)
    me, parent = os.getpid(), os.getppid()
    mine: set[int] = set()
    subreaper()
    while True:
        if os.getppid() != parent:
            return 0     # the agent is gone (a server started off its main thread has no death signal: ForkServer)
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
    sys.exit(serve(int(sys.argv[1]), tuple(sys.argv[2:])))
