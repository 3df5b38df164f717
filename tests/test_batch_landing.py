"""A batch's results as they land (issue 66): `agent sweep` reported a chunk of configurations when its batch child
ended, minutes of silence on a big space. The child appends each result line to a progress file of the parent's as it
writes it; the parent hands each to the caller then, while the child goes on."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tools.judge.batch import evaluate


@pytest.mark.slow
def test_a_result_lands_while_a_later_library_of_the_same_child_still_runs(tmp_path):
    task, honest = make_task(tmp_path, "correct", rounds=3)
    hang = compile_lib(source("hang"), tmp_path / "libhang.so")
    landed: list[tuple[float, int, str]] = []
    limit = 6.0
    t0 = time.monotonic()
    rows = []
    for settled in evaluate(task, [honest, hang], honest, batch=2, limit_s=limit,
                            landed=lambda i, r: landed.append((time.monotonic() - t0, i, r.status.value))):
        rows += [(i, r.status.value) for i, r in settled]
    ended = time.monotonic() - t0
    assert sorted(rows) == [(0, "ok"), (1, "timeout")], rows
    # both were handed over as they landed: the honest one before the hang's watchdog ended the child
    assert [(i, s) for _, i, s in landed] == [(0, "ok"), (1, "timeout")], landed
    assert landed[0][0] < ended - limit / 2, (landed, ended)


def test_a_listener_gets_each_result_once_and_a_batch_without_one_is_the_same(tmp_path):
    """`agent check --knobs` asks for no landing; a sweep does: the same results either way, each landed once."""
    task, honest = make_task(tmp_path, "correct", rounds=3)
    rows = [(i, r.status.value) for settled in evaluate(task, [honest], honest, batch=1, parity_only=True)
            for i, r in settled]
    assert rows == [(0, "ok")]
    got: list[int] = []
    rows = [(i, r.status.value) for settled in evaluate(task, [honest], honest, batch=1, parity_only=True,
                                                         landed=lambda i, r: got.append(i)) for i, r in settled]
    assert rows == [(0, "ok")] and got == [0]
