#!/usr/bin/env bash
# GPU check of tools.build.build / tools.measure.launch / agent doctor, in one go. Run from the repo root:
#   bash scripts/device/launch_check.sh
# Writes under $OUT (default ./runs/_device_out): launch_ok.json, launch_liar.json, trace_child.json,
# doctor.json, pytest.txt; prints a short summary last.
set -u
OUT="${OUT:-runs/_device_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. the fixture as committed: build (sm_XX of this GPU), static + dynamic (trace) check
python -m tools.measure.launch tests/fixtures/cuda_launch --build-dir "$WORK/ok" --json > "$OUT/launch_ok.json" 2> "$WORK/ok.err"
echo "launch_ok rc=$?" >> "$WORK/rc"

# 2. a plan that lies (reports another grid than the launcher uses): the dynamic check must reject it
cp -r tests/fixtures/cuda_launch "$WORK/liar_src"
sed -i 's/^#define PLAN_LIES 0/#define PLAN_LIES 1/' "$WORK/liar_src/scale.cu"
python -m tools.measure.launch "$WORK/liar_src" --build-dir "$WORK/liar" --json > "$OUT/launch_liar.json" 2> "$WORK/liar.err"
echo "launch_liar rc=$?" >> "$WORK/rc"

# 3. the raw trace child output (kineto args: does 'shared memory' include static smem?)
python -m tools.judge._plan_child trace tests/fixtures/cuda_launch/task.py "$WORK/ok/libcuda_launch.so" '{"n": 1048576}' normal \
  > "$OUT/trace_child.json" 2> "$WORK/trace.err"

# 4. doctor with the ncu counter probe
python -m agent doctor --json > "$OUT/doctor.json" 2> "$WORK/doctor.err"
echo "doctor rc=$?" >> "$WORK/rc"

# 5. the test files of this branch, GPU tests included
python -m pytest -q tests/test_build.py tests/test_launch.py tests/test_doctor.py -rs > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$WORK/rc"

echo "== stderr tails =="; for f in "$WORK"/*.err; do echo "-- $f"; tail -n 5 "$f"; done
echo "== summary =="
cat "$WORK/rc"
python - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as e:
        return {"_error": f"{name}: {e}"}
for name in ("launch_ok.json", "launch_liar.json"):
    d = load(name)
    if "_error" in d:
        print(d["_error"]); continue
    st, dy = d.get("static") or {}, d.get("dynamic") or {}
    print(f"{name}: build={d['build']['status']} arch={d['build'].get('arch')} static={st.get('status')} "
          f"dynamic={dy.get('status')} :: {dy.get('message') or st.get('message')}")
    for ln in dy.get("launches", [])[:3]:
        print(f"   trace: {ln['kernel'][:40]} grid={ln['grid']} block={ln['block']} smem={ln['smem_dynamic_bytes']} regs={ln['registers']}")
t = load("trace_child.json")
print("trace args:", json.dumps([l.get("args") for l in t.get("launches", [])])[:400] if "launches" in t else t)
doc = load("doctor.json")
for r in doc.get("rows", []):
    if r["name"] in ("gpu", "nvcc", "ncu", "ncu_report", "torch"):
        print(f"doctor {r['name']}: {r['status']} {r['detail']} {r['hint']}"[:200])
print("pytest:", (out / "pytest.txt").read_text().strip().splitlines()[-1] if (out / "pytest.txt").exists() else "?")
PY
