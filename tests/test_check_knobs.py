"""`agent check --knobs each|all` through the CLI on the CPU task: every other allowed knob value is
built and parity-checked, and the values that fail are reported together as a task defect. Bad values
are planted under `#if` on the knobs in a copy of the source, as in tests/test_sweep.py: a kernel
wrong only at one value passed `agent check` before, and `agent optimize` found it one iteration at
a time."""

from __future__ import annotations

import json

import pytest

from tests.test_sweep import planted_task
from tests.userrepo import agent, snapshot

VALUES = {"LOOP_ORDER": [0, 1], "BLOCK_M": [8, 16, 32], "BLOCK_N": [16], "BLOCK_K": [16, 32]}
# the committed values are LOOP_ORDER=0, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16
SEGFAULT_AT_M8 = "#if BLOCK_M == 8\n    { float* volatile p = nullptr; *p = 1.0f; }\n#endif\n"
NO_COMPILE_AT_K32 = "#if BLOCK_K == 32\n#error planted: does not compile at BLOCK_K 32\n#endif\n"
WRONG_AT_M32 = "#if BLOCK_M == 32\n    C[0] += 1.0f;\n#endif\n"


# not slow: the fast tier's one pass through agent/sweep/knobcheck.py and the batch child's --parity-only
@pytest.mark.slow        # a build and a check of every knob value: 13-16 s on 2 cores
def test_each_value_is_built_and_checked_and_the_failures_are_one_table(tmp_path):
    d = planted_task(tmp_path, VALUES, head=SEGFAULT_AT_M8 + NO_COMPILE_AT_K32, tail=WRONG_AT_M32)
    root = d.parents[1]
    before = snapshot(root)

    # without --knobs the committed values pass, and the table says what was left unchecked
    r = agent(root, "check", "kernels/matmul_cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "only the committed values checked" in r.stdout and "(4 configurations)" in r.stdout, r.stdout
    assert "every configuration (11)" in r.stdout, r.stdout

    r = agent(root, "check", "kernels/matmul_cpu", "--knobs", "each")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "building 4 configurations" in r.stderr, r.stderr
    out = " ".join(r.stdout.split())
    assert "knob values that fail" in out and "3 fail, a task defect" in out, r.stdout
    for moved, outcome in [("BLOCK_M=8", "crashed"), ("BLOCK_K=32", "compile_failed"), ("BLOCK_M=32", "parity_failed")]:
        assert any(moved in ln and outcome in ln for ln in r.stdout.splitlines()), (moved, r.stdout)
    assert "LOOP_ORDER=1" not in r.stdout   # the one honest move passed

    r = agent(root, "check", "kernels/matmul_cpu", "--knobs", "each", "--json")
    assert r.returncode == 1
    kc = json.loads(r.stdout)["knobs"]
    assert kc["which"] == "each" and kc["configurations"] == 4 and kc["passed"] == 1
    assert kc["committed"] == {"LOOP_ORDER": 0, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    got = {tuple(f["moved"].items()): f for f in kc["failures"]}
    assert set(got) == {(("BLOCK_M", 8),), (("BLOCK_K", 32),), (("BLOCK_M", 32),)}
    assert "SIGSEGV" in got[(("BLOCK_M", 8),)]["reason"]
    assert "planted" in got[(("BLOCK_K", 32),)]["reason"]
    assert "mismatch" in got[(("BLOCK_M", 32),)]["reason"]
    assert got[(("BLOCK_M", 32),)]["knobs"] == {"LOOP_ORDER": 0, "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16}
    # the user's checkout is as it was: the copies were built under runs/_build and removed
    assert snapshot(root) == before
    assert not list((root / "runs" / "_build").rglob(".knobs-*"))


@pytest.mark.slow
def test_all_finds_a_value_wrong_only_beside_another_and_passes_an_honest_task(tmp_path):
    wrong = "#if LOOP_ORDER == 1 && BLOCK_M == 8\n    C[0] += 1.0f;\n#endif\n"
    d = planted_task(tmp_path, {**VALUES, "BLOCK_M": [8, 16]}, tail=wrong)
    root = d.parents[1]
    # each moves one knob at a time: LOOP_ORDER=1 with BLOCK_M=16, BLOCK_M=8 with LOOP_ORDER=0: both right
    r = agent(root, "check", "kernels/matmul_cpu", "--knobs", "each", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    kc = json.loads(r.stdout)["knobs"]
    assert kc["configurations"] == 3 and kc["passed"] == 3 and kc["failures"] == []
    # all: the product (2 x 2 x 1 x 2 = 8, less the committed one)
    r = agent(root, "check", "kernels/matmul_cpu", "--knobs", "all", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    kc = json.loads(r.stdout)["knobs"]
    assert kc["configurations"] == 7 and kc["passed"] == 5, kc
    assert sorted(f["knobs"]["BLOCK_K"] for f in kc["failures"]) == [16, 32]
    for f in kc["failures"]:
        assert f["knobs"]["LOOP_ORDER"] == 1 and f["knobs"]["BLOCK_M"] == 8 and f["outcome"] == "parity_failed"
