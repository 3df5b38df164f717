"""The kernel host: `python -m tools.judge.host`, the only process that loads a candidate's code.

It is started by the judge (tools/judge/judge.py), fenced to its scratch directory (tools/isolation/confine.py)
before anything is loaded, and takes requests as JSON lines on stdin. It answers each with one JSON
line on a private copy of its original stdout (fd 1 is pointed at stderr first, so a kernel's printf
lands on stderr). It computes no verdict: it loads libraries, fills the buffers the judge describes
from files the judge wrote, calls the task's `run`, and writes the buffers back to files the judge
reads. What it says is data the judge validates: a forged answer line, a forged exit status or a
patched statistic in this process changes no verdict, because the judge compares the outputs with
its own reference and keeps its own clock.

Requests (each answered {"ok": true, ...} or {"ok": false, "error": "..."}):
    init  {task, io}                           load the task module and torch; a CUDA task's context
    load  {id, path}                           ctypes-load a library under a name
    plan  {lib}                                the library's own launch plan for the main shape
    share {bufs}                               make these buffers (key, dtype, numel) and answer their CUDA IPC
                                               handles: the judge writes their bytes (tools/judge/devshare.py)
    call  {shape, put, calls, get, check,      fill the `put` buffers from their files, poison the
           threads}                            outputs marked so, make the calls back to back (or in two
                                               threads at once: threads 2; a call may name its shape), write
                                               the `get` buffers back (and, with `check`, the inputs a
                                               call changed; with `ipc`, as CUDA IPC handles where
                                               the driver shares them: tools/judge/devshare.py); answer
                                               the seconds it took to issue the calls and to finish, and
                                               the changed inputs' keys
    arms  {shape, sets, outs, arms}            the bench's arms (a library, or null: the reference) over
                                               buffers already here
    refill {shape, sets, seeds, dist}          new values in the timed sets (make_inputs), their digests
    drop  {keys}                               forget these buffers, their memory given back
    cost  {arm} / time {arm, n, offset, refresh} tools.backends.clocks' rep cost / n timed reps (ms each),
                                               values traded before each (tools.measure.rounds.Refresh)
    idle  {}                                   the threads on a CPU while nothing is called (tools/judge/threads.py)

A buffer is named by a key (the same key, the same memory: a kernel that caches on its pointers sees
its pointers again); its bytes travel in KEY.bin, written by the judge or by this process and removed by its
reader, in memory or in io/ (tools/judge/iofiles.py). A call
names its inputs {key, shape} and its output {key, offset, numel, shape}: a view inside a guarded
flat buffer.
"""

from __future__ import annotations

import json
import os
import sys

from tools.judge.iofiles import load_into, path_of, save
from tools.judge.runner import private_stdout
from tools.judge.threads import ids, names
from tools.measure.compare import bits_differ


def digest(t) -> int:
    """An exact sum of a tensor's bytes, as 32-bit words where they divide (the judge's and the host's copies
    of a refilled set compared: tools.judge.hostclient.HostRuns.mirror)."""
    import torch
    b = t.detach().contiguous().view(-1).view(torch.uint8)
    w = b.view(torch.int32) if b.numel() % 4 == 0 else b
    return int(w.sum(dtype=torch.int64))


