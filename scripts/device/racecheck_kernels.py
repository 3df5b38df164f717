"""compute-sanitizer racecheck on honest kernels and on the race adversaries (issue 40), on the GPU box:

    python scripts/device/racecheck_kernels.py [NAME ...]     # from the repo root; default every case below

Each case is a shipped task with knob values (honest: racecheck must stay clean, or the check would refuse honest
kernels) or a whole-file adversary from tests/fixtures/cuda_cheats/ (it must be reported). Each is built by the
product's build and run under the judge's racecheck (tools/judge/sanitize.py: its own host under the sanitizer,
the small shapes). Prints one line per case and a summary; writes $OUT/racecheck_kernels.json and, under
$OUT/sanitizer_logs/, each report as the sanitizer wrote it. Exit 0 when every honest case is clean and every
adversary reported.
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
from tools.task import load_task   # noqa: E402

CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats"
WMMA = {"SMEM_PAD": 8, "USE_TENSOR_CORES": 1}
# name, task, knob values or an adversary file, honest
CASES = [
    ("softmax_committed", "softmax", {}, True),
    ("softmax_1024x1_vec8", "softmax", {"THREADS": 1024, "VEC": 8}, True),
    ("softmax_256x8_online", "softmax", {"THREADS": 256, "ROWS_PER_CTA": 8, "VEC": 8, "ONLINE": 1}, True),
    ("softmax_512x2_online", "softmax", {"THREADS": 512, "ROWS_PER_CTA": 2, "VEC": 4, "ONLINE": 1}, True),
    ("attention_committed", "attention_fwd", {}, True),
    ("attention_wmma", "attention_fwd", WMMA, True),
    ("attention_wmma_splits", "attention_fwd", {**WMMA, "KV_SPLITS": 2}, True),
    ("attention_ext_wmma", "attention_ext", WMMA, True),
    *[(p.stem, "softmax", p, False) for p in sorted((CHEATS / "softmax").glob("*.cu"))
      if p.read_text().startswith("// CHEAT (race")],
    *[(p.stem, "attention_fwd", p, False) for p in sorted((CHEATS / "attention").glob("*.cu"))
      if p.read_text().startswith("// CHEAT (race")],
]


def prepare(work: Path, name: str, task: str, what) -> tuple:
    d = work / name / task
    shutil.copytree(REPO / "kernels" / task, d, ignore=shutil.ignore_patterns("__pycache__"))
    t = load_task(d)
    src = d / t.spec.editable[0]
    if isinstance(what, Path):
        shutil.copy(what, src)
    else:
        text = src.read_text()
        for k, v in what.items():
            lines = text.splitlines()
            hit = [i for i, ln in enumerate(lines) if ln.startswith(f"#define {k} ")]
            assert hit, f"{name}: no #define {k} in {src.name}"
            lines[hit[0]] = f"#define {k} {v}"
            text = "\n".join(lines) + "\n"
        src.write_text(text)
    t = load_task(d)
    b = build(t, work / name / "build")
    if b.status.value != "ok":
        raise RuntimeError(f"build {b.status.value}: {b.message[:300]}")
    return t, b.lib_path


def main() -> int:
    from tools.judge.sanitize import memcheck
    names = sys.argv[1:]
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="racecheck-out-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["AGENT_SANITIZER_LOGS"] = str(out / "sanitizer_logs")
    work = Path(tempfile.mkdtemp(prefix="racecheck-"))
    rows = []
    for name, task, what, honest in CASES:
        if names and name not in names:
            continue
        t0 = time.monotonic()
        try:
            t, lib = prepare(work, name, task, what)
            res = memcheck(t, t.module(), {"lib": lib}, work / name, 1, "racecheck")
        except Exception as e:  # a build or harness failure: the row says so
            res = {"status": "error", "message": f"{type(e).__name__}: {e}"[:400], "seconds": time.monotonic() - t0}
        ok = res["status"] == ("ok" if honest else "failed")
        rows.append({"name": name, "task": task, "honest": honest, "ok": ok, **res})
        print(f"{name:26s} {'honest' if honest else 'race':6s} {res['status']:8s} {res.get('shapes', 0):3d} shapes "
              f"{res.get('seconds', 0):6.1f}s {'yes' if ok else 'NO':3s} {res['message'][:220]}", flush=True)
    try:
        import torch
        dev = torch.cuda.get_device_name()
    except Exception as e:   # report, do not fail the table
        dev = f"unknown ({type(e).__name__})"
    (out / "racecheck_kernels.json").write_text(json.dumps({"device": dev, "rows": rows}, indent=2))
    bad = [r["name"] for r in rows if not r["ok"]]
    print(f"racecheck_kernels on {dev}: {len(rows) - len(bad)}/{len(rows)} as expected"
          f"{'; NOT: ' + ', '.join(bad) if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
