#!/usr/bin/env bash
# Device batch C: `agent optimize` (heuristic) on the CUDA tasks in a fresh user repo, then a sweep sample.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
R=$PWD; U=/tmp/user; rm -rf $U; mkdir -p $U; cp -r kernels pyproject.toml $U/; cd $U
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $S
for t in attention_fwd:250 softmax:190; do
  name=${t%%:*}; lim=${t##*:}
  echo "== agent optimize kernels/$name --target 1.5x --iters 20 (heuristic)" >> $S
  /usr/bin/time -f "wall %e s" timeout $lim python3 -m agent optimize kernels/$name --target 1.5x --iters 20 --run-id $name --budget-seconds $((lim-40)) > $OUT/opt_$name.log 2>&1; echo "rc=$?" >> $S
  grep -v "^[│┃┏┡└]" $OUT/opt_$name.log | tail -14 >> $S
done
echo "== agent sweep kernels/softmax --limit 10" >> $S
timeout 120 python3 -m agent sweep kernels/softmax --limit 10 --seed 1 > $OUT/sweep_softmax.log 2>&1; echo "rc=$?" >> $S
tail -13 $OUT/sweep_softmax.log >> $S
cd $U/runs && tar czf $OUT/runs.tgz --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.ncu-rep' . 
cat $S
