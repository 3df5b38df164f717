#!/usr/bin/env bash
# Issue 62: the shipped softmax's ONLINE 1 as it was before (one pass for the max and the sum, an element of -inf not
# skipped while the max is still -inf: exp(-inf + inf) is NaN) fails `agent check` on parity's value draws (rows that
# begin with -inf, task.toml's [[inputs]] specials); ONLINE 1 as fixed passes. On a GPU machine, from the repository
# root (about a minute on an H200); the outputs under $OUT. Exits 0 when both went as expected.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
src=kernels/softmax/softmax.cu
cp "$src" "$out/softmax.cu.orig"
trap 'cp "$out/softmax.cu.orig" "$src"' EXIT
python3 -c "import sys; sys.path.insert(0, 'scripts/device'); import verify_gpu as v; t = v._online_unguarded(); \
assert 'ONLINE 1 ' in t and 'else s += __expf(v - m);' in t; open('$src', 'w').write(t)" || exit 2
python3 -m agent check kernels/softmax > "$out/online_unguarded.txt" 2>&1; a=$?
sed 's/#define ONLINE 0 /#define ONLINE 1 /' "$out/softmax.cu.orig" > "$src"
python3 -m agent check kernels/softmax > "$out/online_fixed.txt" 2>&1; b=$?
grep -h -E "parity |bad task" "$out/online_unguarded.txt" "$out/online_fixed.txt" | cut -c1-300
grep -q "values:specials" "$out/online_unguarded.txt" || { echo "the unguarded form did not fail on the value draws"; a=0; }
echo "ONLINE 1 unguarded: agent check exit $a (expected non-zero); ONLINE 1 fixed: exit $b (expected 0)"
[ "$a" -ne 0 ] && [ "$b" -eq 0 ]
