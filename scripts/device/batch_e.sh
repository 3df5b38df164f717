#!/usr/bin/env bash
# Device batch E (issue 4's figures): the batched `agent sweep` of softmax (every configuration,
# screened) and `agent optimize` of attention_fwd with parity+bench in one child, in a fresh user repo.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1; S=$OUT/summary.txt; R=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $S
U=/tmp/user; rm -rf $U; mkdir -p $U; cp -r kernels pyproject.toml $U/; cd $U
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init
echo "== agent sweep kernels/softmax --screen 24 (all configurations)" >> $S
/usr/bin/time -f "wall %e s" timeout ${SWEEP_S:-260} python3 -m agent sweep kernels/softmax --screen 24 --json > $OUT/sweep_softmax.json 2> $OUT/sweep_softmax.log; echo "rc=$?" >> $S
tail -8 $OUT/sweep_softmax.log >> $S
echo "== agent optimize kernels/attention_fwd --target 1.5x --iters 20" >> $S
/usr/bin/time -f "wall %e s" timeout ${OPT_S:-230} python3 -m agent optimize kernels/attention_fwd --target 1.5x --iters 20 --run-id attn --budget-seconds $(( ${OPT_S:-230} - 30 )) > $OUT/opt_attn.log 2>&1; echo "rc=$?" >> $S
grep -v "^[│┃┏┡└]" $OUT/opt_attn.log | tail -12 >> $S
python3 -m agent show attn --json > $OUT/show_attn.json 2>/dev/null
python3 -c "import json;d=json.load(open('$OUT/show_attn.json'));print('stage medians', {k: round(v,2) for k,v in d['stage_medians_s'].items()})" >> $S 2>&1
cd $U/runs && tar czf $OUT/runs.tgz --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.ncu-rep' --exclude='cfg-*' . 
cat $S
