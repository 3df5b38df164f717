"""On resume, the candidate that an interrupt left undecided is evaluated again before anything new.

A Ctrl-C reverts the candidate under evaluation and records it as `interrupted`: nothing was decided
about it, so it may well be the run's winning move (a Ctrl-C during its confirmation bench, say).
`RetryFirst` serves that proposal once more, marked as a retry and at no cost, then hands over to the
run's own proposer. A retry is not counted as one of the proposer's proposals when a replay resumes.
"""

from __future__ import annotations

from agent.proposal import Proposal
from agent.proposers.base import Context, Proposer
from agent.records.schema import Decision, IterationRecord, Usage

RETRY_MARK = "retry of iteration"


def is_retry(p: Proposal) -> bool:
    return RETRY_MARK in p.proposer


def undecided(records: list[IterationRecord]) -> IterationRecord | None:
    """The last record, where an interrupt left its candidate undecided (and its proposal is known)."""
    last = records[-1] if records else None
    if last is not None and last.decision == Decision.interrupted and last.proposal is not None:
        return last
    return None


class RetryFirst:
    def __init__(self, inner: Proposer, record: IterationRecord):
        self.inner, self.name, self.can_repair = inner, inner.name, inner.can_repair
        first = record.proposal.proposer.split(f" ({RETRY_MARK}")[0] or inner.name
        self.pending: Proposal | None = record.proposal.model_copy(
            update={"proposer": f"{first} ({RETRY_MARK} {record.iteration}, interrupted before a decision)"})

    def propose(self, ctx: Context) -> tuple[Proposal, Usage]:
        if self.pending is not None:
            p, self.pending = self.pending, None
            return p, Usage()
        return self.inner.propose(ctx)

    def skip_to(self, n: int) -> None:
        self.inner.skip_to(n)
