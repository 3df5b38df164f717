#!/usr/bin/env bash
# Capture real Nsight Compute fixtures for tools/profile on the GPU machine, in one go.
# Run from the repo root:   bash scripts/device/profile_fixtures.sh
# Returns (under $OUT): ncu_fixtures.tar.gz (-> tar xzf into tests/fixtures/ncu/), manifest.json, summary.txt
#
# It builds the demo task (tests/fixtures/ncu/demo_task, nvcc directly), then profiles it through
# our own tool (`python -m tools.profile`, i.e. the exact ncu command line the loop uses, one launch
# per report so the files stay small): tier 1 and tier 2 of the normal grid, tier 1 of the
# deliberately small grid (2 CTAs). For each report ncu's own text (`--page details`, `--page raw
# --csv`) is saved for the tests to assert against. Also: torch-profiler traces (fallback fixture),
# bare vs ncu wall time, and kernels/attention_fwd if it exists in this checkout.
set -uo pipefail
OUT=${OUT:-/tmp/profile_out}
W=/tmp/pf; F=$W/fixtures
rm -rf "$W"; mkdir -p "$F" "$OUT"
export PYTHONPATH="$PWD:/tmp/site:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
DEMO=tests/fixtures/ncu/demo_task
LIB=$W/libscale.so
log() { echo "[$(date +%T)] $*" | tee -a "$F/summary.txt"; }

log "ncu: $(command -v ncu) $(ncu --version | grep -i version)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$F/summary.txt"
python -c "from tools.profile.reader import module_origin; print('ncu_report module:', module_origin())" | tee -a "$F/summary.txt"

log "build demo (nvcc)"
nvcc -shared -Xcompiler -fPIC -O3 -arch=sm_90 -Xptxas -v -o "$LIB" "$DEMO/scale.cu" 2> "$F/ptxas.txt" || { cat "$F/ptxas.txt"; exit 1; }
cat "$F/ptxas.txt" >> "$F/summary.txt"

# bare program (same target, same calls) vs tier-1 ncu
t0=$(date +%s.%N)
python -m tools.profile.target --task "$DEMO" --lib "$LIB" --shape-index 0 --warmup 3 --iters 1 > "$F/bare.txt" 2>&1
t1=$(date +%s.%N)
BARE=$(python -c "print(round($t1-$t0,3))")
log "bare target run: ${BARE}s"

