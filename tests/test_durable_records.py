"""Records that survive a kill (issue 42, first slice), through the real entry points: a last record cut short by a
kill mid-write is moved aside on `agent resume`, never appended onto, and `report`, `show` and `runs` read the run; a
damaged state.json or run.json is refused in one line naming the file, not a traceback."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from agent.runlog import read_iterations, read_state
from tests.test_kill_safety import _comment, _faster, _start, _wait_stage
from tests.userrepo import agent, make_user_repo


pytestmark = pytest.mark.slow   # two agent runs each (~20-25 s): the full suite, not the fast tier


def _killed_in_second_iteration(tmp_path, run_id: str):
    """A replay run (a faster kernel kept, then two no-op comments) SIGKILLed as iteration 2 proposes: (root, run)."""
    root = make_user_repo(tmp_path / "user")
    (tmp_path / "p.json").write_text(json.dumps([_faster(0), _comment(1), _comment(2)]))
    run = root / "runs" / run_id
    proc = _start(root, ["optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                         "--iters", "3", "--target", "100x", "--run-id", run_id], tmp_path / "agent.log")
    _wait_stage(proc, run, 2, "propose", time.time() - 60, tmp_path / "unused")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    return root, run


def test_a_torn_last_record_is_moved_aside_on_resume_and_the_run_reads_whole(tmp_path):
    root, run = _killed_in_second_iteration(tmp_path, "torn")
    [kept] = read_iterations(run)
    assert kept.decision.value == "kept"
    # what a kill during the write of iteration 2's record leaves: the first half of a line, no newline
    half = kept.model_copy(update={"iteration": 2}).model_dump_json()
    with open(run / "iterations.jsonl", "a") as f:
        f.write(half[:len(half) // 2])
    res = agent(root, "resume", "torn", timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "the last record was cut short by the kill" in out and "iterations.jsonl.torn-1" in out, out[-2000:]
    assert (run / "iterations.jsonl.torn-1").read_text() == half[:len(half) // 2]
    lines = (run / "iterations.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)               # every line whole: nothing joined onto the torn one
    assert [r.iteration for r in read_iterations(run)] == [1, 2, 3] and read_state(run).status == "done"
    for cmd in (["report", "torn"], ["show", "torn", "--iter", "1"], ["runs"]):
        res = agent(root, *cmd, timeout=120)
        assert res.returncode == 0, (cmd, (res.stdout + res.stderr)[-2000:])


def test_a_damaged_state_or_config_is_refused_in_one_line_naming_the_file(tmp_path):
    root = make_user_repo(tmp_path / "user")
    (tmp_path / "p.json").write_text(json.dumps([_comment(0)]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                "--iters", "1", "--target", "100x", "--run-id", "dmg", "--quiet", timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    run = root / "runs" / "dmg"
    for name, damage in (("state.json", '{"schema_version": '), ("state.json", '{"schema_version": 1, "status": 7}'),
                         ("run.json", "\x00\x01")):
        good = (run / name).read_bytes()
        (run / name).write_text(damage)
        for cmd in (["resume", "dmg"], ["report", "dmg"]):
            res = agent(root, *cmd, timeout=120)
            out = res.stdout + res.stderr
            assert res.returncode != 0 and "Traceback" not in out, (name, cmd, out[-2000:])
            assert f"{run / name}: the run's" in " ".join(out.split()), (name, cmd, out[-2000:])
        (run / name).write_bytes(good)


@pytest.mark.parametrize("cut", ["record", "state"])
def test_a_keep_the_kill_interrupted_after_its_commit_stays_kept_on_resume(tmp_path, cut):
    """A kill between the kept commit's amend and the state's save (the profile runs in between): the branch's tip
    is the kept commit, state.json still names its parent. `record`: its record was cut too, and is rebuilt from the
    commit's message and trailers; `state`: the record is whole and the state follows it. Either way `agent resume`
    keeps the commit on the branch as the best, the run goes on from it, and report/show/runs read the run."""
    from agent.runlog import read_config
    from tests.userrepo import git
    root, run = _killed_in_second_iteration(tmp_path, "keep")
    [kept] = read_iterations(run)
    cfg, state = read_config(run), read_state(run)
    assert kept.decision.value == "kept" and state.best_sha == kept.commit_sha
    # what a kill before the state's save leaves: the kept commit at the branch's tip (the kill here may have come
    # after iteration 2 committed its candidate: set back), the state of before the keep, the record cut (or whole)
    for lock in (root / ".git").rglob("*.lock"):   # a git command the kill cut leaves its lock (resume clears them too)
        lock.unlink()
    git(Path(cfg.worktree), "reset", "-q", "--hard", kept.commit_sha)
    before = state.model_copy(update={"best_sha": kept.parent_sha, "best_iteration": None, "iterations_done": 0,
                                      "chain_vs_initial": None, "best_ms": state.initial_ms, "confirmed_sha": None})
    (run / "state.json").write_text(before.model_dump_json())
    if cut == "record":
        line = (run / "iterations.jsonl").read_text()
        (run / "iterations.jsonl").write_text(line[:len(line) // 3])
    res = agent(root, "resume", "keep", timeout=600)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-3000:]
    assert ("but the kill cut its record: rebuilt from the commit's message" if cut == "record" else
            "was kept and recorded, but the kill came before the run's state was saved") in out, out[-2000:]
    recs = read_iterations(run)
    assert [r.iteration for r in recs] == [1, 2, 3] and read_state(run).status == "done"
    first = recs[0]
    assert first.decision.value == "kept" and first.commit_sha == kept.commit_sha
    assert abs(first.speedup_vs_best - kept.speedup_vs_best) < 1e-3 and first.best_ms is not None
    if cut == "record":
        assert "rebuilt on resume" in first.reason and first.proposal.hypothesis == kept.proposal.hypothesis
        assert first.patch.strip() and first.proposal.edits[0].file == "matmul.cpp"
    # the kept commit is still on the run's branch, under the iterations after it
    assert git(root, "merge-base", "--is-ancestor", kept.commit_sha, cfg.branch) == ""
    end = read_state(run)   # the comments after it are no faster: the rebuilt keep is still the best
    assert end.best_iteration == 1 and end.best_sha == kept.commit_sha and end.chain_vs_initial is not None
    for cmd in (["report", "keep"], ["show", "keep", "--iter", "1"], ["runs"]):
        res = agent(root, *cmd, timeout=120)
        assert res.returncode == 0, (cmd, (res.stdout + res.stderr)[-2000:])
