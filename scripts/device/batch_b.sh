#!/usr/bin/env bash
# Device batch B: the helpers' GPU scripts + the GPU-marked tests + rebuild timing; one tarball back.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
BASE=$OUT; mkdir -p $BASE/b; S=$BASE/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
echo "== rebuild after a one-line edit (attention)" >> $S
python3 - >> $S 2>&1 <<'PY'
import sys, time; sys.path.insert(0, ".")
from pathlib import Path
from tools.task import load_task
from tools.build import build
t = load_task("kernels/attention_fwd"); bd = Path("/tmp/rb")
r = build(t, bd); print("cold", r.status.value, f"{r.seconds:.2f}s", r.steps_run)
p = Path("kernels/attention_fwd/attention.cu"); src = p.read_text()
for i in range(3):
    p.write_text(src.replace("#include <stdint.h>", f"#include <stdint.h>\n// edit {i}", 1))
    r = build(t, bd); print("one-line edit", i, r.status.value, f"{r.seconds:.2f}s", "steps", r.steps_run)
p.write_text(src)
PY
echo "== profile fixtures" >> $S
(OUT=$BASE/b/prof timeout 280 bash scripts/device/profile_fixtures.sh > $BASE/b/prof.log 2>&1; echo "rc=$?" >> $S)
tail -25 $BASE/b/prof/summary.txt >> $S 2>/dev/null
echo "== launch check (dynamic)" >> $S
(mkdir -p $BASE/b/launch; OUT=$BASE/b/launch timeout 150 bash scripts/device/launch_check.sh > $BASE/b/launch.log 2>&1; echo "rc=$?" >> $S)
tail -15 $BASE/b/launch.log >> $S
echo "== parity/bench faults on CUDA" >> $S
(mkdir -p $BASE/b/pb; OUT=$BASE/b/pb timeout 330 python3 scripts/device/parity_bench_gpu.py > $BASE/b/pb.log 2>&1; echo "rc=$?" >> $S)
tail -25 $BASE/b/pb.log >> $S
echo "== pytest -m gpu" >> $S
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $BASE/b/pytest_gpu.log 2>&1; echo "rc=$?" >> $S
tail -15 $BASE/b/pytest_gpu.log >> $S
tar czf $BASE/b.tgz -C $BASE b
cat $S
