"""No honest kernel refused (issue 40): the initial measurement of every shipped CUDA task, each right after one
adversarial candidate's run, repeated, on the GPU box:

    python scripts/device/honest_after.py [REPEATS]      # from the repo root; default 20 (about 20 s a repeat)

Each repeat runs one adversary of tests/fixtures/cuda_cheats/softmax/ through the judge's candidate check (in
turn: the shared-state kernels with their device counters and workspaces, the out-of-bounds ones, the faults),
then the honest initial kernel of a shipped CUDA task (softmax, attention_fwd, attention_ext in turn) through the
same check the loop's setup makes (agent.optimize.best: parity, then the bench with the reference and every probe, the
side-stream probe among them). Prints one line per repeat and writes $OUT/honest_after.json; the summary line
counts refusals (a refused honest kernel prints its reason: the evidence of what made it look wrong).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.build.build import build   # noqa: E402
from tools.judge.candidate import run_candidate   # noqa: E402
from tools.task import load_task   # noqa: E402

CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats" / "softmax"
TASKS = ("softmax", "attention_fwd", "attention_ext")


def built(work: Path, name: str, src: Path, text: str | None):
    d = work / name / src.name
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__"))
    task = load_task(d)
    if text is not None:
        (d / task.spec.editable[0]).write_text(text)
    b = build(task, work / name / "build")
    if b.status.value != "ok":
        raise SystemExit(f"{name}: build {b.status.value}: {b.message[:300]}")
    return task, Path(b.lib_path)


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="honest-after-out-"))
    work = Path(tempfile.mkdtemp(prefix="honest-after-"))
    names = [n for n in ("static_counter", "static_workspace", "static_stats", "rows_past_m", "tail_rmw",
                         "head_noclamp", "half2_warp_stats") if (CHEATS / f"{n}.cu").exists()]
    from concurrent.futures import ThreadPoolExecutor   # the builds are nvcc processes: side by side on 16 cores
    with ThreadPoolExecutor(6) as pool:
        cf = {n: pool.submit(built, work, n, REPO / "kernels" / "softmax", (CHEATS / f"{n}.cu").read_text())
              for n in names}
        hf = {t: pool.submit(built, work, t, REPO / "kernels" / t, None) for t in TASKS}
        cheats, honest = {n: f.result() for n, f in cf.items()}, {t: f.result() for t, f in hf.items()}
    rows = []
    for i in range(repeats):
        name, tname = names[i % len(names)], TASKS[i % len(TASKS)]
        ctask, clib = cheats[name]
        t0 = time.monotonic()
        _, cpar, cbench, _ = run_candidate(ctask, clib, None, parity_extent="quick", scratch_root=work / "s")
        cheat = cpar.status.value if cpar.status.value != "ok" else (cbench[0].status.value if cbench else "-")
        t1 = time.monotonic()
        task, lib = honest[tname]
        _, par, bench, _ = run_candidate(task, lib, None, with_reference=True, parity_extent="full", scratch_root=work / "s")
        ok = par.status.value == "ok" and bool(bench) and bench[0].status.value == "ok"
        row = {"repeat": i, "after": name, "after_status": cheat, "after_s": round(t1 - t0, 1), "task": tname,
               "parity": par.status.value, "bench": bench[0].status.value if bench else None, "refused": not ok,
               "message": (par.message if par.status.value != "ok" else bench[0].message if bench else "")[:500],
               "median_us": round(bench[0].timing("candidate").median_ms * 1e3, 1)
               if bench and bench[0].timing("candidate") else None, "seconds": round(time.monotonic() - t1, 1)}
        rows.append(row)
        print(f"{i:2d} after {name:17s} ({cheat:15s} {row['after_s']:5.1f}s) {tname:14s} parity {row['parity']:8s} "
              f"bench {row['bench'] or '-':10s} {row['median_us']} us {'REFUSED ' + row['message'][:200] if not ok else ''}",
              flush=True)
    import torch
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    refused = [r for r in rows if r["refused"]]
    (out / "honest_after.json").write_text(json.dumps({"device": dev, "rows": rows}, indent=2))
    print(f"honest_after on {dev}: {len(refused)} of {len(rows)} honest initial measurements refused, each right after "
          f"an adversary's run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
