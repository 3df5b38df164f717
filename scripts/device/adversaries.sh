#!/usr/bin/env bash
# Issue 40's whole CUDA adversarial set through the real loop, on a GPU machine, from the repository root:
#
#   bash scripts/device/adversaries.sh            # about 10 minutes on an H200
#
# softmax: every case of scripts/device/verify_gpu.py (tests/fixtures/cuda_cheats/softmax/ and the faults), then
# attention: every file of tests/fixtures/cuda_cheats/attention/ (scripts/device/verify_attention.py), each set
# with its honest faster moves last (they must be kept). Each script writes its JSON under $OUT and ends with a
# summary line; this exits non-zero when either set has a candidate that did not end as expected (a cheat kept or
# an honest move refused). Where one call cannot run 10 minutes (the lent device tool), pass the names to each
# script in parts: `python scripts/device/verify_gpu.py NAME ...`, `python scripts/device/verify_attention.py NAME ...`.
set -u
cd "$(dirname "$0")/../.."
rc=0
python3 scripts/device/verify_gpu.py || rc=1
LOOP_S=${LOOP_S:-1200} python3 scripts/device/verify_attention.py || rc=1
exit $rc
