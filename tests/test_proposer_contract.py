"""The proposer contract (agent/proposers/base.py), which the loop relies on without probing: every
shipped proposer has every member of the Protocol, and every way out of propose() says what it cost
and whether the run ends."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from agent.proposers import base
from agent.proposers.base import BudgetExhausted, ProposalFailed, ProposerError, ProposerExhausted
from agent.proposers.heuristic import HeuristicProposer
from agent.llm.proposer import LLMProposer, LLMUnusable
from agent.proposers.replay import ReplayProposer
from agent.proposal import Edit, PredictedEffect, Proposal
from agent.proposers.retry import RetryFirst, is_retry, undecided
from agent.records.schema import Decision, IterationRecord, Outcome, Usage
from agent.llm.settings import LLMSettings
from tools.task import load_task

ROOT = Path(__file__).resolve().parent.parent

MEMBERS = ("name", "can_repair", "propose", "skip_to")


def test_the_protocol_is_what_the_loop_uses():
    declared = {n for n in vars(base.Proposer) if not n.startswith("_")} | set(base.Proposer.__annotations__)
    assert declared == set(MEMBERS)


def _proposers(tmp_path):
    """One of each shipped proposer, made as the session makes them (no call is made here)."""
    task = load_task(ROOT / "kernels" / "matmul_cpu")
    props = tmp_path / "props.json"
    props.write_text("[]")
    llm = LLMSettings(model="m", base_url="http://127.0.0.1:9/v1", api_key="k")
    heur = HeuristicProposer(task)
    return [heur, LLMProposer(llm, task), ReplayProposer(props), RetryFirst(heur, _interrupted(heur))]


def test_every_shipped_proposer_has_every_member(tmp_path):
    for p in _proposers(tmp_path):
        missing = [m for m in MEMBERS if not hasattr(p, m)]
        assert missing == [], f"{type(p).__name__} lacks {missing}"
        assert isinstance(p.name, str) and p.name and isinstance(p.can_repair, bool)
        assert list(inspect.signature(p.skip_to).parameters) == ["n"]
        assert list(inspect.signature(p.propose).parameters) == ["ctx"]
        p.skip_to(0)


@pytest.mark.parametrize("exc,ends", [(ProposalFailed, False), (LLMUnusable, True), (ProposerExhausted, True),
                                      (BudgetExhausted, True)], ids=lambda x: getattr(x, "__name__", str(x)))
def test_every_way_out_carries_its_cost_and_says_whether_the_run_ends(exc, ends):
    e = exc("why", Usage(calls=2, prompt_tokens=10))
    assert isinstance(e, ProposerError) and e.ends_run is ends and str(e) == "why"
    assert e.usage.calls == 2
    assert exc("free").usage == Usage(), "a way out without calls cost nothing, not None"


def _interrupted(inner, decision=Decision.interrupted, proposal=True) -> IterationRecord:
    p = Proposal(hypothesis="LOOP_ORDER 0->1: rows", predicted=PredictedEffect(metric="t", direction="down", speedup=2),
                 edits=[Edit(file="matmul.cpp", search="#define LOOP_ORDER 0", replace="#define LOOP_ORDER 1")],
                 proposer=inner.name)
    return IterationRecord(run_id="r", iteration=3, started="t", finished="t", parent_sha="p", decision=decision,
                           outcome=Outcome.interrupted, reason="interrupted", proposal=p if proposal else None)


def test_an_undecided_candidate_is_served_again_once_at_no_cost_then_the_proposer_goes_on(tmp_path):
    task = load_task(ROOT / "kernels" / "matmul_cpu")
    heur = HeuristicProposer(task)
    rec = _interrupted(heur)
    assert undecided([_interrupted(heur, Decision.kept), rec]) is rec
    assert undecided([rec, _interrupted(heur, Decision.reverted)]) is None     # only the last record counts
    assert undecided([_interrupted(heur, proposal=False)]) is None            # nothing to retry
    r = RetryFirst(heur, rec)
    ctx = base.Context(task=task, iteration=4, sources={f: task.path(f).read_text() for f in task.spec.editable},
                       profile=None, knobs=task.read_knobs(),
                       measured_knobs=[{k: v for k, v in task.read_knobs().items() if v is not None}])
    first, cost = r.propose(ctx)
    assert first.edits == rec.proposal.edits and cost == Usage() and is_retry(first)
    assert first.proposer == "heuristic (retry of iteration 3, interrupted before a decision)"
    again = RetryFirst(heur, rec.model_copy(update={"proposal": first, "iteration": 4}))   # a retry interrupted
    assert again.propose(ctx)[0].proposer == "heuristic (retry of iteration 4, interrupted before a decision)"
    second, _ = r.propose(ctx)
    assert not is_retry(second) and second.proposer != first.proposer    # the heuristic's own next move
