#!/usr/bin/env bash
# Issue 44 on a machine with two GPUs (kind nvidia-h100-x2): the same sweep sample on 1 worker (here) and on 2 dask
# workers (a GPU each), the records under $OUT so that a sweep cut by the call's limit still comes back.
#
#   bash scripts/device/scale_sweep.sh TASK LIMIT [SECONDS_EACH]     e.g. kernels/softmax 8 240
#
# Before each sweep, nvidia-smi lists what holds a GPU (an earlier call's processes would slow it). After, one line
# per sweep: the wall clock, the build / eval / verify walls (sweep.json), the outcomes, the best and where each point
# was evaluated. The eval wall's ratio is the figure (the builds happen on the submitting host either way).
set -uo pipefail
task=${1:?task folder}; limit=${2:?configurations}; each=${3:-240}
out=${OUT:-/tmp/scale_sweep}; mkdir -p "$out"
for w in 1 2; do
    echo "== workers $w: GPU processes before: $(nvidia-smi --query-compute-apps=pid,name --format=csv,noheader | tr '\n' ';')"
    s=$(date +%s.%N)
    timeout "$each" python3 -m agent sweep "$task" --limit "$limit" --seed 3 --batch "${BATCH:-4}" --workers "$w" --runs-dir "$out/runs-w$w" \
        > "$out/sweep-w$w.log" 2>&1
    rc=$?
    echo "workers $w: rc=$rc wall $(python3 -c "import time; print(round(time.time() - $s, 1))") s"
done
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for w in (1, 2):
    for f in sorted((out / f"runs-w{w}").glob("sweep-*/sweep.json")):
        r = json.loads(f.read_text())
        oc = {}
        for p in r["points"]:
            oc[p["outcome"]] = oc.get(p["outcome"], 0) + 1
        best = [p for p in r["points"] if p.get("verified")]
        where = sorted({p.get("worker") or "here" for p in r["points"]})
        print(f"workers {w}: complete={r['complete']} build {r['build_wall_s']:.1f} s, eval {r['eval_wall_s']:.1f} s, "
              f"verify {r['verify_wall_s']:.1f} s; {oc}; on {where}")
        if best:
            b = best[0]
            print(f"  best {b['knobs']} {b['median_ms'] * 1e3:.1f} us, {b['speedup_vs_initial']:.3f}x, "
                  f"verified {b.get('verified_speedup')}")
PY
