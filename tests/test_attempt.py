"""The keep rule alone: decide(attempt, rule) over a table of benches. No process, no git: the rule is a
pure function of what the stages measured, so every branch of it is tested here with exact figures."""

from __future__ import annotations

import pytest

from agent.evaluation.attempt import REBENCH_CONFIDENCE, Attempt, KeepRule, Verdict, decide
from agent.records.schema import Outcome
from tools.results import BenchResult, BenchStatus, SpeedupCI

RULE = KeepRule(min_gain=0.02, implausible=10.0)


def _b(median: float, low: float, high: float) -> BenchResult:
    return BenchResult(status=BenchStatus.ok, seconds=1.0,
                       speedup_vs_baseline=SpeedupCI(median=median, low=low, high=high, rounds=8))


def _a(bench=None, confirm=None, confirm_error=None) -> Attempt:
    return Attempt(iteration=3, run_id="r", started="t", parent_sha="p", bench=bench, confirm=confirm,
                   confirm_error=confirm_error)


NO_RATIO = BenchResult(status=BenchStatus.ok)

# (name, first bench, confirmation, confirmation error, action, outcome, reparity, reason fragment)
TABLE = [
    ("no bench at all", None, None, None, "reject", Outcome.not_faster, False, "no candidate-vs-best ratio"),
    ("a bench without a ratio", NO_RATIO, None, None, "reject", Outcome.not_faster, False, "no candidate-vs-best"),
    ("interval holds 1, the median short of the gain", _b(1.01, 0.96, 1.10), None, None, "reject", Outcome.not_faster,
     False, "within noise"),
    ("interval holds 1, the median past the gain: doubt", _b(1.05, 0.98, 1.10), None, None, "rebench", Outcome.kept,
     False, "doubtful, bench it again with 16 rounds"),
    ("slower", _b(0.80, 0.75, 0.85), None, None, "reject", Outcome.not_faster, False, "slower"),
    ("faster but under the minimum gain", _b(1.01, 1.005, 1.015), None, None, "reject", Outcome.not_faster, False,
     "below the 2% minimum gain"),
    ("a real gain asks for confirmation", _b(1.30, 1.20, 1.40), None, None, "confirm", Outcome.kept, False,
     "confirm it"),
    ("an implausible gain asks for parity on fresh seeds too", _b(12.0, 11.0, 13.0), None, None, "confirm",
     Outcome.kept, True, "confirm it"),
    ("confirmed", _b(1.30, 1.20, 1.40), _b(1.25, 1.15, 1.35), None, "keep", Outcome.kept, False, "kept: 1.300x"),
    ("the second bench holds 1, its median short of the gain", _b(1.30, 1.20, 1.40), _b(1.01, 0.97, 1.08), None,
     "reject", Outcome.not_faster, False, "not confirmed by a second interleaved bench (1.010x [0.970, 1.080] in 8 rounds at 95%)"),
    ("the second bench holds 1, its median past the gain: doubt", _b(1.134, 1.076, 1.161), _b(1.114, 0.916, 1.374),
     None, "rebench", Outcome.kept, False, "1.114x [0.916, 1.374] in 8 rounds at 95%: doubtful, bench it again with 16 rounds"),
    ("both above 1 but together under the minimum gain", _b(1.021, 1.001, 1.04), _b(1.005, 1.001, 1.01), None,
     "reject", Outcome.not_faster, False, "not confirmed by a second"),
    ("the second bench has no ratio", _b(1.30, 1.20, 1.40), NO_RATIO, None, "reject", Outcome.not_faster, False,
     "(no ratio)"),
    ("the confirmation failed to run", _b(1.30, 1.20, 1.40), None, "bench crashed: SIGSEGV", "reject",
     Outcome.not_faster, False, "the 1.300x gain was not confirmed: bench crashed: SIGSEGV"),
    ("an implausible gain whose re-check failed", _b(12.0, 11.0, 13.0), None, "parity mismatch", "reject",
     Outcome.implausible, False, "did not survive re-verification: parity mismatch"),
    ("an implausible gain that does not come back", _b(40.0, 35.0, 45.0), _b(3.0, 2.5, 3.5), None, "reject",
     Outcome.implausible, False, "was not reproduced on re-verification"),
    ("an implausible gain that comes back within 2x", _b(12.0, 11.0, 13.0), _b(7.0, 6.0, 8.0), None, "keep",
     Outcome.kept, False, "kept: 12.000x"),
    ("an implausible gain beyond 2x but with overlapping intervals", _b(10.9, 5.5, 12.0), _b(5.0, 2.8, 10.0), None,
     "keep", Outcome.kept, False, "kept"),
    ("a plausible gain need not come back within 2x", _b(9.0, 8.0, 10.0), _b(3.0, 2.5, 3.5), None, "keep",
     Outcome.kept, False, "kept"),
]


