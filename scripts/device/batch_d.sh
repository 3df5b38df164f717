#!/usr/bin/env bash
# Device batch D: agent check on attention, bench vs fp16 SDPA on every shape, GPU tests, softmax optimize.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1; S=$OUT/summary.txt; R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
echo "== agent check kernels/attention_fwd" >> $S
timeout 200 python3 -m agent check kernels/attention_fwd > $OUT/check.txt 2>&1; echo "rc=$?" >> $S; tail -30 $OUT/check.txt >> $S
echo "== bench vs fp16 SDPA, every shape" >> $S
python3 -m tools.build kernels/attention_fwd --build-dir /tmp/bd --json > /tmp/b.json 2>/dev/null
LIB=$(python3 -c "import json;print(json.load(open('/tmp/b.json'))['lib_path'])")
timeout 150 python3 -m tools.bench kernels/attention_fwd --lib $LIB --all-shapes --json > $OUT/bench_all.json 2>/dev/null; echo "rc=$?" >> $S
python3 -c "
import json
for r in json.load(open('$OUT/bench_all.json')):
    t={x['label']:x for x in r['timings']}; c=t['candidate']; ref=t.get('reference')
    print(r['status'], ','.join(f'{k}={int(v)}' for k,v in r['shape'].items()), 'kernel %.1f us %.1f TF/s'%(c['median_ms']*1e3, c['tflops'] or 0), '| SDPA fp16 %.1f us %.1f TF/s'%(ref['median_ms']*1e3, ref['tflops'] or 0), '| %.3fx'%r['speedup_vs_reference'])
" >> $S 2>&1
echo "== pytest -m gpu" >> $S
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/pytest_gpu.txt 2>&1; echo "rc=$?" >> $S; tail -6 $OUT/pytest_gpu.txt >> $S
U=/tmp/user; rm -rf $U; mkdir -p $U; cp -r kernels pyproject.toml $U/; cd $U
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init
echo "== agent optimize kernels/softmax --target 1.5x --iters 20" >> $S
timeout 200 python3 -m agent optimize kernels/softmax --target 1.5x --iters 20 --run-id sm --budget-seconds 170 > $OUT/opt_softmax.log 2>&1; echo "rc=$?" >> $S
grep -v "^[│┃┏┡└]" $OUT/opt_softmax.log | tail -24 >> $S
cd $U/runs && tar czf $OUT/runs.tgz --exclude=worktree --exclude=build --exclude='*.so' --exclude='*.ncu-rep' .
cat $S
