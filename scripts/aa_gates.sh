#!/usr/bin/env bash
# How often does `agent gate` cry wolf? N A/A gates (HEAD against itself) on the CPU matmul in a fresh
# user repository, with one core kept busy by a spinning process the whole time. Prints one line per
# gate and the tally; exits 1 if any gate reported a significant change.
#   bash scripts/aa_gates.sh [N=20]
set -euo pipefail
N=${1:-20}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
load=
cleanup() { [ -n "$load" ] && kill "$load" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/repo/kernels"
cp -r "$here/kernels/matmul_cpu" "$work/repo/kernels/"
cd "$work/repo"
git init -q -b main && git add -A && git -c user.name=u -c user.email=u@example.com commit -qm init
python3 -c "while True: pass" & load=$!
for i in $(seq 1 "$N"); do
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m agent gate kernels/matmul_cpu --against HEAD --json \
    > "$work/g$i.json" 2> "$work/g$i.err" || true
  python3 - "$i" "$work/g$i.json" <<'PY'
import json, sys
i, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
a, b = d["speedup"], d["speedup_again"]
print(f"gate {i}: {d['status']}: {d['reason']} | {a['median']:.3f}x [{a['low']:.3f}, {a['high']:.3f}]"
      f" and {b['median']:.3f}x [{b['low']:.3f}, {b['high']:.3f}]")
PY
done | tee "$work/tally"
sig=$(grep -c -E "faster|slower|regression" "$work/tally" || true)
echo "$N A/A gates under load: $((N - sig)) no significant change, $sig significant"
[ "$sig" -eq 0 ]
