#!/usr/bin/env bash
# Issue 45 on the device: KernelBench-format files (tests/data/kernelbench/, written for this project) imported with
# `agent import kernelbench` into a fresh user repository, then checked, optimized and exported.
#   OUT=... bash scripts/device/kernelbench.sh PART [PART ...]
# Parts:
#   honest      import and `agent check` the CUDA solutions: ew, rowred, softmax (its THREADS and VEC as knobs)
#   adversaries import and check KernelBench's three published reward hacks, written for these tests: an output left
#               uninitialised (torch::empty_like), inputs zeroed by the kernel, the work on a non-default stream
#   scaffold    import the fused linear + ReLU and the softmax problems without a solution (the forward as ATen calls
#               in a .cu, torch.export) and `agent check` them
#   softmax     softmax: rebuild seconds after a one-line edit (scripts/rebuild_time.py), `agent optimize` (heuristic
#               over THREADS and VEC), `agent export --kernelbench` and its fresh-process check
# What comes back under $OUT: summary.txt (printed at the end) and PART.tgz with the logs and run records.
set -uo pipefail
[ -n "${OUT:-}" ] || { echo "kernelbench.sh: OUT must name an empty folder" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null \
  || { echo "kernelbench.sh: installing .whl/*.whl failed (carry .whl)" >&2; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$PWD; D=$PWD/tests/data/kernelbench; S=$OUT/summary.txt; U=/tmp/kbuser; FIG=/tmp/kbfig
mkdir -p "$OUT"; rm -rf "$U" "$FIG"; mkdir -p "$U" "$FIG"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$S"
(cd "$U" && git init -q -b main && echo user > README.md && git add -A && git -c user.name=u -c user.email=u@x commit -qm init) || exit 1

imp() {  # name problem solution [args...]: agent import kernelbench, timed
  local name=$1 problem=$2 solution=$3; shift 3
  echo "== agent import kernelbench $problem --solution $solution --name $name $*" >> "$S"
  (cd "$U" && /usr/bin/time -f "wall %e s" -a -o "$S" timeout 300 python3 -m agent import kernelbench "$D/$problem" \
      --solution "$D/$solution" --name "$name" "$@" > "$W/import_$name.log" 2>&1); echo "rc=$?" >> "$S"
  grep -v "^reading" "$W/import_$name.log" | cut -c1-300 >> "$S"
}

check() {  # name: agent check, timed; its table's rows and verdict
  echo "== agent check kernels/$1" >> "$S"
  (cd "$U" && /usr/bin/time -f "wall %e s" -a -o "$S" timeout 420 python3 -m agent check "kernels/$1" \
      > "$W/check_$1.log" 2>&1); echo "rc=$?" >> "$S"
  grep -E "^│|passed|failed|error" "$W/check_$1.log" | sed 's/  */ /g' | cut -c1-400 | head -14 >> "$S"
}

honest() {
  imp ew ew_problem.py ew_cuda.py; check ew
  imp rowred rowred_problem.py rowred_cuda.py; check rowred
  imp softmax softmax_problem.py softmax_cuda.py --knob THREADS=64,128,256,512,1024 --knob VEC=1,2,4; check softmax
}

adversaries() {
  for a in adv_uninit adv_zero_inputs adv_stream; do imp "$a" ew_problem.py "$a.py"; check "$a"; done
}

scaffold() {
  for p in fuse softmax; do
    echo "== agent import kernelbench ${p}_problem.py (no solution) --name sc_$p" >> "$S"
    (cd "$U" && /usr/bin/time -f "wall %e s" -a -o "$S" timeout 300 python3 -m agent import kernelbench \
        "$D/${p}_problem.py" --name "sc_$p" > "$W/import_sc_$p.log" 2>&1); echo "rc=$?" >> "$S"
    grep -v "^reading" "$W/import_sc_$p.log" | cut -c1-300 >> "$S"
    check "sc_$p"
  done
}

softmax() {
  [ -d "$U/kernels/softmax" ] || imp softmax softmax_problem.py softmax_cuda.py --knob THREADS=64,128,256,512,1024 --knob VEC=1,2,4
  (cd "$U" && git add -A && git -c user.name=u -c user.email=u@x commit -qm "imported tasks") >/dev/null
  echo "== rebuild of the imported softmax after a one-line edit of kernel.cu (3 times)" >> "$S"
  timeout 300 python3 scripts/rebuild_time.py "$U/kernels/softmax" kernel.cu "$FIG/rebuild_softmax" 3 >> "$S" 2>&1
  echo "== agent optimize kernels/softmax --iters ${ITERS:-8} --target 1.5x --budget-seconds ${BUDGET:-150}" >> "$S"
  (cd "$U" && /usr/bin/time -f "wall %e s" -a -o "$S" timeout $((${BUDGET:-150} + 120)) python3 -m agent optimize \
      kernels/softmax --iters "${ITERS:-8}" --target 1.5x --budget-seconds "${BUDGET:-150}" --run-id kbsm \
      > "$W/opt.log" 2>&1); echo "rc=$?" >> "$S"
  grep -v "^[│┃┏┡└]" "$W/opt.log" | tail -16 | cut -c1-300 >> "$S"
  (cd "$U" && python3 -m agent show kbsm --json > "$W/show.json" 2>/dev/null)
  python3 - "$W/show.json" >> "$S" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("stage medians", {k: round(v, 2) for k, v in d["stage_medians_s"].items()})
for it in d.get("iterations", []):
    print(f"  iter {it['iteration']}: {it['decision']} {it['outcome']} wall {it.get('wall_s') or 0:.1f} s {it.get('seconds')}")
PY
  echo "== agent export kbsm --kernelbench" >> "$S"
  (cd "$U" && /usr/bin/time -f "wall %e s" -a -o "$S" timeout 400 python3 -m agent export kbsm --kernelbench \
      "$W/softmax_exported.py" > "$W/export.log" 2>&1); echo "rc=$?" >> "$S"
  tail -4 "$W/export.log" | cut -c1-300 >> "$S"
}

for part in "$@"; do
  case "$part" in honest|adversaries|scaffold|softmax) ;; *) echo "unknown part: $part" >&2; exit 2 ;; esac
  W=$FIG/$part; mkdir -p "$W"; echo "#### $part" >> "$S"; t0=$SECONDS
  cd "$R" && "$part"; cd "$R" || exit 1
  echo "#### $part: $((SECONDS - t0)) s" >> "$S"
  tar czf "$OUT/$part.tgz" --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.o' -C "$FIG" "$part" \
      -C "$U" runs 2>/dev/null
done
cat "$S"