@pytest.mark.parametrize("name,bench,confirm,error,action,outcome,reparity,fragment", TABLE, ids=[t[0] for t in TABLE])
def test_keep_rule(name, bench, confirm, error, action, outcome, reparity, fragment):
    v = decide(_a(bench, confirm, error), RULE)
    assert isinstance(v, Verdict)
    assert (v.action, v.outcome, v.reparity) == (action, outcome, reparity), v.reason
    assert fragment in v.reason, v.reason
    first = bench.speedup_vs_baseline if bench is not None else None
    assert v.speedup == (first.median if first is not None else None)


def _r(median: float, low: float, high: float, rounds: int, seconds: float = 1.0) -> BenchResult:
    """A re-bench: more rounds, its interval at 99%."""
    return BenchResult(status=BenchStatus.ok, seconds=seconds, speedup_vs_baseline=SpeedupCI(
        median=median, low=low, high=high, rounds=rounds, confidence=REBENCH_CONFIDENCE))


def test_a_doubtful_bench_is_rebenched_until_it_decides_or_its_rebenches_are_spent():
    """Issue 63's honest 1.13x change on a loaded 2-core machine: its confirmation straddled 1 and the change was
    thrown away as "not faster". Now the doubt is benched again with 2x then 4x the rounds at 99%; a re-bench that
    decides, decides (either way); two that do not leave it inconclusive, its own outcome with every interval."""
    first, doubt = _b(1.134, 1.076, 1.161), _b(1.114, 0.916, 1.374)
    a = _a(first, _r(1.13, 1.05, 1.21, 16))
    a.confirm_undecided = [doubt]
    v = decide(a, RULE)
    assert (v.action, v.outcome) == ("keep", Outcome.kept), v.reason
    a.confirm = _r(1.10, 0.97, 1.25, 16)
    v = decide(a, RULE)
    assert (v.action, v.stage, v.rounds, v.confidence) == ("rebench", "confirm", 32, REBENCH_CONFIDENCE)
    assert "1.114x [0.916, 1.374] in 8 rounds at 95%, then 1.100x [0.970, 1.250] in 16 rounds at 99%" in v.reason
    a.confirm_undecided.append(a.confirm)
    a.confirm = _r(1.09, 0.99, 1.20, 32)
    v = decide(a, RULE)
    assert (v.action, v.outcome) == ("reject", Outcome.inconclusive), v.reason
    assert "then 1.090x [0.990, 1.200] in 32 rounds at 99%" in v.reason and "not called slower" in v.reason
    a.confirm = _r(1.005, 0.98, 1.03, 32)    # the longer bench decides there is no gain worth keeping
    v = decide(a, RULE)
    assert (v.action, v.outcome) == ("reject", Outcome.not_faster), v.reason

    b = _a(_b(1.25, 0.95, 1.5))              # the first bench doubtful: its re-bench decides
    b.bench_undecided, b.bench = [b.bench], _r(1.2, 1.1, 1.3, 16)
    assert decide(b, RULE).action == "confirm"
    b.bench = _r(0.99, 0.95, 1.03, 16)
    v = decide(b, RULE)
    assert (v.outcome, v.action) == (Outcome.not_faster, "reject") and "in 16 rounds at 99%: within noise" in v.reason


