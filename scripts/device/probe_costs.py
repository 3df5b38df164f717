"""Where a GPU bench's probes spend their time (issue 40: attention's reentrant probe cost 17-20 s a bench), on the
GPU box:

    python scripts/device/probe_costs.py [TASK] [bench|quick|rest|wide]   # from the repo root; default attention_fwd bench

Builds the task's kernel with its tensor-core knobs where it has them (a fast candidate: more calls per probe) and
the committed kernel as its baseline, then runs the judge's bench (`python -m tools.judge.judge bench`, the same
child the loop runs) under cProfile. Prints the bench's per-probe seconds and the judge's 25 costliest functions
(cumulative); writes $OUT/probe_costs.prof and $OUT/probe_costs.txt. `quick`: the judge's parity as a candidate's first check runs it (`--extent
quick`), the 25 functions that spend its time; `rest`: what a confirmation's parity adds (`--extent rest`), the same.
`wide`: the judge's parity on the [dims]
extremes instead (`parity --extent range`, what a candidate about to be kept pays), the 2^31-element shape's
check (tools/judge/wide.py) among them.
"""

from __future__ import annotations

import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.build.build import build   # noqa: E402
from tools.task import load_task   # noqa: E402


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "attention_fwd"
    mode = sys.argv[2] if len(sys.argv) > 2 else "bench"
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="probe-costs-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="probe-costs-"))
    libs = {}
    for arm, knobs in (("baseline", {}), ("candidate", {"SMEM_PAD": 8, "USE_TENSOR_CORES": 1})):
        d = work / arm / name
        shutil.copytree(REPO / "kernels" / name, d, ignore=shutil.ignore_patterns("__pycache__"))
        task = load_task(d)
        src = d / task.spec.editable[0]
        text = src.read_text()
        for k, v in knobs.items():
            text = "\n".join(f"#define {k} {v}" if ln.startswith(f"#define {k} ") else ln for ln in text.splitlines())
        src.write_text(text + "\n")
        b = build(load_task(d), work / arm / "build")
        if b.status.value != "ok":
            raise SystemExit(f"{arm}: build {b.status.value}: {b.message[:300]}")
        libs[arm] = (d, b.lib_path)
    prof = out / "probe_costs.prof"
    argv = ["bench", "--task", str(libs["candidate"][0]), "--lib", str(libs["candidate"][1]), "--baseline-lib",
            str(libs["baseline"][1]), "--no-reference"] if mode == "bench" else \
        ["parity", "--task", str(libs["candidate"][0]), "--lib", str(libs["candidate"][1]), "--extent",
         mode if mode in ("quick", "rest") else "range"]
    code = (f"import cProfile\nfrom tools.judge.judge import main\n"
            f"cProfile.run({f'main({argv!r})'!r}, {str(prof)!r})\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=400,
                         env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    text = res.stdout.strip().splitlines()
    try:
        data = json.loads(text[-1])
        if mode != "bench":
            print("parity", data.get("status"), round(data.get("seconds") or 0, 1), "s:", data.get("message", "")[-300:])
            print("wide:", [(c["label"], c["seconds"]) for c in data.get("checks") or [] if c["label"].startswith("wide")])
        benches = [v for v in (data.values() if isinstance(data, dict) else data) if isinstance(v, list)]
        for b in [b for lst in benches for b in lst if isinstance(b, dict) and "probe_seconds" in b]:
            print("bench", b.get("status"), round(b.get("seconds", 0), 1), "s; probes:", b.get("probe_seconds"))
    except (ValueError, IndexError, AttributeError):
        print("judge answered:", res.stdout[-800:], res.stderr[-1500:])
    buf = io.StringIO()
    pstats.Stats(str(prof), stream=buf).sort_stats("cumulative").print_stats(40)
    (out / "probe_costs.txt").write_text(buf.getvalue())
    if mode in ("quick", "rest"):   # where parity goes: the functions that take the time themselves
        buf = io.StringIO()
        pstats.Stats(str(prof), stream=buf).sort_stats("tottime").print_stats(25)
        print("\n".join(ln[:150] for ln in buf.getvalue().splitlines()[-32:]))
        buf = io.StringIO()
        pstats.Stats(str(prof), stream=buf).sort_stats("cumulative").print_stats(45)
        print("\n".join(ln[:150] for ln in buf.getvalue().splitlines()[-50:]))
        return 0
    print(buf.getvalue()[-9000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