class Host:
    def __init__(self) -> None:
        self.task = self.mod = None
        self.io: list[str] = []
        self.io_bound = 0
        self.libs: dict[str, object] = {}
        self.bufs: dict[str, object] = {}
        self.timed: dict | None = None
        self.fp = None          # tools.judge.fpstate.Watch: the floating-point control state the host started with
        self.dev = None         # tools.judge.devstate.Watch: a GPU context's device-wide settings, likewise

    def device(self) -> str:
        return self.task.backend.torch_device

    def sync(self) -> None:
        self.task.backend.sync()

    def init(self, r: dict) -> dict:
        from tools.task import load_task
        from tools.isolation import limits, nofork
        # the buffer files' folders (tools/judge/iofiles.py): [in memory,] on disk
        self.task, self.io, self.io_bound = load_task(r["task"]), list(r["io"]), int(r["io_bound"])
        self.mod = self.task.module()
        self.task.backend.warm_up()
        import torch
        # before any candidate library is loaded (tools/isolation/limits.py)
        spec = self.task.spec
        budget = spec.parity.timeout_s + spec.bench.timeout_s
        got = limits.apply(limits.wanted(self.task.backend.gpu, budget, self.io[-1]))     # file sizes: the disk's
        # and no new processes (tools/isolation/nofork.py), on a GPU host too: a child the host forked holds its CUDA
        # context, and the kernel it queued keeps the GPU after the host is killed (the next candidate's timing shared
        # the GPU with it: scripts/device/gpu_outlives.py). AGENT_HOST_NOFORK=0 leaves it off.
        want = os.environ.get("AGENT_HOST_NOFORK", "1") == "1"
        why = nofork.install() if want else "off"
        got["nofork"] = int(why is None)
        from tools.judge.fpstate import Watch
        self.fp = Watch()       # after torch and the task module, before any candidate library
        if self.task.backend.gpu:   # the context's device-wide settings, now that it is up (tools/judge/devstate.py)
            from tools.judge import devstate
            self.dev = devstate.Watch()
        return {"ok": True, "pid": os.getpid(), "threads": torch.get_num_threads(), "limits": got, "nofork_off": why,
                "gpu": self.task.backend.gpu, "jit_cache": os.environ.get("CUDA_CACHE_PATH")}

    def load(self, r: dict) -> dict:
        self.libs[r["id"]] = self.task.backend.load(r["path"])
        return {"ok": True}

    def plan(self, r: dict) -> dict:
        from tools.judge._plan_child import plan_shapes
        main = {k: (v if isinstance(v, bool) else int(v)) for k, v in self.task.spec.main.items()}
        try:
            return {"ok": True, "plan": plan_shapes(self.task, self.mod, self.libs[r["lib"]], main)}
        except Exception as e:  # the task's launch_plan raised
            return {"ok": True, "plan": {"ok": False, "error": f"launch_plan raised {type(e).__name__}: "
                                                                f"{' '.join(str(e).split())[:300]}"}}

    # --- buffers: the judge's tensors, by key, in this process's memory -------------------------------
    def _file(self, key: str) -> str:
        return path_of(self.io, key, self.io_bound)

    def _buffer(self, d: dict, numel: int):
        """The buffer `d` names (key, dtype, misalign: bytes past a 64-byte boundary, parity's misaligned views), made
        or kept at that size, dtype and offset."""
        import torch

        from tools.measure.views import empty_at, misalignment
        dtype, off = getattr(torch, d["dtype"]), int(d.get("misalign") or 0)
        have = self.bufs.get(d["key"])
        if have is None or have.numel() != numel or have.dtype != dtype or misalignment(have) != off:
            have = self.bufs[d["key"]] = empty_at(torch, numel, dtype, self.device(), off) if off else \
                torch.empty(numel, dtype=dtype, device=self.device())
        return have

    def _put(self, d: dict) -> None:
        import torch
        f = self._file(d["key"])
        load_into(self._buffer(d, os.path.getsize(f) // torch.empty(0, dtype=getattr(torch, d["dtype"])).element_size()), f)

    def share(self, r: dict) -> dict:
        """Buffers the judge will fill itself through CUDA IPC (tools/judge/devshare.py): each made here (or kept, at
        its size and dtype) and its handle answered; those the driver cannot share are left for files."""
        from tools.judge import devshare
        shared = {}
        for d in r["bufs"]:
            if not d["key"].replace("-", "").isalnum():
                raise ValueError(f"bad buffer key {d['key']!r}")
            have = self._buffer(d, int(d["numel"]))
            if (s := devshare.export(have)) is not None:
                shared[d["key"]] = s
        self.sync()
        return {"ok": True, "shared": shared}

    def _in(self, d: dict):
        return self.bufs[d["key"]].view(d["shape"])

    def drop(self, r: dict) -> dict:
        """Forget these buffers and give their memory back (the wide shape's, once checked)."""
        for key in r["keys"]:
            self.bufs.pop(key, None)
        if self.task.backend.gpu:
            import torch
            torch.cuda.empty_cache()
        return {"ok": True}

    def _out(self, d: dict):
        return self.bufs[d["key"]][d["offset"]:d["offset"] + d["numel"]].view(d["shape"])

    def _alloc(self, d: dict):
        """An output's flat buffer (the judge names its dtype and size), poisoned here with the harness's
        poison (tools.measure.compare): the judge does not send an output it would only overwrite."""
        import torch

        from tools.measure.compare import poison_
        dtype = getattr(torch, d["dtype"])
        have = self.bufs.get(d["key"])
        if have is None or have.numel() != d["flat_numel"] or have.dtype != dtype:
            have = self.bufs[d["key"]] = torch.empty(d["flat_numel"], dtype=dtype, device=self.device())
        poison_(have)

    def call(self, r: dict) -> dict:
        """The calls back to back. `check` (parity): the inputs are compared with copies taken before, and
        those a call changed are written back and named in `changed`."""
        import time
        for d in r.get("put", []):
            self._put(d)
        for c in r["calls"]:
            if c["out"].get("poison"):
                self._alloc(c["out"])
        todo = [(self.libs[c["lib"]], c.get("shape") or r["shape"], self._out(c["out"]), [self._in(x) for x in c["inputs"]],
                 c.get("thread", 0)) for c in r["calls"]]
        keys = {x["key"] for c in r["calls"] for x in c["inputs"]} if r.get("check") else set()
        before = {k: self.bufs[k].clone() for k in keys}
        from tools.measure.probes import StreamSpan
        span = StreamSpan(self.task.backend.gpu and r.get("threads") != 2)
        self.sync()
        threads_before = ids()
        t0, late = time.perf_counter(), []
        if r.get("threads") == 2:
            late = self._two_threads(todo)
        else:
            with span:
                for lib, shape, out, ins, _ in todo:
                    self.mod.run(lib, shape, out, *ins)
        t1 = time.perf_counter()
        self.sync()
        t2 = time.perf_counter()
        keys = sorted(keys)     # those a call changed, read back at once
        changed = [k for k, d in zip(keys, bits_differ([(before[k], self.bufs[k]) for k in keys])) if d]
        shared = self._give(list(r.get("get", [])) + changed, bool(r.get("ipc")))
        left = names(but=threads_before)
        return {"ok": True, "issue_ms": (t1 - t0) * 1e3, "total_ms": (t2 - t0) * 1e3, "changed": changed,
                "stream_ms": span.ms(), "shared": shared,
                "threads_left": sorted(left.values())[:8], "late": late}

    def _give(self, keys: list[str], ipc: bool) -> dict:
        """The judge gets these buffers: with `ipc`, each GPU buffer's IPC handle (tools/judge/devshare.py) in the
        answer; otherwise, or where the driver cannot share it, its bytes in a file."""
        from tools.judge import devshare
        shared = {}
        for key in keys:
            s = devshare.export(self.bufs[key]) if ipc else None
            if s is None:
                save(self.bufs[key], self._file(key))
            else:
                shared[key] = s
        return shared

    def _two_threads(self, todo: list) -> list[int]:
        """Each call in the thread it names, the two at once (the reentrancy probe, tools/measure/probes.py); on a
        GPU each thread on a stream of its own. Returns the calls whose work outlived their stream."""
        from tools.measure.together import late_calls, two_threads
        outs = tuple([c[2] for c in todo if c[4] == t] for t in (0, 1)) if self.task.backend.gpu else None
        late = two_threads(tuple([lambda c=c: self.mod.run(c[0], c[1], c[2], *c[3]) for c in todo if c[4] == t]
                                 for t in (0, 1)), outs)
        return late_calls([c[4] for c in todo], late)

    # --- the bench: arms over buffers already here, the per-rep clock -----------------------------
    def arms(self, r: dict) -> dict:

        shape, mod = r["shape"], self.mod
        sets = [[self._in(x) for x in s] for s in r["sets"]]
        outs = [self._out(o) for o in r["outs"]]
        n = len(sets)
        timed_ref = getattr(mod, "timing_reference", mod.reference)

        def arm(lib):
            if lib is None:
                return lambda i: timed_ref(shape, *sets[i % n])
            return lambda i: mod.run(lib, shape, outs[i % n], *sets[i % n])

        self.timed = {"arms": {label: arm(None if lib_id is None else self.libs[lib_id]) for label, lib_id in r["arms"]},
                      "clock": self.task.backend.clock(), "sets": sets}
        return {"ok": True}

    def refill(self, r: dict) -> dict:
        """New values in the timed sets, in place: set i from the task's make_inputs with seeds[i]; answers
        each tensor's digest (the judge made the same and compares)."""
        from tools.task_messages import make_inputs
        digests, adopted = [], False
        for descs, seed in zip(r["sets"], r["seeds"]):
            fresh = make_inputs(self.mod, r["shape"], int(seed), self.device(), r["dist"])
            bufs = []
            for x, y in zip(descs, fresh):
                have = self.bufs.get(x["key"])
                if have is None or have.numel() != y.numel() or have.dtype != y.dtype:
                    # a buffer this process does not hold yet (the judge's wide shape, tools/judge/wide.py): the
                    # fresh tensor becomes it, not a second copy (two copies of 4 GiB inputs ran an H100 out)
                    self.bufs[x["key"]] = y.contiguous().view(-1)
                    adopted = True
                else:
                    have.view(x["shape"]).copy_(y)
                bufs.append(self._in(x))
            del fresh
            digests.append([digest(x) for x in bufs])
        self.sync()
        if adopted and self.task.backend.gpu:
            import torch
            torch.cuda.empty_cache()    # make_inputs' temporaries (fp32 draws) back to the device
        return {"ok": True, "digests": digests}

    def idle(self, r: dict) -> dict:
        """The threads still on a CPU while nothing calls the kernel (tools/judge/threads.py)."""
        from tools.judge.threads import running
        return {"ok": True, "running": running()}

    def poison(self, r: dict) -> dict:
        """The judge's SpotCheck: these output buffers poisoned before a timed burst."""
        for d in r["outs"]:
            self._alloc(d)
        self.sync()
        return {"ok": True}

    def warm_reference(self, r: dict) -> dict:    # the held confirmation child's, while the card is idle
        from tools.measure.warmup import reference_once
        return {"ok": True, "seconds": reference_once(self.task, self.mod, r["shape"], r["dist"])}

    def cost(self, r: dict) -> dict:
        return {"ok": True, "ms": self.timed["clock"].rep_cost(self.timed["arms"][r["arm"]])}

    def time(self, r: dict) -> dict:
        import contextlib

        from tools.backends.clocks import one_torch_thread
        fn = self.timed["arms"][r["arm"]]
        # one_thread: the judge asks whether torch's threads wait (tools/measure/refcheck.py)
        before = None
        if r.get("refresh") is not None:   # new values before each rep (tools/measure/rounds.py; the judge replays them)
            from tools.measure.rounds import Refresh
            before = Refresh(int(r["refresh"]), self.timed["sets"])
        with one_torch_thread() if r.get("one_thread") else contextlib.nullcontext():
            return {"ok": True, "ms": self.timed["clock"].run(fn, int(r["n"]), offset=int(r["offset"]), before=before)}


OPS = ("init", "load", "plan", "share", "call", "arms", "refill", "poison", "cost", "time", "drop", "idle",
       "warm_reference")


def main() -> int:
    out = private_stdout()
    host = Host()
    for line in sys.stdin:
        op = None
        try:
            r = json.loads(line)
            op = r.get("op")
            if op not in OPS:
                raise ValueError(f"unknown request {op!r}")
            ans = getattr(host, op)(r)
        except Exception as e:  # the kernel's or the task's error: an answer, the judge decides
            ans = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
        # the floating-point state a library's load or a call left changed: named (the judge fails the candidate) and
        # put back, whatever the request's own answer
        what = "loading the library" if op == "load" else "the kernel's calls"
        if host.fp is not None and op != "init" and (left := host.fp.check(what)) is not None:
            ans["fp_state"] = left
        if host.dev is not None and op != "init" and (left := host.dev.check(what)) is not None:
            ans["device_state"] = left
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    # before any candidate code is loaded: writes only in this process's scratch directory
    from tools.isolation.confine import fence_scratch
    fence_scratch()
    sys.exit(main())
