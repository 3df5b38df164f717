"""compute-sanitizer memcheck on each CUDA adversary of tests/fixtures/cuda_cheats/softmax/ (and attention/, by
name) and on the honest kernels (issue 40), on the GPU box:

    python scripts/device/memcheck_cheats.py [NAME ...]     # from the repo root; NAME: a file stem or "honest" (the
                                                            # honest kernels); none: every file and the honest ones

Each file replaces kernels/softmax/softmax.cu (an attention/ one: kernels/attention_fwd/attention.cu) in a copy of
the task, is built by the product's build and goes through the judge's candidate check as `agent check` runs it
(tools.judge.candidate.run_candidate: parity with every shape, then memcheck, then the bench), and the honest kernels
beside them: the committed softmax, its VEC 8 move, and the committed attention tasks. Prints one line per kernel
(parity, memcheck and racecheck: their seconds, their slowest shape) and writes $OUT/memcheck_cheats.json; also
$OUT/memcheck_raw.log, the sanitizer's own report on tail_rmw (the parser's test fixture, tests/fixtures/sanitizer/).
"""

from __future__ import annotations

import json
import os
import re
import shutil
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

CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats" / "softmax"
SOFTMAX = REPO / "kernels" / "softmax"
ATTENTION_CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats" / "attention"   # by name only (a loop runs them all:
ATTENTION = REPO / "kernels" / "attention_fwd"                                 # scripts/device/verify_attention.py)


def variants(names: list[str]) -> list[tuple[str, Path, str | None, bool]]:
    """(name, task folder, replacement source or None, honest)."""
    out = [(cu.stem, SOFTMAX, str(cu), False) for cu in sorted(CHEATS.glob("*.cu")) if not names or cu.stem in names]
    out += [(cu.stem, ATTENTION, str(cu), False) for cu in sorted(ATTENTION_CHEATS.glob("*.cu")) if cu.stem in names]
    if not names or "honest" in names:
        vec8 = re.sub(r"#define VEC 1\b", "#define VEC 8", (SOFTMAX / "softmax.cu").read_text())
        out += [("softmax (committed)", SOFTMAX, None, True), ("softmax VEC 8", SOFTMAX, vec8, True),
                ("attention_ext (committed)", REPO / "kernels" / "attention_ext", None, True),
                ("attention_fwd (committed)", REPO / "kernels" / "attention_fwd", None, True)]
    return out


def raw_log(lib: Path, out: Path) -> None:
    """The sanitizer's own report of tail_rmw's call on an odd shape (its exact format, for the parser's tests)."""
    code = ("import sys, torch; sys.path.insert(0, %r); import task; x = torch.randn(33, 7, device='cuda').half(); "
            "y = torch.empty_like(x); import ctypes; task.run(ctypes.CDLL(%r), {'M': 33, 'N': 7}, y, x); "
            "torch.cuda.synchronize()") % (str(SOFTMAX), str(lib))
    from tools.judge.sanitize import command, environment, find_sanitizer
    tool = find_sanitizer()
    if tool is None:
        return
    log = out / "memcheck_raw.log"
    subprocess.run(command(tool, log) + [sys.executable, "-c", code], env={**os.environ, **environment()},
                   timeout=300, capture_output=True)


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="memcheck-out-"))
    work = Path(tempfile.mkdtemp(prefix="memcheck-"))
    rows = []
    for name, src, text, honest in variants(sys.argv[1:]):
        key = re.sub(r"\W+", "_", name)
        d = work / key / src.name
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__"))
        task = load_task(d)
        if text is not None:
            (d / task.spec.editable[0]).write_text(Path(text).read_text() if text.endswith(".cu") else text)
        b = build(task, work / key / "build")
        row = {"name": name, "honest": honest, "build": b.status.value}
        if b.status.value == "ok":
            t0 = time.monotonic()
            _, par, bench, _ = run_candidate(task, Path(b.lib_path), None, parity_extent="full", memcheck=True,
                                          scratch_root=work / key / "scratch")
            row["seconds"] = round(time.monotonic() - t0, 1)
            row["parity"] = {"status": par.status.value, "message": par.message[:600], "seconds": round(par.seconds, 1)}
            row["memcheck"] = par.memcheck.model_dump(mode="json") if par.memcheck else None
            row["bench"] = bench[0].status.value if bench else None
            if name == "tail_rmw":
                raw_log(Path(b.lib_path), out)
        rows.append(row)
        if b.status.value == "ok":
            row["racecheck"] = par.racecheck.model_dump(mode="json") if par.racecheck else None
        m, r = row.get("memcheck") or {}, row.get("racecheck") or {}
        print(f"{name:26s} parity: {row.get('parity', {}).get('status', b.status.value):15s} memcheck: "
              f"{m.get('status', '-'):8s} {m.get('seconds', 0):6.1f}s {m.get('shapes', 0):3d} shapes (slowest "
              f"{m.get('slowest_shape') or '-'} {(m.get('steps') or {}).get('slowest', 0):.2f}s) racecheck: "
              f"{r.get('status', '-'):8s} {r.get('seconds', 0):6.1f}s (slowest {r.get('slowest_shape') or '-'} "
              f"{(r.get('steps') or {}).get('slowest', 0):.2f}s)  "
              f"{(row.get('parity', {}).get('message') or b.message)[:200]}", flush=True)
    import torch
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    (out / "memcheck_cheats.json").write_text(json.dumps({"device": dev, "rows": rows}, indent=2))
    caught = [r["name"] for r in rows if not r["honest"] and r.get("parity", {}).get("status") not in (None, "ok")]
    refused = [r["name"] for r in rows if r["honest"] and r.get("parity", {}).get("status") != "ok"]
    print(f"memcheck_cheats on {dev}: {len(caught)} of {sum(not r['honest'] for r in rows)} adversaries fail "
          f"(parity or memcheck); honest refused: {refused or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
