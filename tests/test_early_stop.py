"""The loop's candidate bench stops after half its rounds where every round so far found it short of the minimum
gain (issue 44's cost of a rejected candidate: tools/measure/rounds.py EarlyStop and
interleaved), and where every one found the gain (issue 66: the confirmation decides that keep). Both directions: a
candidate whose first half has rounds on both sides of the gain is timed to the end, one short in all of them or past it
in all of them stops, and no bench outside the loop (no minimum gain given) ever stops."""

from __future__ import annotations

import random
import types

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tools.measure.rounds import EarlyStop, SpotCheck, interleaved, look_round


class ScriptedClock:
    """Each arm's rep takes what its function answers for the rep's round (its offset // reps)."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def rep_cost(self, fn) -> float:
        return 1.0

    def run(self, fn, n: int, offset: int = 0, before=None) -> list[float]:
        self.calls.append((offset, n))
        return [fn(offset + i) for i in range(n)]


def _arms(ratio_by_round, n_reps=100):
    """Two arms: the candidate at 1 ms, the baseline at ratio ms in each round (the ratio is baseline/candidate)."""
    return [("candidate", lambda i: 1.0),
            ("baseline", lambda i: ratio_by_round[min(i // n_reps, len(ratio_by_round) - 1)])]


def _bench(rounds: int):
    return types.SimpleNamespace(rounds=rounds, warmup_ms=1.0, rep_ms=100.0, confidence=0.95)


def test_a_candidate_short_of_the_gain_in_every_round_of_the_first_half_stops_there():
    early = EarlyStop(0.02, 10)
    got, cis = interleaved(ScriptedClock(), _arms([0.9] * 10), _bench(10), stop=early)
    assert look_round(10) == 5 and cis["baseline"].rounds == 5 and len(got["candidate"]) == 5 * 100
    assert cis["baseline"].high < 1.0 and "timed 5 of 10 rounds" in early.why and "2% minimum gain" in early.why
    # at the gain's edge (1.01x in every round) it stops too: no round reached 1.02
    early = EarlyStop(0.02, 10)
    _, cis = interleaved(ScriptedClock(), _arms([1.01] * 10), _bench(10), stop=early)
    assert cis["baseline"].rounds == 5 and early.why


def test_a_candidate_whose_first_half_straddles_the_gain_is_timed_to_the_end():
    for ratios in ([1.0, 1.0, 1.03, 1.0, 1.0] + [1.0] * 5, [0.9] * 4 + [1.2] * 6, [1.3] * 4 + [1.01] + [1.3] * 5,
                   [1.02] * 10):
        early = EarlyStop(0.02, 10)
        got, cis = interleaved(ScriptedClock(), _arms(ratios), _bench(10), stop=early)
        assert cis["baseline"].rounds == 10 and len(got["candidate"]) == 10 * 100 and early.why == "", ratios


def test_a_candidate_above_the_gain_in_every_round_of_the_first_half_goes_on_to_its_confirmation_there():
    """Issue 66: the first bench only sends a candidate on (the confirmation keeps it); a clear gain stops at half."""
    for ratios in ([1.3] * 10, [1.021] * 5 + [0.5] * 5):
        early = EarlyStop(0.02, 10)
        got, cis = interleaved(ScriptedClock(), _arms(ratios), _bench(10), stop=early)
        assert cis["baseline"].rounds == 5 and len(got["candidate"]) == 5 * 100, ratios
        assert cis["baseline"].low > 1.02 and "timed 5 of 10 rounds: every round so far above the 2% minimum gain" \
            in early.why, early.why


def test_no_stop_without_a_minimum_gain_with_too_few_rounds_or_with_one_arm():
    _, cis = interleaved(ScriptedClock(), _arms([0.5] * 10), _bench(10))        # no stop given: agent check, the gate
    assert cis["baseline"].rounds == 10
    assert look_round(3) is None and look_round(4) == 3 and look_round(6) == 3
    early = EarlyStop(0.02, 3)
    _, cis = interleaved(ScriptedClock(), _arms([0.5] * 3), _bench(3), stop=early)
    assert cis["baseline"].rounds == 3 and early.why == ""
    clock = ScriptedClock()   # one arm (the candidate alone): nothing to compare, every round timed
    got, cis = interleaved(clock, [("candidate", lambda i: 1.0)], _bench(10), stop=EarlyStop(0.02, 10))
    assert cis == {} and len(clock.calls) == 1 + 10     # the warm-up, then every round


class _NeverDrawn(random.Random):
    def random(self) -> float:
        return 1.0      # the spot check's draw never falls: only a forced check runs


def test_the_spot_check_is_forced_by_the_look_round_so_a_stopped_bench_still_checked_one_output(tmp_path):
    """A bench that may stop after round 5 has checked the candidate's outputs by then (before, the check was forced
    only in the last round, which a stopped bench never times): outputs left wrong are seen at round 5, not before."""
    task, _ = make_task(tmp_path, "correct", rounds=10)
    mod, shape = task.module(), {"M": 16, "N": 12, "K": 8}
    sets = [mod.make_inputs(shape, s, "cpu", task.spec.distributions[0]) for s in (1, 2)]
    outs = [mod.empty_output(shape, *s).fill_(7.0) for s in sets]   # what a kernel that wrote nothing leaves
    runs = types.SimpleNamespace(refreshed=lambda *a: None, fetch_outs=lambda outs: None)
    spot = SpotCheck(task, mod, runs, shape, sets, outs, 10, _NeverDrawn(0))
    spot.look = 5
    spot.seeds = {("candidate", r): 0 for r in range(10)}
    for r in range(4):
        spot.after("candidate", r, r * 2, [1.0, 1.0])
    assert spot.checked == 0 and spot.why is None
    spot.after("candidate", 4, 8, [1.0, 1.0])
    assert spot.checked == 1 and spot.why is not None and "timed round 5 of 10" in spot.why


def test_the_loops_slower_candidate_and_a_clear_gain_stop_at_half_and_the_bench_outside_the_loop_does_not(tmp_path):
    """Through the judge and its host (run_candidate, the loop's check): a kernel doing its work eight times against
    the honest one, with a 50% minimum gain, stops after 5 of 10 rounds and says so; the honest kernel against it
    (about 8x) stops there too, sent on to its confirmation (issue 66); the slow one with no minimum gain (agent check's bench) all 10 too. Ratios of 8x
    either way: a loaded machine's noise does not reach across the gain."""
    from tools.judge.candidate import run_candidate
    from tools.measure.bench import run_bench
    task, honest = make_task(tmp_path, "correct", rounds=10)
    shape = {"M": 48, "N": 40, "K": 32}
    slow = compile_lib(source("correct").replace('extern "C" void matmul(', "static void once(") + r'''
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    for (int r = 0; r < 8; ++r) { once(A, B, C, M, N, K); asm volatile("" ::: "memory"); }
}
''', tmp_path / "libslow.so")
    _, par, [res], _ = run_candidate(task, slow, honest, shapes=[shape], parity_extent="quick", keep_gain=0.5)
    assert par.status.value == "ok" and res.status.value == "ok", (par.message, res.message)
    assert res.speedup_vs_baseline.rounds == 5 and "timed 5 of 10 rounds" in res.message, res.message
    # the honest one against it: every round of the first half above the gain, sent on to a confirmation at 5
    _, par, [res], _ = run_candidate(task, honest, slow, shapes=[shape], parity_extent="quick", keep_gain=0.5)
    assert res.status.value == "ok" and res.speedup_vs_baseline.rounds == 5 and res.speedup_vs_baseline.low > 1.5 \
        and "timed 5 of 10 rounds: every round so far above the 50% minimum gain" in res.message, res.message
    [res] = run_bench(task, slow, baseline_lib=honest, with_reference=False, shapes=[shape])
    assert res.status.value == "ok" and res.speedup_vs_baseline.rounds == 10, res.message
