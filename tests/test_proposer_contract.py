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
from agent.proposers.llm import LLMProposer, LLMUnusable
from agent.proposers.replay import ReplayProposer
from agent.runlog import Usage
from agent.settings import LLMSettings
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
    return [HeuristicProposer(task), LLMProposer(llm, task), ReplayProposer(props)]


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