def test_the_rebench_budget_is_in_seconds_of_the_doubtful_bench():
    """Each re-bench is projected at twice the last one's seconds; the re-benches of one bench stop where they would
    pass REBENCH_SPEND times the doubtful bench's own (a bench that turned slow under load is not timed on and on)."""
    a = _a(_b(1.25, 0.95, 1.5))
    a.bench.seconds = 2.0
    a.bench_undecided, a.bench = [a.bench], _r(1.2, 0.9, 1.4, 16, seconds=4.0)
    assert decide(a, RULE).action == "rebench"            # 4 s spent + 8 s projected <= 10 x 2 s
    a.bench.seconds = 7.0
    v = decide(a, RULE)                                    # 7 + 14 > 20: spent
    assert v.outcome == Outcome.inconclusive and "1 longer bench (7.0 s" in v.reason, v.reason


def test_the_minimum_gain_and_the_implausible_bound_come_from_the_rule():
    a = _a(_b(1.04, 1.03, 1.05))
    assert decide(a, KeepRule(min_gain=0.02)).action == "confirm"
    assert decide(a, KeepRule(min_gain=0.05)).reason.endswith("below the 5% minimum gain")
    big = _a(_b(6.0, 5.5, 6.5))
    assert not decide(big, KeepRule(implausible=10.0)).reparity
    assert decide(big, KeepRule(implausible=5.0)).reparity


def test_decide_reads_and_never_changes_the_attempt():
    a = _a(_b(1.30, 1.20, 1.40), _b(1.25, 1.15, 1.35))
    before = a.model_dump()
    assert decide(a, RULE) == decide(a, RULE)
    assert a.model_dump() == before


def test_the_confirmation_is_sized_to_the_noise_the_first_bench_measured():
    """Issue 66: a clear gain is confirmed in 6 rounds, not the task's 10; a gain near its noise gets up to twice the
    task's at once (not a doubtful confirmation and then a re-bench of twice as many); a task asking fewer than 6
    rounds, no ratio or no gain keeps the task's."""
    from agent.evaluation.attempt import CONFIRM_MIN_ROUNDS, confirm_rounds

    def ci(median, low, rounds=10):
        return SpeedupCI(median=median, low=low, high=2 * median - low, rounds=rounds)
    assert confirm_rounds(ci(1.30, 1.28), 10) == CONFIRM_MIN_ROUNDS == 6        # spread 0.02 far from 1: 6
    assert confirm_rounds(ci(1.15, 1.10), 10) == 6                              # 10 * (2 * 0.05 / 0.15)^2 = 4.4
    assert confirm_rounds(ci(1.12, 1.07), 10) == 7                              # 10 * (2 * 0.05 / 0.12)^2 = 6.9
    assert confirm_rounds(ci(1.14, 1.04), 10) == 20                             # near its noise: twice the task's
    assert confirm_rounds(ci(1.30, 1.28), 4) == 4 and confirm_rounds(None, 10) == 10
    assert confirm_rounds(ci(0.99, 0.95), 10) == 10
    # a first bench re-benched to 40 rounds (doubtful at 10): near its noise, confirmed in the task's 10 at least
    assert confirm_rounds(ci(1.068, 1.055, rounds=40), 10) == 10 and confirm_rounds(ci(1.068, 1.055), 10) == 6


def test_a_rebenched_gain_the_confirmation_refuses_says_its_rebench():
    """A no-op on a loaded machine (.ci/run at e4b26f5, tests/test_keep_rule.py): its first bench doubtful, re-benched
    at 99% to 1.025x [1.002, 1.067], then refused by the confirmation. The reason gives the first bench's whole trail
    (each re-bench's rounds and coverage), not its last figure alone: what the user reads says it was re-benched."""
    a = _a(bench=_b(1.025, 1.002, 1.067).model_copy(update={"speedup_vs_baseline": SpeedupCI(
        median=1.025, low=1.002, high=1.067, rounds=20, confidence=0.99)}), confirm=_b(1.009, 0.968, 1.029))
    a.bench_undecided = [_b(1.03, 0.99, 1.08)]
    v = decide(a, KeepRule(min_gain=0.02))
    assert v.action == "reject" and v.outcome == Outcome.not_faster
    assert v.reason.startswith("the first bench's gain (1.030x [0.990, 1.080], then 1.025x [1.002, 1.067] in 20 rounds "
                               "at 99%) was not confirmed by a second interleaved bench (1.009x [0.968, 1.029]"), v.reason
