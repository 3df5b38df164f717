"""What made an honest softmax look like it runs work outside the timed stream (issue 40), on the GPU box:

    python scripts/device/side_stream_neighbour.py [SECONDS]     # from the repo root; default 20 s a neighbour

Builds the committed softmax (the product's build) and, in this process, measures on the main shape what the
side-stream probe (tools/measure/probes.py) compares: the bench's per-call events (median of 200 calls, each
bracketed by events), then a burst of back-to-back calls with a device-wide sync (wall per call) and events on
the caller's stream around the same burst (span per call). Once on a quiet GPU, once beside a neighbour process
that keeps the GPU busy with its own context (a matmul loop: another candidate's run that outlived its host, a
user's job), and once right after the neighbour is killed. For each it prints the old rule's verdict (wall > 2x
the bench's events) and today's (wall > 2x the bench's events AND 2x the span). Then the judge's own check of
the same kernel (tools.judge.candidate.run_candidate, the loop's initial measurement) beside a neighbour, 3
times: refused or not; and, on a quiet GPU, the same check of the kernel with its launch moved to a stream of its
own (verify_gpu.py's side_stream cheat): refused. Writes $OUT/side_stream_neighbour.json.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.build.build import build   # noqa: E402
from tools.judge.candidate import run_candidate   # noqa: E402
from tools.task import load_task   # noqa: E402

NEIGHBOUR = ("import sys, time, torch\n"
             "a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)\n"
             "t = time.time() + float(sys.argv[1])\n"
             "print('busy', flush=True)\n"
             "while time.time() < t:\n"
             "    for _ in range(20): a = (a @ a).clamp_(-1, 1)\n"
             "    torch.cuda.synchronize()\n")


def measure(torch, mod, lib, shape) -> dict:
    x = mod.make_inputs(shape, 1, "cuda", "normal")
    y = mod.empty_output(shape, *x)
    for _ in range(20):
        mod.run(lib, shape, y, *x)
    torch.cuda.synchronize()
    per = []
    for _ in range(200):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        mod.run(lib, shape, y, *x)
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e))
    bench_ms = statistics.median(per)
    n = max(10, min(1000, int(50 / max(bench_ms, 1e-3))))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s.record()
    for _ in range(n):
        mod.run(lib, shape, y, *x)
    e.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / n
    span_ms = s.elapsed_time(e) / n
    return {"bench_us": round(bench_ms * 1e3, 1), "wall_us": round(wall_ms * 1e3, 1), "span_us": round(span_ms * 1e3, 1),
            "old_rule_refuses": wall_ms > 2 * bench_ms, "new_rule_refuses": wall_ms > 2 * max(bench_ms, span_ms)}


def softmax_built(work: Path):
    """The committed softmax built with the product's build: (task, build result, module, loaded library, main shape)."""
    task = load_task(REPO / "kernels" / "softmax")
    b = build(task, work / "build")
    if b.status.value != "ok":
        raise SystemExit(f"build {b.status.value}: {b.message[:300]}")
    return task, b, task.module(), ctypes.CDLL(b.lib_path), dict(task.spec.main)


def main() -> int:
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="side-stream-out-"))
    work = Path(tempfile.mkdtemp(prefix="side-stream-"))
    task, b, mod, lib, shape = softmax_built(work)
    import torch
    rows = []

    def row(label: str) -> None:
        r = {"when": label, **measure(torch, mod, lib, shape)}
        rows.append(r)
        print(f"{label:28s} bench {r['bench_us']:7.1f} us  wall {r['wall_us']:7.1f} us  span {r['span_us']:7.1f} us  "
              f"old rule {'REFUSES' if r['old_rule_refuses'] else 'passes'}  new rule "
              f"{'REFUSES' if r['new_rule_refuses'] else 'passes'}", flush=True)

    row("quiet")
    nb = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(secs)], stdout=subprocess.PIPE, text=True)
    nb.stdout.readline()
    row("beside a neighbour")
    row("beside a neighbour (again)")
    nb.kill()
    nb.wait()
    row("right after it was killed")
    checks = []
    nb = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(secs * 3)], stdout=subprocess.PIPE, text=True)
    nb.stdout.readline()
    for i in range(3):
        _, par, bench, _ = run_candidate(task, Path(b.lib_path), None, with_reference=True, scratch_root=work / "s")
        ok = par.status.value == "ok" and bool(bench) and bench[0].status.value == "ok"
        msg = (par.message if par.status.value != "ok" else bench[0].message if bench else "")[:300]
        checks.append({"refused": not ok, "message": msg})
        print(f"judge's check beside a neighbour {i + 1}: {'REFUSED ' + msg if not ok else 'ok ' + msg[:120]}", flush=True)
    nb.kill()
    nb.wait()
    src = (task.root / "softmax.cu").read_text()
    sys.path.insert(0, str(REPO / "scripts" / "device"))
    from verify_gpu import CASES
    [edits] = [c[3] for c in CASES if c[0] == "side_stream"]
    for old, new in edits:
        assert old in src, old
        src = src.replace(old, new)
    (work / "side").mkdir()
    for f in task.root.iterdir():
        if f.is_file():
            (work / "side" / f.name).write_bytes(f.read_bytes())
    (work / "side" / "softmax.cu").write_text(src)
    side = load_task(work / "side")
    sb = build(side, work / "side_build")
    _, par, bench, _ = run_candidate(side, Path(sb.lib_path), None, with_reference=True, scratch_root=work / "s")
    cheat = (par.message if par.status.value != "ok" else bench[0].message if bench else "")[:300]
    cheat_refused = not (par.status.value == "ok" and bool(bench) and bench[0].status.value == "ok")
    print(f"side_stream cheat, quiet GPU: {'refused ' if cheat_refused else 'KEPT '}{cheat}", flush=True)
    dev = torch.cuda.get_device_name()
    (out / "side_stream_neighbour.json").write_text(json.dumps({"device": dev, "rows": rows, "checks": checks, "cheat_refused": cheat_refused,
                                                                   "cheat_message": cheat}, indent=2))
    print(f"side_stream_neighbour on {dev}: {sum(c['refused'] for c in checks)} of {len(checks)} judge's checks refused "
          f"beside a neighbour")
    return 0


if __name__ == "__main__":
    sys.exit(main())
