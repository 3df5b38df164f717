"""Reading a run's records around damage (issue 61), without a run: a damaged line in the middle and a torn last one
are left out and said, a line each, by the review commands' reader; the loop's own reader still refuses the damaged
one; `agent resume --repair`'s set_aside_damaged moves it aside, synced, and the file reads whole again."""

from __future__ import annotations

import json

import pytest

from agent.records.recover import set_aside_damaged
from agent.records.schema import Decision, IterationRecord, Outcome
from agent.records.store import LogError, read_iterations


def _rec(i: int) -> str:
    return IterationRecord(run_id="r", iteration=i, started="t", finished="t", decision=Decision.reverted,
                           outcome=Outcome.not_faster, reason=f"iteration {i}").model_dump_json()


def test_a_damaged_middle_line_and_a_torn_last_one_are_left_out_and_said(tmp_path):
    bad = '{"schema_version": 1, "run_id": "r", "iteration": 2, "decision": "kept"}'   # whole JSON, not a record
    (tmp_path / "iterations.jsonl").write_text("\n".join([_rec(1), "\x00garbage", bad, _rec(4), _rec(5)[:40]]))
    notes: list[str] = []
    assert [r.iteration for r in read_iterations(tmp_path, notes)] == [1, 4]
    assert len(notes) == 3 and ":2: a damaged record" in notes[0] and ":3: a record that does not match" in notes[1]
    assert ":5: the last record is cut short" in notes[2], notes
    with pytest.raises(LogError, match=":2: not valid JSON"):   # the loop's reader: never goes on past damage
        read_iterations(tmp_path)

    (tmp_path / "iterations.jsonl").write_text("\n".join([_rec(1), "\x00garbage", bad, _rec(4)]) + "\n")
    aside, lines = set_aside_damaged(tmp_path)
    assert lines == [2, 3] and aside.name == "iterations.jsonl.damaged-1"
    assert aside.read_text().splitlines() == ["\x00garbage", bad]
    assert [r.iteration for r in read_iterations(tmp_path)] == [1, 4]
    assert set_aside_damaged(tmp_path) is None        # whole now: nothing moved, no second file


def test_records_are_read_in_iteration_order(tmp_path):
    """A record rebuilt after later ones were written (agent resume --repair appends it) reads in its place."""
    (tmp_path / "iterations.jsonl").write_text("\n".join([_rec(1), _rec(3), _rec(2)]) + "\n")
    assert [r.iteration for r in read_iterations(tmp_path)] == [1, 2, 3]
    assert json.loads((tmp_path / "iterations.jsonl").read_text().splitlines()[1])["iteration"] == 3
