#!/usr/bin/env bash
# Device batch A: the instruments on the real kernels. Everything lands in $OUT/a.tgz + $OUT/summary.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
W=$OUT/a; mkdir -p $W; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > $S
echo "== kernel self-check (helper script)" >> $S
timeout 200 python3 scripts/device/check_kernels.py --max-configs 20 --jobs 8 --budget-s 150 > $W/check_kernels.log 2>&1; echo "rc=$?" >> $S
tail -40 $W/check_kernels.log >> $S
B=/tmp/bld; rm -rf $B
echo "== build attention (cold), then a one-line edit" >> $S
python3 -m tools.build kernels/attention_fwd --build-dir $B --json > $W/build_cold.json 2>$W/build_cold.err
python3 - >> $S <<'PY'
import json; d=json.load(open("/root/out/a/build_cold.json")) if False else None
PY
python3 -c "import json,sys;d=json.load(open('$W/build_cold.json'));print('cold',d['status'],round(d['seconds'],2),'s steps',d['steps_run'],[(k['name'][:40],k['registers'],k['spill_stores_bytes']) for k in d['kernels']])" >> $S 2>&1
sed -i 's|^#include <cuda_runtime.h>|#include <cuda_runtime.h>\n// one-line edit|' kernels/attention_fwd/attention.cu
python3 -m tools.build kernels/attention_fwd --build-dir $B --json > $W/build_edit.json 2>&1
python3 -c "import json;d=json.load(open('$W/build_edit.json'));print('after one-line edit',d['status'],round(d['seconds'],2),'s steps',d['steps_run'])" >> $S 2>&1
git checkout kernels/attention_fwd/attention.cu
python3 -m tools.build kernels/attention_fwd --build-dir $B --json > /dev/null 2>&1
LIB=$(python3 -c "import json;print(json.load(open('$W/build_cold.json'))['lib_path'])")
cp $LIB /tmp/attn.so
echo "== launch check (static + dynamic)" >> $S
timeout 120 python3 -m tools.launch kernels/attention_fwd --build-dir $B --json > $W/launch.json 2>&1; echo "rc=$?" >> $S
python3 -c "import json;d=json.load(open('$W/launch.json'));print(d['status'],d['mode'],d['message'][:200],'ctas',d['main_ctas'],'waves',d['waves'],[ (l['kernel'][:30],l['grid'],l['block'],l['source']) for l in d['launches']][:4])" >> $S 2>&1
echo "== parity attention" >> $S
timeout 200 python3 -m tools.parity kernels/attention_fwd --lib /tmp/attn.so --json > $W/parity.json 2>$W/parity.err; echo "rc=$?" >> $S
python3 -c "import json;d=json.load(open('$W/parity.json'));print(d['status'],d['message'][:200],len(d['checks']),'checks; max abs',max((c['max_abs_err'] or 0) for c in d['checks']))" >> $S 2>&1
echo "== bench attention all shapes vs SDPA" >> $S
timeout 200 python3 -m tools.bench kernels/attention_fwd --lib /tmp/attn.so --all-shapes --json > $W/bench_all.json 2>$W/bench_all.err; echo "rc=$?" >> $S
python3 -c "
import json
for r in json.load(open('$W/bench_all.json')):
    t={x['label']:x for x in r['timings']}; c=t.get('candidate'); ref=t.get('reference')
    print(r['status'], r['shape'], 'kernel %.1f us'%(c['median_ms']*1e3) if c else '-', '%.1f TF/s'%(c['tflops'] or 0) if c else '', 'sdpa %.1f us'%(ref['median_ms']*1e3) if ref else '-', 'speedup vs sdpa %.3f'%(r['speedup_vs_reference'] or 0), r['message'][:80])
" >> $S 2>&1
echo "== repeatability: 5 bench runs (main shape, no reference)" >> $S
for i in 1 2 3 4 5; do timeout 100 python3 -m tools.bench kernels/attention_fwd --lib /tmp/attn.so --no-reference --json > $W/bench_rep$i.json 2>&1; done
python3 -c "
import json,statistics
m=[json.load(open('$W/bench_rep%d.json'%i))[0]['timings'][0]['median_ms']*1e3 for i in range(1,6)]
print('medians us',[round(x,2) for x in m],'spread %.2f%%'%(100*(max(m)-min(m))/statistics.median(m)))
" >> $S 2>&1
echo "== profile attention tier 1 (+bare)" >> $S
timeout 200 python3 -m tools.profile kernels/attention_fwd --lib /tmp/attn.so --bare --out-dir $W/prof1 > $W/profile1.json 2>$W/profile1.err; echo "rc=$?" >> $S
python3 -c "
import json;d=json.load(open('$W/profile1.json'));e=d['env'];print(d['status'],d['message'][:150],'passes',e['replay_passes'],'wall',e['wall_seconds'],'bare',e['bare_seconds'])
for k in d['kernels']: print(' ',k['name'][:40],k['grid'],k['block'],'regs',k['registers_per_thread'],'sol c/m',k['sol_compute_pct'],k['sol_memory_pct'],'occ',k['occupancy_achieved_pct'],k['occupancy_limiter'],'tensor',k['tensor_pipe_pct'],'bank',k['smem_bank_conflicts'],k['bottleneck'],[r['id'] for r in k['rules']][:6])
" >> $S 2>&1
timeout 200 python3 -m tools.profile kernels/attention_fwd --lib /tmp/attn.so --shape 0 --tier 2 --out-dir $W/prof2 > $W/profile2.json 2>$W/profile2.err; echo "rc=$?" >> $S
python3 -c "
import json;d=json.load(open('$W/profile2.json'));print(d['status'],d['message'][:150],'passes',d['env']['replay_passes'])
for k in d['kernels']: print(' ',k['name'][:40],k['grid'],k['bottleneck'],k['bottleneck_reason'][:100],'stalls',[(s['reason'],s['pct']) for s in k['stalls']][:4])
" >> $S 2>&1
tar czf $OUT/a.tgz -C $OUT a
cat $S
