"""The judge's side of its host (tools/judge/host.py): start it, ask it, move the judge's tensors to it and
back (Remote); its bench bursts are timed from outside in tools/judge/hostruns.py. Imported by the judge
only; nothing here loads candidate code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import weakref
from pathlib import Path

from tools.isolation.birth import die_with_parent
from tools.judge import devshare
from tools.judge.host import digest
from tools.judge import iofiles
from tools.judge.iofiles import load_into, memory_dir, path_of, save
from tools.judge.hostfork import fork_host
from tools.isolation.scratch import Scratch
from tools.measure.views import misalignment

MAX_ANSWER = 16 << 20


class HostFailed(Exception):
    """The host died or broke the protocol: the candidate fails the stage, with `status`."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status      # a ParityStatus value: crashed | error


class HostClient:
    """One host process, started now in a scratch directory under `root` (the judge's own)."""

    def __init__(self, task_root: Path, root: Path, wrap: list[str] | None = None, env: dict[str, str] | None = None):
        """`wrap`: a command the host runs under (compute-sanitizer, tools/judge/sanitize.py), with `env` added to
        its environment; the host is then started afresh, not forked."""
        self.scratch = Scratch(root, "host")
        self.wrapped = bool(wrap)
        self.io = self.scratch.dir / "io"
        self.io.mkdir()
        self.memory = memory_dir()      # the buffer files in memory where it can (tools/judge/iofiles.py)
        self.dirs = [str(d) for d in (self.memory, self.io) if d is not None]
        env = {**self.scratch.env(), "PYTHONUNBUFFERED": "1", **({"AGENT_IO": str(self.memory)} if self.memory else {}),
               **(env or {})}
        self.proc = (None if wrap else fork_host(self.scratch.dir, env)) or subprocess.Popen(
            [*(wrap or []), sys.executable, "-m", "tools.judge.host"], cwd=self.scratch.dir, env={**os.environ, **env},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        self.bound = iofiles.MEMORY_MAX_BYTES       # the largest buffer in memory, for both sides (read at each start)
        self._send({"op": "init", "task": str(task_root), "io": self.dirs, "io_bound": self.bound})
        self.started = False
        self.info: dict = {}      # the host's answer to init: its pid, its CPU threads
        self.state_left: list[str] = []     # the state the libraries' loads and calls left changed, a line each

    def _send(self, req: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._dead() from None

    def _dead(self) -> HostFailed:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is not None and rc < 0:
            from tools.isolation.limits import fired
            limit = fired(-rc, self.info.get("limits") or {})
            if limit is not None:
                return HostFailed("crashed", f"the kernel's host process was stopped by {limit} "
                                             f"({signal.Signals(-rc).name})")
            return HostFailed("crashed", f"the kernel's host process crashed with {signal.Signals(-rc).name}")
        return HostFailed("crashed", f"the kernel's host process exited (code {rc}) in the middle of a call")

    def _answer(self) -> dict:
        line = self.proc.stdout.readline(MAX_ANSWER)
        while self.wrapped and line.startswith(b"========="):   # the wrapper's own lines (compute-sanitizer)
            line = self.proc.stdout.readline(MAX_ANSWER)
        if not line:
            raise self._dead()
        try:
            ans = json.loads(line)
        except ValueError:
            ans = None
        if not isinstance(ans, dict):
            raise HostFailed("error", f"the kernel's host answered something that is not the protocol: {line[:120]!r}")
        return ans

    def ask(self, req: dict) -> dict:
        """One request; its answer, or HostFailed. An answer with ok false is the task's (or kernel's)
        exception: raised as RuntimeError with the host's message."""
        self.ready()
        self._send(req)
        ans = self._answer()
        if isinstance(ans.get("fp_state"), str):     # tools/judge/fpstate.py: the host has put it back
            self.state_left.append("the kernel left the thread's floating-point state changed: "
                                   f"{ans['fp_state'][:300]}: every float operation its caller does next sees it (a "
                                   "kernel may set flush-to-zero or a rounding mode for its own loop only if it puts "
                                   "the state back before it returns)")
        if isinstance(ans.get("device_state"), str):     # tools/judge/devstate.py: likewise
            self.state_left.append("the kernel left the GPU's device-wide settings changed: "
                                   f"{ans['device_state'][:300]}: every other kernel of its caller's process runs "
                                   "under them (set a kernel's own attributes, or put the device's back before "
                                   "returning)")
        if ans.get("ok") is not True:
            raise RuntimeError(str(ans.get("error") or ans)[:500])
        return ans

    def written(self) -> list[tuple[str, int]]:
        """(path relative to the host's directory, bytes) of every file its processes wrote there so far, and in
        its memory folder (as `io-memory/...`), less the judge's own buffer files."""
        import re
        out = []
        for top, label in ((self.scratch.dir, ""), (self.memory, "io-memory/")):
            for dirpath, _dirs, names in os.walk(top) if top is not None else ():
                for name in names:
                    p = Path(dirpath) / name
                    if p.parent in (self.io, self.memory) and re.fullmatch(r"[io][0-9a-f]+-[0-9]+\.bin", name):
                        continue
                    try:
                        out.append((label + p.relative_to(top).as_posix(), p.lstat().st_size))
                    except OSError:
                        continue
        return sorted(out)

    def ready(self) -> None:
        """Wait for the host's start-up (its answer to init: the task and torch loaded, a CUDA task's context made);
        HostFailed where it could not load the task."""
        if not self.started:
            self.started = True
            init = self.info = self._answer()
            if init.get("ok") is not True:
                raise HostFailed("error", f"the host could not load the task: {init.get('error')}")

    def finish(self, timeout: float) -> int | None:
        """Let the host end on its own (its requests closed) within `timeout` seconds, so that a wrapper
        reports; its exit code, or None where it had to be killed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            self.proc.wait()
            return None

    def kill(self) -> None:
        """End the host now, from any thread (close() still reaps it and cleans up)."""
        if self.proc.poll() is None:
            self._kill()

    def _kill(self) -> None:
        if self.wrapped:
            from tools.isolation.proctree import kill_tree
            kill_tree(self.proc.pid)    # the host under the wrapper (compute-sanitizer), then the wrapper
        self.proc.kill()

    def close(self) -> list:
        """End the host; remove the judge's buffer files (what is left in the scratch directory is the
        kernel's: listed, answered to the agent for the record, removed)."""
        if self.proc.poll() is None:
            self._kill()
        self.proc.wait()
        shutil.rmtree(self.io, ignore_errors=True)
        if self.memory is not None:
            shutil.rmtree(self.memory, ignore_errors=True)
        return self.scratch.close()


class Remote:
    """The judge's tensors, run in the host: each goes out as a file under the key of its memory here
    (the same memory, the same key, the same memory there), only when it changed since the host last
    had it (torch's version counter says so); outputs are poisoned there, not sent, and come back after
    the calls, with any input a call changed."""

    def __init__(self, host: HostClient):
        self.host = host
        # key -> (a weak reference to the tensor the host holds a copy of, its version then): a tensor
        # freed and another made at the same address is a different object, and goes out again
        self.synced: dict[str, tuple] = {}
        self.threads_left: list[str] = []   # threads a call started and left running (names, the first seen)
        # buffers back through CUDA IPC where the host can share them (not under compute-sanitizer's wrapper)
        self.ipc = devshare.enabled() and not host.wrapped
        self.mapped = devshare.Mapped()
        self.moved = {"ipc": 0, "file": 0, "ipc_out": 0}  # bytes back from the host by channel; sent by IPC
        self.late: list[int] = []           # the latest two-thread call's calls whose work outlived their stream

    def _key(self, t, kind: str) -> str:
        if not t.is_contiguous():
            raise ValueError("the task's buffers must be contiguous to go to the kernel's host")
        return f"{kind}{t.data_ptr():x}-{t.numel() * t.element_size()}"

    def _file(self, key: str) -> str:
        return path_of(self.host.dirs, key, self.host.bound)

    def _out(self, out) -> tuple:
        flat = out._base if out._base is not None and out._base.is_contiguous() else out
        return flat, {"key": self._key(flat, "o"), "offset": out.storage_offset() - flat.storage_offset(),
                      "numel": out.numel(), "shape": list(out.shape), "flat_numel": flat.numel(),
                      "dtype": str(flat.dtype).removeprefix("torch.")}

    def put(self, tensors) -> list[dict]:
        """Send the tensors the host does not hold as they are here: GPU tensors into buffers the host makes and
        shares (CUDA IPC), the others as files; the files' descriptions for `put`."""
        todo = {}
        for t, kind in tensors:
            key = self._key(t, kind)
            if key not in todo and not self._held(key, t):
                todo[key] = t
        # a view off the allocator's alignment (parity's misaligned checks, tools/measure/views.py) is made at the
        # same offset past a 64-byte boundary there: the pointer the kernel gets is as misaligned as the judge's
        gpu = [{"key": k, "dtype": str(t.dtype).removeprefix("torch."), "numel": t.numel(), "misalign": misalignment(t)}
               for k, t in todo.items() if self.ipc and getattr(t, "is_cuda", False)]
        shared = self.host.ask({"op": "share", "bufs": gpu}).get("shared") if gpu else {}
        descs = []
        for key, t in todo.items():
            if isinstance(shared, dict) and key in shared:
                self._mapped(self.mapped.copy_from, t, shared[key])
            else:
                save(t, self._file(key))
                descs.append({"key": key, "dtype": str(t.dtype).removeprefix("torch."), "misalign": misalignment(t)})
            self.synced[key] = (weakref.ref(t), t._version)
        if len(descs) < len(todo):
            __import__("torch").cuda.synchronize()   # the bytes are in the host's buffers before it is asked to run
        return descs

    def _mapped(self, copy, t, share) -> None:
        try:
            copy(t, share)
        except ValueError as e:
            raise HostFailed("error", f"the kernel's host: {e}") from None
        self.moved["ipc" if copy == self.mapped.copy_into else "ipc_out"] += t.numel() * t.element_size()

    def _held(self, key: str, t) -> bool:
        ref, version = self.synced.get(key, (None, None))
        return ref is not None and ref() is t and version == t._version

    def bring(self, ans: dict, tensors: dict) -> None:
        """After the host's answer `ans` to a call that named `get` buffers (asked with "ipc": self.ipc), each of
        `tensors` (key -> the judge's tensor) back here: the ones the host shared through CUDA IPC copied device to
        device and waited for before the host is asked anything else, the others from their files."""
        shared = ans.get("shared") if isinstance(ans.get("shared"), dict) else {}
        for key, t in tensors.items():
            if key in shared:
                self._mapped(self.mapped.copy_into, t, shared[key])
            else:
                load_into(t, self._file(key))
                self.moved["file"] += t.numel() * t.element_size()
            self.synced[key] = (weakref.ref(t), t._version)
        if shared:
            __import__("torch").cuda.synchronize()

    def mirror(self, shape: dict, sets: list[tuple], seeds: list[int], dist: str) -> None:
        """Each set holds make_inputs' values for its seed here: the host makes the same from the same seeds in
        its buffers (no bytes travel), and its digests must be this process's; where one differs (a task whose
        make_inputs is not deterministic), this process's tensors go to it as files."""
        keys = [[{"key": self._key(t, "i"), "shape": list(t.shape)} for t in s] for s in sets]
        ans = self.host.ask({"op": "refill", "shape": shape, "sets": keys, "seeds": seeds, "dist": dist})
        got = ans.get("digests")
        for s, ds in zip(sets, got if isinstance(got, list) else [None] * len(sets)):
            for j, t in enumerate(s):
                key = self._key(t, "i")
                if isinstance(ds, list) and j < len(ds) and ds[j] == digest(t):
                    self.synced[key] = (weakref.ref(t), t._version)
                else:
                    self.synced.pop(key, None)
        put = self.put([(t, "i") for s in sets for t in s])
        if put:
            self.host.ask({"op": "call", "shape": shape, "put": put, "calls": [], "get": []})

    def drop(self, tensors: list) -> None:
        """The host forgets these tensors (inputs or outputs) and gives their memory back."""
        keys = [self._key(self._out(t)[0], k) if k == "o" else self._key(t, k) for t, k in tensors]
        for key in keys:
            self.synced.pop(key, None)
        self.mapped.close()   # the host's memory goes back only when no mapping holds it (the wide shape's 4 GiB)
        self.host.ask({"op": "drop", "keys": keys})

    def calls(self, lib: str, shape: dict, pairs: list[tuple], transfer: bool = True,
              keep_outs: bool = False, threads: int = 1, shapes: list[dict] | None = None,
              thread_of: list[int] | None = None, check: bool = True) -> tuple[float, float, float | None]:
        """Run lib on each (out, inputs) back to back in the host. With `transfer`, changed inputs go there
        first, each output is poisoned there and comes back after, and so does any input a call changed
        (without: the buffers are already there, as the bench's are); with `keep_outs`, each output goes
        there as it is here instead of poisoned (parity's output-state check); without `check` the host keeps no
        copy of the inputs to find those a call changed (the wide shape's: memory); `threads` 2 makes them in two
        threads at once (`thread_of` each call's, 0 or 1), `shapes` each call's shape. Returns (seconds to issue the calls, seconds in all on
        the judge's clock, seconds between events on the host's stream around the calls or None)."""
        import time
        calls, outs, ins = [], {}, {}
        for n, (out, inputs) in enumerate(pairs):
            flat, o = self._out(out)
            calls.append({"lib": lib, "out": {**o, "poison": transfer and not keep_outs},
                          "inputs": [{"key": self._key(t, "i"), "shape": list(t.shape)} for t in inputs]})
            if shapes is not None:
                calls[-1]["shape"] = shapes[n]
            if thread_of is not None:
                calls[-1]["thread"] = thread_of[n]
            outs[o["key"]] = flat
            ins.update({self._key(t, "i"): t for t in inputs})
        put = self.put([(t, "i") for t in ins.values()] + [(t, "o") for t in outs.values() if keep_outs]) \
            if transfer else []
        t0 = time.perf_counter()
        req = {"op": "call", "shape": shape, "put": put, "calls": calls, "threads": threads,
               "get": list(outs) if transfer else [], "check": transfer and check}
        if transfer:   # the outputs back, and any input a call changed
            ans = self.host.ask({**req, "ipc": self.ipc})
            total = time.perf_counter() - t0
            back = {**outs, **{k: ins[k] for k in ans.get("changed") or [] if k in ins}}
            self.bring(ans, back)
        else:
            ans = self.host.ask(req)
            total = time.perf_counter() - t0
        late = ans.get("late") or []
        self.late = [int(n) for n in late if isinstance(n, int) and 0 <= n < len(pairs)]
        left = ans.get("threads_left")
        if isinstance(left, list) and left and not self.threads_left:
            self.threads_left = [str(x)[:40] for x in left[:8]]
        issue, span = ans.get("issue_ms"), ans.get("stream_ms")
        # the host's words, held to the judge's clock: neither can exceed the time the judge saw pass
        span = min(float(span) / 1e3, total) if isinstance(span, (int, float)) and span >= 0 else None
        return (min(float(issue) / 1e3, total) if isinstance(issue, (int, float)) else total), total, span

    def run(self, lib: str, shape: dict, out, *inputs) -> None:
        """tools.measure.parity's `run`: one call."""
        self.calls(lib, shape, [(out, inputs)])

    def run_kept(self, lib: str, shape: dict, out, *inputs) -> None:
        """One call into `out` holding what it holds here (parity's output-state check), not the poison."""
        self.calls(lib, shape, [(out, inputs)], keep_outs=True)
