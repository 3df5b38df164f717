"""The replay proposer without the loop: what it reads (a run folder, a JSON list, JSON lines), the order
it gives proposals back in, resume, and the end. The loop drives it in tests/test_verification.py and
tests/test_kill_safety.py (slow); this is its fast tier."""

from __future__ import annotations

import json

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.proposers.base import ProposerExhausted
from agent.proposers.replay import ReplayProposer, load_proposals
from agent.records.schema import Decision, IterationRecord, Outcome
from agent.records.store import append_iteration


def _p(n: int) -> Proposal:
    return Proposal(hypothesis=f"move {n}", predicted=PredictedEffect(metric="t", direction="down", speedup=1.1),
                    edits=[Edit(file="k.cpp", search=f"#define X {n}", replace=f"#define X {n + 1}")])


def _rec(i: int, proposal: Proposal | None, decision: Decision, outcome: Outcome) -> IterationRecord:
    return IterationRecord(run_id="r", iteration=i, started="s", finished="f", proposal=proposal,
                           decision=decision, outcome=outcome, reason="x")


def test_a_run_folder_gives_its_proposals_in_order_and_kept_only_filters(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    append_iteration(run, _rec(1, _p(1), Decision.reverted, Outcome.not_faster))
    append_iteration(run, _rec(2, None, Decision.skipped, Outcome.proposal_failed))   # nothing to replay
    append_iteration(run, _rec(3, _p(3), Decision.kept, Outcome.kept))
    assert [p.hypothesis for p in load_proposals(run)] == ["move 1", "move 3"]
    assert [p.hypothesis for p in load_proposals(run, kept_only=True)] == ["move 3"]


@pytest.mark.parametrize("form", ["list", "lines", "single"])
def test_a_proposals_file_in_each_form(tmp_path, form):
    props = [_p(1), _p(2)] if form != "single" else [_p(1)]
    f = tmp_path / "props.json"
    dumps = [p.model_dump() for p in props]
    f.write_text({"list": json.dumps(dumps), "lines": "\n".join(json.dumps(d) for d in dumps) + "\n\n",
                  "single": json.dumps(dumps[0])}[form])
    assert load_proposals(f) == props


def test_proposals_come_back_in_order_as_copies_resume_skips_and_the_end_is_exhaustion(tmp_path):
    f = tmp_path / "props.json"
    f.write_text(json.dumps([_p(n).model_dump() for n in range(3)]))
    r = ReplayProposer(f)
    first, usage = r.propose(None)
    assert first.hypothesis == "move 0" and usage.calls == 0
    first.hypothesis = "changed by the loop"
    assert r.proposals[0].hypothesis == "move 0", "the loop gets a copy; the list stays as read"
    r.skip_to(2)   # resume: two were already evaluated
    assert r.propose(None)[0].hypothesis == "move 2"
    with pytest.raises(ProposerExhausted, match="all 3 proposals"):
        r.propose(None)


def test_a_malformed_proposals_file_is_an_error_not_an_empty_replay(tmp_path):
    f = tmp_path / "props.json"
    f.write_text('{"hypothesis": "no edits or prediction"}\n')
    with pytest.raises(ValueError):
        load_proposals(f)
