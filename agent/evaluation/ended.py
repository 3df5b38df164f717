"""How an iteration ends: IterationEnded and its family, each carrying an outcome, a one-line reason (the proposer sees
it next time) and the failed stage's typed result."""

from __future__ import annotations

from typing import ClassVar

from agent.evaluation.attempt import Attempt
from agent.records.schema import Outcome
from tools.results import BenchResult, BuildResult, LaunchResult, ParityResult


StageResult = BuildResult | LaunchResult | ParityResult | BenchResult


class IterationEnded(Exception):
    """Ends an iteration with an outcome and a reason (the proposer sees the reason next time). A stage
    that fails carries its typed result, which goes into the Attempt's field named by `field`: the log
    shows which check rejected a candidate (its parity status, its bench message, its build log)."""
    outcome: ClassVar[Outcome] = Outcome.proposal_failed
    field: ClassVar[str | None] = None

    def __init__(self, reason: str, result: StageResult | None = None):
        super().__init__(reason)
        self.reason, self.result = reason, result

    def fill(self, a: Attempt) -> bool:
        """Put the failed stage's result into the attempt, unless the stage already did. True if it did."""
        if self.field is None or self.result is None or getattr(a, self.field) is not None:
            return False
        setattr(a, self.field, self.result)
        return True


class PatchDidNotApply(IterationEnded):
    outcome = Outcome.patch_did_not_apply


class EditOutsideEditable(IterationEnded):
    outcome = Outcome.edit_outside_editable


class NoChange(IterationEnded):
    outcome = Outcome.no_change


class CompileFailed(IterationEnded):
    field = "build"
    outcome = Outcome.compile_failed


class LaunchRejected(IterationEnded):
    field = "launch"
    outcome = Outcome.launch_rejected


class ParityFailed(IterationEnded):
    field = "parity"
    outcome = Outcome.parity_failed


class RangeParityFailed(ParityFailed):
    """Parity before a keep (the other seeds, the [dims] extremes: Evaluator.confirm_bench), run with the
    confirmation bench, failed."""


class BenchFailed(IterationEnded):
    field = "bench"
    outcome = Outcome.bench_failed


class NotFaster(IterationEnded):
    outcome = Outcome.not_faster


class Implausible(IterationEnded):
    outcome = Outcome.implausible


class Inconclusive(IterationEnded):
    outcome = Outcome.inconclusive


class TouchedCheckout(IterationEnded):
    outcome = Outcome.touched_checkout
