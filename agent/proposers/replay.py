"""Re-applies the proposals of an earlier run (on another GPU, another commit), in their order.

Each proposal is evaluated afresh by the loop: a change kept on one GPU may be rejected on another.
With `kept_only`, only the proposals that run kept are replayed. A proposals file (a JSON list of
Proposal objects, or JSON lines) works too, which is how crafted candidates (the cheats of
VERIFICATION.md) go through the real loop.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.proposal import Proposal
from agent.proposers.base import Context, ProposerExhausted
from agent.records.schema import Decision
from agent.records.store import read_iterations
from agent.records.schema import Usage


class ReplayProposer:
    can_repair = False   # a replayed proposal is what it was: a miss is recorded, the next one follows

    def __init__(self, source: Path, kept_only: bool = False):
        self.source = source
        self.proposals = load_proposals(source, kept_only)
        self.name = f"replay:{source.name}"
        self._next = 0

    def propose(self, ctx: Context) -> tuple[Proposal, Usage]:
        if self._next >= len(self.proposals):
            raise ProposerExhausted(f"replay: all {len(self.proposals)} proposals of {self.source} were replayed")
        p = self.proposals[self._next]
        self._next += 1
        return p.model_copy(), Usage()

    def skip_to(self, n: int) -> None:
        """On resume: the first n proposals were already evaluated."""
        self._next = n


def load_proposals(source: Path, kept_only: bool = False) -> list[Proposal]:
    if source.is_dir():
        recs = read_iterations(source)
        return [r.proposal for r in recs
                if r.proposal is not None and (not kept_only or r.decision == Decision.kept)]
    text = source.read_text()
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [Proposal.model_validate(x) for x in items]