capture() {  # name tier shape
  local name=$1 tier=$2 shape=$3
  local t0 t1
  t0=$(date +%s.%N)
  python -m tools.profile "$DEMO" --lib "$LIB" --tier "$tier" --shape "$shape" --out-dir "$W/$name" --bare --no-fallback > "$F/$name.json" 2> "$F/$name.err"
  local rc=$?
  t1=$(date +%s.%N)
  log "$name: tool rc=$rc, tool wall $(python -c "print(round($t1-$t0,3))")s; $(python -c "import json;d=json.load(open('$F/$name.json'));e=d['env'];print('status',d['status'],'ncu wall',e['wall_seconds'],'bare',e['bare_seconds'],'passes',e['replay_passes'],'|',d['message'][:300])")"
  cp "$W/$name/ncu.log" "$F/$name.ncu.log" 2>/dev/null
  local rep
  rep=$(ls "$W/$name"/*.ncu-rep 2>/dev/null | head -1)
  if [ -n "$rep" ]; then
    cp "$rep" "$F/$name.ncu-rep"
    ncu -i "$F/$name.ncu-rep" --page raw --csv --print-units base > "$F/$name.raw.csv" 2>&1
    ncu -i "$F/$name.ncu-rep" --page details --print-units base --print-details all > "$F/$name.details.txt" 2>&1
    grep -iE "Small Grid|grid for this launch|Grid Size|Registers Per|Theoretical Occ|Achieved Occ|Memory Throughput|Compute \(SM\)" "$F/$name.details.txt" | head -20 | tee -a "$F/summary.txt"
  fi
}
capture t1 1 0
capture t2 2 0
capture small_t1 1 1

log "torch profiler traces (fallback fixture)"
for s in 0 1; do
  python -m tools.profile.target --task "$DEMO" --lib "$LIB" --shape-index $s --warmup 2 --iters 1 --trace "$F/trace_s$s.json" > /dev/null 2>> "$F/summary.txt"
  python - "$F/trace_s$s.json" <<'PY' | tee -a "$F/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
ks = [e for e in d.get("traceEvents", []) if e.get("cat") == "kernel"]
# keep the fixture small: device properties + kernel events (and their args) only
json.dump({"deviceProperties": d.get("deviceProperties", []), "traceEvents": ks}, open(sys.argv[1], "w"), indent=1)
print(sys.argv[1], len(ks), "kernel events:", [(k["name"][:40], k["args"].get("grid"), k["args"].get("registers per thread")) for k in ks][:3])
PY
done

log "fallback path end to end (ncu hidden from PATH)"
PATH_NO_NCU=$(echo "$PATH" | tr ':' '\n' | grep -v -e nsight -e "$(dirname "$(command -v ncu)")" | paste -sd:)
PATH="$PATH_NO_NCU" python -m tools.profile "$DEMO" --lib "$LIB" --shape 1 > "$F/fallback_small.json" 2>&1
python -c "import json;d=json.load(open('$F/fallback_small.json'));print('fallback:',d['status'],d['source'],[(k['name'],k['ctas'],k['bottleneck']) for k in d['kernels']],d['message'][:200])" | tee -a "$F/summary.txt"

if [ -f kernels/attention_fwd/task.toml ]; then
  log "kernels/attention_fwd present: tier-1 profile of its main shape"
  ALIB=$(python - <<'PY'
import tempfile
from tools.task import load_task
try:
    from tools.build.build import build
    r = build(load_task("kernels/attention_fwd"), tempfile.mkdtemp())
    print(r.lib_path or "")
except Exception as e:
    print("")
PY
)
  if [ -z "$ALIB" ]; then
    ALIB=$W/libattn.so
    srcs=$(python -c "from tools.task import load_task;t=load_task('kernels/attention_fwd');print(' '.join(str(t.path(s)) for s in t.spec.sources if s.endswith('.cu')))")
    nvcc -shared -Xcompiler -fPIC -O3 -arch=sm_90 -o "$ALIB" $srcs 2>> "$F/summary.txt"
  fi
  python -m tools.profile kernels/attention_fwd --lib "$ALIB" --tier 1 --out-dir "$W/attn_t1" --bare --no-fallback > "$F/attn_t1.json" 2> "$F/attn_t1.err"
  rep=$(ls "$W/attn_t1"/*.ncu-rep 2>/dev/null | head -1)
  [ -n "$rep" ] && cp "$rep" "$F/attn_t1.ncu-rep" && ncu -i "$F/attn_t1.ncu-rep" --page raw --csv --print-units base > "$F/attn_t1.raw.csv" 2>&1
  python -c "import json;d=json.load(open('$F/attn_t1.json'));print('attention:',d['status'],[(k['name'],k['ctas'],k['bottleneck']) for k in d['kernels']],d['env'])" | tee -a "$F/summary.txt"
else
  log "kernels/attention_fwd not in this checkout: skipped"
fi

python - "$F" "$BARE" <<'PY'
import json, pathlib, subprocess, sys
F = pathlib.Path(sys.argv[1])
def env(n):
    p = F / f"{n}.json"
    try:
        d = json.loads(p.read_text()); return {"status": d["status"], **d["env"]}
    except Exception as e:
        return {"error": str(e)}
m = {"bare_seconds_script": float(sys.argv[2]),
     "ncu_version": subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
     "runs": {n: env(n) for n in ("t1", "t2", "small_t1", "attn_t1") if (F / f"{n}.json").exists()},
     "files": sorted(p.name for p in F.iterdir()),
     "sizes": {p.name: p.stat().st_size for p in F.iterdir()}}
(F / "manifest.json").write_text(json.dumps(m, indent=1))
PY
tar czf "$OUT/ncu_fixtures.tar.gz" -C "$F" .
cp "$F/manifest.json" "$F/summary.txt" "$OUT/"
echo "=== summary ==="
python -c "
import json; m=json.load(open('$F/manifest.json'))
for n,e in m['runs'].items():
    print(n, e.get('status'), 'ncu wall', e.get('wall_seconds'), 'bare', e.get('bare_seconds'), 'passes', e.get('replay_passes'))
print('bare (script):', m['bare_seconds_script'], '| fixture bytes:', sum(m['sizes'].values()))"
