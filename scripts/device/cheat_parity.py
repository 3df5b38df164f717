"""Parity of each CUDA adversary of tests/fixtures/cuda_cheats/softmax/ on its own (issue 40), on the GPU box:

    python scripts/device/cheat_parity.py          # from the repo root; about 2-4 minutes on an H100/H200

Each file replaces kernels/softmax/softmax.cu in a copy of the task, is built by the product's build and checked
by `run_parity` with every shape (listed, hidden and the [dims] extremes), then again without the extremes (the
loop's quick parity: what caught it before a keep, or nothing). Whatever the candidate's speed, this names the
check that catches each; scripts/device/verify_gpu.py pushes the same files through the loop. Writes
$OUT/cheat_parity.json and prints one line per file, then a summary line.
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
from tools.measure.parity import run_parity   # noqa: E402
from tools.task import load_task   # noqa: E402

CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats" / "softmax"


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="cheat-parity-out-"))
    work = Path(tempfile.mkdtemp(prefix="cheat-parity-"))
    rows = []
    for cu in sorted(CHEATS.glob("*.cu")) + [REPO / "kernels" / "softmax" / "softmax.cu"]:
        name = cu.stem if cu.parent == CHEATS else "committed (honest)"
        d = work / cu.stem / "softmax"
        shutil.copytree(REPO / "kernels" / "softmax", d, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(cu, d / "softmax.cu")
        task = load_task(d)
        b = build(task, work / cu.stem / "build")
        row = {"name": name, "build": b.status.value}
        if b.status.value == "ok":
            for extent in ("full", "quick"):
                t0 = time.monotonic()
                p = run_parity(task, Path(b.lib_path), extent=extent)
                bad = p.worst()
                row[extent] = {"status": p.status.value, "message": p.message[:400], "seconds": round(time.monotonic() - t0, 1),
                               "at": bad.label if bad else None, "err_ratio": max((c.err_ratio or 0) for c in p.checks) if p.checks else None}
        rows.append(row)
        f, q = row.get("full", {}), row.get("quick", {})
        print(f"{name:20s} full: {f.get('status', b.status.value):14s} quick: {q.get('status', '-'):10s} "
              f"{f.get('seconds', 0):6.1f}s  {(f.get('message') or b.message)[:150]}", flush=True)
    import torch
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    (out / "cheat_parity.json").write_text(json.dumps({"device": dev, "rows": rows}, indent=2))
    caught = [r["name"] for r in rows if r.get("full", {}).get("status") not in (None, "ok") and r["name"] != "committed (honest)"]
    honest = next(r for r in rows if r["name"] == "committed (honest)")
    print(f"cheat_parity on {dev}: {len(caught)} of {len(rows) - 1} adversaries fail parity; the committed kernel: "
          f"{honest.get('full', {}).get('status')}; json in {out}/cheat_parity.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
