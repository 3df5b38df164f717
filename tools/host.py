"""The kernel host: `python -m tools.host`, the only process that loads a candidate's code.

It is started by the judge (tools/judge.py), fenced to its scratch directory (tools/confine.py)
before anything is loaded, and takes requests as JSON lines on stdin. It answers each with one JSON
line on a private copy of its original stdout (fd 1 is pointed at stderr first, so a kernel's printf
lands on stderr). It computes no verdict: it loads libraries, fills the buffers the judge describes
from files the judge wrote, calls the task's `run`, and writes the buffers back to files the judge
reads. What it says is data the judge validates: a forged answer line, a forged exit status or a
patched statistic in this process changes no verdict, because the judge compares the outputs with
its own reference and keeps its own clock.

Requests (each answered {"ok": true, ...} or {"ok": false, "error": "..."}):
    init  {task}                               load the task module and torch; a CUDA task's context
    load  {id, path}                           ctypes-load a library under a name
    plan  {lib}                                the library's own launch plan for the main shape
    call  {lib, shape, inputs, out}            run once; buffers below
    measure {shapes, reference}                the bench of the library loaded as "candidate" against
                                               the one loaded as "baseline" (if any)

A buffer is {key, file, dtype, shape, offset, numel}: `key` names the host-side buffer (the same
key gets the same memory, so a kernel that caches on its pointers sees its pointers again), `file`
the bytes the judge wrote and reads back, `offset`/`numel` the output's view inside a guarded flat
buffer.
"""

from __future__ import annotations

import json
import os
import sys

from tools.runner import load_lib, private_stdout


def save(t, path: str) -> None:
    """A tensor's bytes (contiguous, host memory) to a file."""
    t.detach().contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy().tofile(path)


def load_into(t, path: str) -> None:
    """A file's bytes into the (contiguous) tensor t, which keeps its memory."""
    import torch
    n = t.numel() * t.element_size()
    if os.path.getsize(path) != n:
        raise ValueError(f"{os.path.basename(path)} holds {os.path.getsize(path)} bytes, the buffer {n}")
    src = torch.from_file(path, size=n, dtype=torch.uint8)
    t.view(-1).view(torch.uint8).copy_(src)


class Host:
    def __init__(self) -> None:
        self.task = self.mod = None
        self.libs: dict[str, object] = {}
        self.bufs: dict[str, object] = {}
        self.bench_state: dict | None = None

    def device(self) -> str:
        return "cuda" if self.task.spec.device == "cuda" else "cpu"

    def sync(self) -> None:
        if self.device() == "cuda":
            import torch
            torch.cuda.synchronize()

    def init(self, r: dict) -> dict:
        from tools.runner import warm_up
        from tools.task import load_task
        self.task = load_task(r["task"])
        self.mod = self.task.module()
        warm_up(self.task)
        return {"ok": True, "pid": os.getpid()}

    def load(self, r: dict) -> dict:
        self.libs[r["id"]] = load_lib(r["path"])
        return {"ok": True}

    def plan(self, r: dict) -> dict:
        from tools._plan_child import plan_from
        main = {k: (v if isinstance(v, bool) else int(v)) for k, v in self.task.spec.main.items()}
        try:
            return {"ok": True, "plan": plan_from(self.mod, self.libs[r["lib"]], main, self.task.spec.module)}
        except Exception as e:  # the task's launch_plan raised
            return {"ok": True, "plan": {"ok": False, "error": f"launch_plan raised {type(e).__name__}: "
                                                                f"{' '.join(str(e).split())[:300]}"}}

    def _buffer(self, b: dict):
        import torch
        dtype = getattr(torch, b["dtype"])
        have = self.bufs.get(b["key"])
        size = int(os.path.getsize(b["file"])) // torch.empty(0, dtype=dtype).element_size()
        if have is None or have.numel() != size or have.dtype != dtype:
            have = self.bufs[b["key"]] = torch.empty(size, dtype=dtype, device=self.device())
        load_into(have, b["file"])
        return have

    def call(self, r: dict) -> dict:
        ins = [self._buffer(b) for b in r["inputs"]]
        views = [t.view(b["shape"]) for t, b in zip(ins, r["inputs"])]
        o = r["out"]
        flat = self._buffer(o)
        out = flat[o["offset"]:o["offset"] + o["numel"]].view(o["shape"])
        self.sync()
        self.mod.run(self.libs[r["lib"]], r["shape"], out, *views)
        self.sync()
        save(flat, o["file"])
        for t, b in zip(ins, r["inputs"]):
            save(t, b["file"])
        return {"ok": True}

    def measure(self, r: dict) -> dict:
        """The bench of tools.bench.measure, in this process (its timings are the host's word: moving
        the clock to the judge is the next step of issue 24)."""
        from tools.bench import measure
        res = measure(self.task, self.mod, self.libs["candidate"], baseline=self.libs.get("baseline"),
                      shapes=r["shapes"], with_reference=bool(r["reference"]))
        return {"ok": True, "results": [x.model_dump(mode="json") for x in res]}


OPS = ("init", "load", "plan", "call", "measure")


def main() -> int:
    out = private_stdout()
    host = Host()
    for line in sys.stdin:
        try:
            r = json.loads(line)
            op = r.get("op")
            if op not in OPS:
                raise ValueError(f"unknown request {op!r}")
            ans = getattr(host, op)(r)
        except Exception as e:  # the kernel's or the task's error: an answer, the judge decides
            ans = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    # before any candidate code is loaded: writes only in this process's scratch directory
    from tools.confine import fence_scratch
    fence_scratch()
    sys.exit(main())
