#!/usr/bin/env bash
# Issue 66: where a softmax sweep's wall time goes, on the lent GPU machine, from the repository root there, with the
# project's wheels in .whl/ (carry [".whl"]) and $OUT an empty folder:
#
#   bash scripts/device/sweep_walls.sh [BEFORE.tar]      # about 7 minutes on an H200 with BEFORE.tar, 4 without
#
# Each run in a fresh user repository with the object cache emptied first (cold builds), every line of the sweep
# stamped with its arrival (seconds since its start): `--limit 40 --screen 12` with the code of BEFORE.tar (an earlier
# commit: `git archive -o BEFORE.tar COMMIT`, carried) where given, then with this checkout's, side by side on one card;
# then all 199 configurations with this checkout's. $OUT/summary.txt has each run's last line, its stage walls
# (sweep.json) and when each stage began; NAME.log and NAME.json the whole of each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
R=$PWD; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$S"
stamp() { python3 -c 'import sys, time
t0 = time.monotonic()
for line in sys.stdin:
    sys.stdout.write(f"{time.monotonic() - t0:7.2f} {line}")
    sys.stdout.flush()'; }
run() {   # NAME CODE_DIR "SWEEP ARGS" TIMEOUT
  local U=/tmp/user_$1 d
  rm -rf "$U"; mkdir -p "$U"; cp -r "$R/kernels" "$R/pyproject.toml" "$U"/
  (cd "$U" && git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init)
  rm -rf ~/.cache/kernel-agent
  # shellcheck disable=SC2086  # the sweep's arguments are words
  (cd "$U" && PYTHONPATH=/tmp/site:$2 PYTHONUNBUFFERED=1 timeout "$4" python3 -m agent sweep kernels/softmax $3 --screen 12 2>&1
   echo "rc=$?") | stamp > "$OUT/$1.log"
  { echo "== $1 ($3)"; tail -2 "$OUT/$1.log"; } >> "$S"
  d=$(ls -td "$U"/runs/sweep-* | head -1); cp "$d/sweep.json" "$OUT/$1.json"
  python3 -c "
import json; d = json.load(open('$OUT/$1.json'))
print({k: d.get(k) for k in ('build_wall_s', 'screen_wall_s', 'eval_wall_s', 'verify_wall_s', 'initial_ms')})" >> "$S"
  grep "task softmax\|screening\|evaluating\|verifying" "$OUT/$1.log" | cut -c1-70 >> "$S"
  grep "built \([0-9]*\)/\1 \|screen 1/\|screen \([0-9]*\)/\2\]" "$OUT/$1.log" | cut -c1-70 >> "$S"
}
if [ $# -ge 1 ]; then
  B=/tmp/before; rm -rf $B; mkdir -p $B; tar -xf "$1" -C $B
  run before40 $B "--limit 40" 240
fi
run after40 "$R" "--limit 40" 150
run after199 "$R" "" 200
cat "$S"
