"""Records that survive a kill (issue 42, first slice), through the real entry points: a last record cut short by a
kill mid-write is moved aside on `agent resume`, never appended onto, and `report`, `show` and `runs` read the run; a
damaged state.json or run.json is refused in one line naming the file, not a traceback (issue 61: the review
commands read around a damaged state, a torn or lost kept record; resume rebuilds the record, a finished run too)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from agent.records.store import read_iterations, read_state
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


def _one_iteration_run(tmp_path, proposal: dict, run_id: str):
    """A finished replay run of one iteration (the proposal's) in a new user repository: (root, run)."""
    root = make_user_repo(tmp_path / "user")
    (tmp_path / "p.json").write_text(json.dumps([proposal]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                "--iters", "1", "--target", "100x", "--run-id", run_id, "--quiet", timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    return root, root / "runs" / run_id


def test_a_damaged_state_or_config_is_refused_in_one_line_naming_the_file(tmp_path):
    root, run = _one_iteration_run(tmp_path, _comment(0), "dmg")
    for name, damage in (("state.json", '{"schema_version": '), ("state.json", '{"schema_version": 1, "status": 7}'),
                         ("run.json", "\x00\x01")):
        good = (run / name).read_bytes()
        (run / name).write_text(damage)
        for cmd in (["resume", "dmg"], ["report", "dmg"]):
            res = agent(root, *cmd, timeout=120)
            out = res.stdout + res.stderr
            assert "Traceback" not in out and f"{run / name}: the run's" in " ".join(out.split()), (name, cmd, out[-2000:])
            # a damaged state is read around by the review commands (issue 61: its figures unknown, the records
            # read); resume cannot go on without it, and no command reads a run without its run.json
            reads = cmd[0] == "report" and name == "state.json"
            assert (res.returncode == 0) == reads, (name, cmd, out[-2000:])
            if reads:
                assert "its status and figures are unknown" in " ".join(out.split()), out[-2000:]
        (run / name).write_bytes(good)


@pytest.mark.parametrize("cut", ["record", "state"])
def test_a_keep_the_kill_interrupted_after_its_commit_stays_kept_on_resume(tmp_path, cut):
    """A kill between the kept commit's amend and the state's save (the profile runs in between): the branch's tip
    is the kept commit, state.json still names its parent. `record`: its record was cut too, and is rebuilt from the
    commit's message and trailers; `state`: the record is whole and the state follows it. Either way `agent resume`
    keeps the commit on the branch as the best, the run goes on from it, and report/show/runs read the run."""
    from agent.records.store import read_config
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


def test_a_finished_runs_kept_record_torn_or_lost_is_read_around_and_rebuilt_by_resume(tmp_path):
    """Issue 61: what a power cut leaves when state.json's rename reached the disk and the record's append did not: a
    finished run (its one iteration kept, the last record) whose record is torn, then gone. report, show, runs and
    cherry-pick answer with a line saying what is missing and go on (the kept iteration shown rebuilt from its commit);
    `agent resume` rebuilds and saves the record (torn case), `agent resume --repair` too (lost case), a finished run
    with nothing to mend is refused as before."""
    from tests.userrepo import git
    root, run = _one_iteration_run(tmp_path, _faster(0), "fin")
    [kept], state = read_iterations(run), read_state(run)
    assert kept.decision.value == "kept" and state.status == "done" and state.best_iteration == 1
    whole = (run / "iterations.jsonl").read_text()

    def review(case: str) -> None:
        for cmd in (["report", "fin"], ["show", "fin"], ["show", "fin", "--iter", "1"], ["runs"]):
            res = agent(root, *cmd, timeout=120)
            out = " ".join((res.stdout + res.stderr).split())
            assert res.returncode == 0 and "Traceback" not in out, (case, cmd, out[-2000:])
            assert "iteration 1 has no record" in out and "shown rebuilt from its kept commit" in out, (case, cmd, out)
        res = agent(root, "show", "fin", "--json", timeout=120)
        data = json.loads(res.stdout)
        assert [it["commit"] for it in data["iterations"]] == [kept.commit_sha], (case, data["iterations"])
        assert any("iteration 1 has no record" in n for n in data["notes"]), (case, data["notes"])
        assert "Not read" in (run / "report.md").read_text() and "| 1 | `" in (run / "report.md").read_text()
        git(root, "branch", f"pick-{case}", "main")
        res = agent(root, "cherry-pick", "fin", "--onto", f"pick-{case}", timeout=120)
        assert res.returncode == 0, (case, (res.stdout + res.stderr)[-2000:])
        assert "#define LOOP_ORDER 1" in git(root, "show", f"pick-{case}:kernels/matmul_cpu/matmul.cpp")

    def rebuilt(out: str) -> None:
        assert "iteration 1 was kept" in out and "its record was missing: rebuilt" in out, out[-2000:]
        [rec] = read_iterations(run)
        assert rec.decision.value == "kept" and rec.commit_sha == kept.commit_sha and "rebuilt by a repair" in rec.reason
        assert rec.proposal.hypothesis == kept.proposal.hypothesis and "LOOP_ORDER 1" in rec.patch
        # the iteration's result files: the same bench as the lost record's, not only the commit message's figures
        assert rec.bench is not None and rec.bench.speedup_vs_baseline.median == kept.bench.speedup_vs_baseline.median
        assert abs(rec.speedup_vs_best - kept.speedup_vs_best) < 1e-3 and read_state(run) == state
        for cmd in (["report", "fin"], ["show", "fin"]):   # whole again: nothing to say
            res = agent(root, *cmd, timeout=120)
            assert res.returncode == 0 and "note" not in res.stderr, (cmd, res.stderr[-2000:])

    (run / "iterations.jsonl").write_text(whole[:len(whole) // 2])   # torn: the first half, no newline
    review("torn")
    res = agent(root, "resume", "fin", timeout=600)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0 and "the last record was cut short" in out and "nothing to resume" in out, out[-2000:]
    assert (run / "iterations.jsonl.torn-1").read_text() == whole[:len(whole) // 2]
    rebuilt(out)

    (run / "iterations.jsonl").write_text("")   # lost: the append never reached the disk
    review("lost")
    res = agent(root, "resume", "fin", "--repair", timeout=600)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-2000:]
    rebuilt(out)
    res = agent(root, "resume", "fin", timeout=120)   # nothing left to mend: a finished run, as before
    assert res.returncode == 2 and "is finished" in res.stdout + res.stderr, (res.stdout + res.stderr)[-2000:]

    # the state damaged and the kept record lost with it: the best is the run branch's tip, its keep shown rebuilt
    saved = (run / "state.json").read_bytes()
    (run / "state.json").write_text('{"schema_version": 1, "status": "do')
    (run / "iterations.jsonl").write_text("")
    res = agent(root, "show", "fin", "--json", timeout=120)
    data = json.loads(res.stdout)
    assert [it["commit"] for it in data["iterations"]] == [kept.commit_sha], data
    assert any("the best is taken from the run's branch" in n for n in data["notes"]), data["notes"]
    (run / "state.json").write_bytes(saved)

    # unreadable (a folder where the file was): every command says so in one line, none ends in a traceback
    (run / "iterations.jsonl").unlink()
    (run / "iterations.jsonl").mkdir()
    for cmd in (["resume", "fin"], ["resume", "fin", "--repair"], ["report", "fin"], ["show", "fin"], ["runs"]):
        res = agent(root, *cmd, timeout=120)
        out = " ".join((res.stdout + res.stderr).split())
        assert "Traceback" not in out and "iterations.jsonl: cannot be read" in out, (cmd, out[-2000:])
        assert res.returncode == (2 if cmd[0] == "resume" else 0), (cmd, res.returncode, out[-2000:])
