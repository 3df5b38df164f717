#!/usr/bin/env bash
# Device batch G (issue 4's figures), in parts so that each device call stays under its 10 minutes:
#   bash scripts/device/batch_g.sh opt_attn opt_sm sweep_sm     # the two optimize runs, the softmax sweep
#   bash scripts/device/batch_g.sh sweep_attn                   # every attention_fwd configuration
#   ITERS=30 HI_BUDGET=420 bash scripts/device/batch_g.sh opt_attn_hi   # the heuristic past 1.5x
#   bash scripts/device/batch_g.sh gpu_tests                    # pytest -m gpu
# Each part runs in a fresh user repo copy (/tmp/user) and writes its logs and JSON under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1; S=$OUT/summary.txt; R=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >> $S
U=/tmp/user; rm -rf $U; mkdir -p $U; cp -r kernels pyproject.toml $U/; cd $U
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init

medians() {  # stage medians and per-iteration totals of run $1
  python3 -m agent show "$1" --json > $OUT/show_$1.json 2>/dev/null
  python3 - "$OUT/show_$1.json" >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("stage medians", {k: round(v, 2) for k, v in d["stage_medians_s"].items()})
for it in d.get("iterations", []):
    t, wall = it.get("seconds") or {}, it.get("wall_s") or 0.0
    print(f"  iter {it['iteration']}: {it['decision']} {it['outcome']}: wall {wall:.2f} s, without the proposer "
          f"{wall - t.get('propose', 0.0):.2f} s; " + " ".join(f"{k} {v:.2f}" for k, v in t.items() if v >= 0.005))
PY
}
optimize() {  # run-id task budget outer-timeout extra-args...
  local id=$1 task=$2 budget=$3 outer=$4; shift 4
  echo "== agent optimize $task $* (budget ${budget}s) [run $id]" >> $S
  /usr/bin/time -f "wall %e s" -a -o $S timeout $outer python3 -m agent optimize $task --iters ${ITERS:-20} --run-id $id \
      --budget-seconds $budget "$@" > $OUT/opt_$id.log 2>&1; echo "rc=$?" >> $S
  grep -v "^[│┃┏┡└]" $OUT/opt_$id.log | tail -14 >> $S
  medians $id
}
sweep() {  # name task outer-timeout extra-args...
  local name=$1 task=$2 outer=$3; shift 3
  echo "== agent sweep $task $*" >> $S
  /usr/bin/time -f "wall %e s" -a -o $S timeout $outer python3 -m agent sweep $task --runs-dir $U/runs "$@" --json \
      > $OUT/sweep_$name.json 2> $OUT/sweep_$name.log; echo "rc=$?" >> $S
  grep -v "^\[" $OUT/sweep_$name.log | tail -8 >> $S
  f=$(ls -td $U/runs/sweep-* | head -1)/sweep.json; [ -f "$f" ] && cp "$f" $OUT/sweep_${name}_state.json
}
for part in "$@"; do
  case $part in
    opt_attn) optimize attn kernels/attention_fwd 200 260 --target 1.5x ;;
    opt_sm) optimize sm kernels/softmax 170 290 --target 1.5x ;;
    opt_attn_hi) optimize attnhi kernels/attention_fwd ${HI_BUDGET:-330} $(( ${HI_BUDGET:-330} + 100 )) --target 8x ;;
    sweep_sm) sweep softmax kernels/softmax 200 --screen 12 ;;
    sweep_attn) sweep attn kernels/attention_fwd ${ATTN_S:-560} --screen 16 ;;
    gpu_tests) (cd $R && timeout ${GPU_TESTS_S:-300} python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rfs > $OUT/pytest_gpu.txt 2>&1); tail -4 $OUT/pytest_gpu.txt >> $S ;;
  esac
done
[ -d $U/runs ] && (cd $U/runs && tar czf $OUT/runs.tgz --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.ncu-rep' --exclude='cfg-*' --exclude='build-initial' .)
cat $S
