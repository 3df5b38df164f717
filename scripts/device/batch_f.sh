#!/usr/bin/env bash
# Device batch F (issue 4's figures): `agent optimize` of softmax with parity+bench in one child, then
# the batched `agent sweep` of softmax over every configuration (screened: the 12 fastest get every check).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1; S=$OUT/summary.txt; R=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $S
U=/tmp/user; rm -rf $U; mkdir -p $U; cp -r kernels pyproject.toml $U/; cd $U
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init
echo "== agent optimize kernels/softmax --target 1.5x --iters 20" >> $S
/usr/bin/time -f "wall %e s" timeout ${OPT_S:-210} python3 -m agent optimize kernels/softmax --target 1.5x --iters 20 --run-id sm --budget-seconds $(( ${OPT_S:-210} - 25 )) > $OUT/opt_sm.log 2>&1; echo "rc=$?" >> $S
grep -v "^[│┃┏┡└]" $OUT/opt_sm.log | tail -26 >> $S
python3 -m agent show sm --json > $OUT/show_sm.json 2>/dev/null
python3 -c "import json;d=json.load(open('$OUT/show_sm.json'));print('stage medians', {k: round(v,2) for k,v in d['stage_medians_s'].items()})" >> $S 2>&1
echo "== agent sweep kernels/softmax --screen 12 (all configurations)" >> $S
/usr/bin/time -f "wall %e s" timeout ${SWEEP_S:-310} python3 -m agent sweep kernels/softmax --screen 12 --json > $OUT/sweep_softmax.json 2> $OUT/sweep_softmax.log; echo "rc=$?" >> $S
tail -12 $OUT/sweep_softmax.log >> $S
cd $U/runs && tar czf $OUT/runs.tgz --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.ncu-rep' --exclude='cfg-*' --exclude='build-initial' .
cat $S
