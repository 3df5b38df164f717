"""The keep rule alone: decide(attempt, rule) over a table of benches. No process, no git: the rule is a
pure function of what the stages measured, so every branch of it is tested here with exact figures."""

from __future__ import annotations

import pytest

from agent.attempt import Attempt, KeepRule, Verdict, decide
from agent.runlog import Outcome
from tools.results import BenchResult, BenchStatus, SpeedupCI

RULE = KeepRule(min_gain=0.02, implausible=10.0)


def _b(median: float, low: float, high: float) -> BenchResult:
    return BenchResult(status=BenchStatus.ok, speedup_vs_baseline=SpeedupCI(median=median, low=low, high=high, rounds=8))


def _a(bench=None, confirm=None, confirm_error=None) -> Attempt:
    return Attempt(iteration=3, run_id="r", started="t", parent_sha="p", bench=bench, confirm=confirm,
                   confirm_error=confirm_error)


NO_RATIO = BenchResult(status=BenchStatus.ok)

# (name, first bench, confirmation, confirmation error, action, outcome, reparity, reason fragment)
TABLE = [
    ("no bench at all", None, None, None, "reject", Outcome.not_faster, False, "no candidate-vs-best ratio"),
    ("a bench without a ratio", NO_RATIO, None, None, "reject", Outcome.not_faster, False, "no candidate-vs-best"),
    ("interval holds 1", _b(1.05, 0.98, 1.10), None, None, "reject", Outcome.not_faster, False, "within noise"),
    ("slower", _b(0.80, 0.75, 0.85), None, None, "reject", Outcome.not_faster, False, "slower"),
    ("faster but under the minimum gain", _b(1.01, 1.005, 1.015), None, None, "reject", Outcome.not_faster, False,
     "below the 2% minimum gain"),
    ("a real gain asks for confirmation", _b(1.30, 1.20, 1.40), None, None, "confirm", Outcome.kept, False,
     "confirm it"),
    ("an implausible gain asks for parity on fresh seeds too", _b(12.0, 11.0, 13.0), None, None, "confirm",
     Outcome.kept, True, "confirm it"),
    ("confirmed", _b(1.30, 1.20, 1.40), _b(1.25, 1.15, 1.35), None, "keep", Outcome.kept, False, "kept: 1.300x"),
    ("the second bench holds 1", _b(1.30, 1.20, 1.40), _b(1.02, 0.97, 1.08), None, "reject", Outcome.not_faster,
     False, "not confirmed by a second interleaved bench (1.020x [0.970, 1.080])"),
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
