"""The optimization loop on the CPU task, end to end: real git, real compiler, real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.records.schema import Decision, Outcome
from agent.records.store import read_config, read_iterations, read_state
from tests.userrepo import REPO, agent, git, make_user_repo, snapshot

pytestmark = pytest.mark.slow


def _only_run(root: Path) -> Path:
    runs = [p for p in (root / "runs").iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def test_five_iterations_keep_and_revert_without_touching_the_user(tmp_path):
    root = make_user_repo(tmp_path / "user")
    before = snapshot(root)
    res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "100x", "--iters", "5", "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    run = _only_run(root)
    cfg, state, recs = read_config(run), read_state(run), read_iterations(run)
    assert len(recs) == 5 and [r.iteration for r in recs] == [1, 2, 3, 4, 5]
    assert state.status == "done" and "5 iterations" in state.stop_reason
    kept = [r for r in recs if r.decision == Decision.kept]
    rejected = [r for r in recs if r.decision == Decision.reverted]
    assert kept, "LOOP_ORDER 0->1 is several times faster: it must be kept"
    assert rejected, "some knob moves are not faster and must be reverted"
    # the branch holds exactly the kept commits, each with trailers and measured results
    log = git(root, "log", "--format=%H", f"{cfg.base_sha}..{cfg.branch}").split()
    assert set(log) == {r.commit_sha for r in kept}
    for r in kept:
        msg = git(root, "log", "-1", "--format=%B", r.commit_sha)
        assert f"Agent-Run: {cfg.run_id}" in msg and f"Agent-Iteration: {r.iteration}" in msg
        assert "Speedup: " in msg and "% CI" in msg
    assert git(root, "rev-parse", cfg.branch) == state.best_sha
    # rejected commits stay reviewable under refs/agent/RUN/rejected/N
    for r in rejected:
        assert r.rejected_ref == f"refs/agent/{cfg.run_id}/rejected/{r.iteration}"
        assert git(root, "rev-parse", r.rejected_ref) == r.commit_sha
        assert "Rejected: " in git(root, "log", "-1", "--format=%B", r.commit_sha)
    # every record carries the stages it ran and a reason
    for r in recs:
        assert r.reason and r.proposal is not None and r.proposal.hypothesis
        if r.decision in (Decision.kept, Decision.reverted) and r.outcome in (Outcome.kept, Outcome.not_faster):
            assert r.build.status.value == "ok" and r.parity.status.value == "ok" and r.bench.speedup_vs_baseline
    # the user's checkout, index, branch and uncommitted work are as they were
    assert snapshot(root) == before
    assert (root / "scratch.txt").read_text() == "untracked notes\n"
    # the heuristic never measured one configuration twice (initial included)
    configs = [tuple(sorted(r.proposal.knobs.items())) for r in recs]
    assert len(set(configs)) == len(configs)
    assert tuple(sorted(state.initial_knobs.items())) not in configs


def test_sigkill_mid_iteration_then_resume_finishes(tmp_path):
    root = make_user_repo(tmp_path / "user")
    before = snapshot(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "agent", "optimize", "kernels/matmul_cpu", "--target", "100x",
                             "--iters", "4", "--quiet", "--run-id", "killme"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run = root / "runs" / "killme"
    deadline = time.monotonic() + 300
    # wait until iteration 2 is under way (its folder exists, one record written), then kill -9
    while time.monotonic() < deadline:
        if (run / "iter-2").exists() and len(read_iterations(run)) == 1:
            break
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    else:
        pytest.fail("iteration 2 never started")
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # an iteration of this task takes about half a second now (the judge is forked warm): the kill lands
    # inside iteration 2 or, on a fast machine, a later one; inside one, whichever (its folder, no record)
    done = len(read_iterations(run))
    assert 1 <= done <= 3 and (run / f"iter-{done + 1}").exists(), done
    assert read_state(run).status == "running"
    res = agent(root, "resume", "killme", "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    recs, state, cfg = read_iterations(run), read_state(run), read_config(run)
    assert [r.iteration for r in recs] == [1, 2, 3, 4]
    assert state.status == "done"
    # the branch is at a kept commit (or the start), and the worktree has nothing uncommitted
    assert git(root, "rev-parse", cfg.branch) == state.best_sha
    kept = {r.commit_sha for r in recs if r.decision == Decision.kept} | {cfg.base_sha}
    assert state.best_sha in kept
    assert git(Path(cfg.worktree), "status", "--porcelain") == ""
    assert snapshot(root) == before


def _noop_proposals(path: Path, n: int) -> None:
    """Candidates that change the source but not the code's speed: a comment each."""
    props = []
    for i in range(n):
        props.append(Proposal(hypothesis=f"A comment changes nothing ({i})",
                              predicted=PredictedEffect(metric="time.median_ms", direction="down", speedup=1.0),
                              edits=[Edit(file="matmul.cpp", search="#include <cstddef>",
                                          replace=f"#include <cstddef>\n// no-op {i}")]).model_dump())
    path.write_text(json.dumps(props))


def test_twenty_no_op_candidates_are_never_kept(tmp_path):
    root = make_user_repo(tmp_path / "user")
    props = tmp_path / "noop.json"
    _noop_proposals(props, 20)
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props),
                "--target", "100x", "--iters", "20", "--quiet", timeout=1500)
    assert res.returncode == 0, res.stderr + res.stdout
    recs = read_iterations(_only_run(root))
    assert len(recs) == 20
    assert [r for r in recs if r.decision == Decision.kept] == []
    # each was built, passed parity and was timed: rejected by the statistics, not by a shortcut (inconclusive: doubt
    # its re-benches did not settle, agent/evaluation/attempt.py: not kept either)
    fair = (Outcome.not_faster, Outcome.inconclusive)
    assert all(r.outcome in fair and r.bench is not None for r in recs), \
        [(r.iteration, r.outcome.value, r.reason) for r in recs if r.outcome not in fair or r.bench is None]


def _fast_then_slow_source() -> str:
    """matmul.cpp with LOOP_ORDER 1 (genuinely faster) that, in any process but the one that checks it
    first (parity and bench share the judge's host; the confirmation bench has a host of its own), does
    its work 20 times: a gain that one bench sees and the next does not, as a transient on a shared
    machine makes it. The hosts are the same program, so it tells them apart by its first call: parity
    starts on the first listed shape, a bench on the main one (the order of requests is what still
    tells hosts apart: VERIFICATION.md). It leaves load.txt in each host's scratch directory, which
    the record lists per process."""
    src = (REPO / "kernels" / "matmul_cpu" / "matmul.cpp").read_text().replace("#define LOOP_ORDER 0",
                                                                              "#define LOOP_ORDER 1")
    counter_code = """#include <cstdio>
static int g_load = 0;
static void which_process(int M, int N, int K) {
    g_load = (M == 64 && N == 64 && K == 64) ? 1 : 2;   // parity's first shape: the checked host
    if (FILE* f = std::fopen("load.txt", "w")) { std::fprintf(f, "%d", g_load); std::fclose(f); }
}
"""
    src = src.replace("#include <cstddef>\n", "#include <cstddef>\n" + counter_code, 1)
    head, body = src.split("                       int M, int N, int K) {\n", 1)
    body = body.rstrip()
    assert body.endswith("}")
    return (head + "                       int M, int N, int K) {\n" + "  if (!g_load) which_process(M, N, K);\n"
            + "  for (int rep = 0; rep < (g_load >= 2 ? 20 : 1); ++rep) {\n" + body[:-1] + "  }\n}\n")


def test_a_gain_the_confirmation_bench_does_not_see_is_not_kept(tmp_path):
    root = make_user_repo(tmp_path / "user", scan_allow=True)   # its kernel keeps state and writes a file
    # the kernel tells its hosts apart by a file it writes: allowed by name (issue 39: else side_effect)
    toml = root / "kernels" / "matmul_cpu" / "task.toml"
    text = toml.read_text()
    assert text.count("[parity]\n") == 1
    toml.write_text(text.replace("[parity]\n", '[parity]\nallow_files = { "load.txt" = "the test kernel tells its hosts apart" }\n'))
    git(root, "commit", "-qam", "user: the test kernel may write load.txt")
    before = snapshot(root)
    flaky = Proposal(hypothesis="i-k-j order, fast only in the first bench",
                     predicted=PredictedEffect(metric="time.median_ms", direction="down", speedup=2.0),
                     edits=[Edit(file="matmul.cpp", content=_fast_then_slow_source())])
    real = Proposal(hypothesis="i-k-j order reads B along rows",
                    predicted=PredictedEffect(metric="time.median_ms", direction="down", speedup=2.0),
                    edits=[Edit(file="matmul.cpp", search="#define LOOP_ORDER 0", replace="#define LOOP_ORDER 1")])
    props = tmp_path / "props.json"
    props.write_text(json.dumps([flaky.model_dump(), real.model_dump()]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props),
                "--target", "100x", "--iters", "2", "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    run = _only_run(root)
    first, second = read_iterations(run)
    # parity + bench in the judge's host, the range shapes' parity and the confirmation in another: each left
    # its load.txt in its scratch dir
    loads = sorted(f.process for f in first.scratch_files if f.path == "load.txt")
    assert loads == ["host", "host"], first.scratch_files
    # the first bench saw the gain, the confirmation did not: reverted, both benches in the record
    assert first.bench.speedup_vs_baseline.low > 1.0
    assert first.confirm is not None and first.confirm.speedup_vs_baseline.median < 1.0
    assert first.decision == Decision.reverted and first.outcome == Outcome.not_faster
    assert "not confirmed" in first.reason
    assert (run / "iter-1" / "confirm-bench.json").exists()
    # the same move without the trick is confirmed and kept; the commit says so
    assert second.decision == Decision.kept
    assert second.confirm is not None and second.confirm.speedup_vs_baseline.low > 1.0
    # its rounds sized to the first bench's noise (issue 66), said in the commit
    from agent.evaluation.attempt import confirm_rounds
    rounds = confirm_rounds(second.bench.speedup_vs_baseline, 8)      # matmul_cpu's task.toml: 8 rounds
    assert second.confirm.speedup_vs_baseline.rounds == rounds, (second.bench.speedup_vs_baseline, rounds)
    msg = git(root, "log", "-1", "--format=%B", second.commit_sha)
    assert "confirmed by a second bench" in msg and f"{rounds} rounds: sized to the first's noise" in msg, msg
    assert snapshot(root) == before


def test_edit_outside_editable_and_empty_change_are_skipped(tmp_path):
    root = make_user_repo(tmp_path / "user")
    (root / "kernels" / "matmul_cpu" / "task.py").read_text()
    props = [
        Proposal(hypothesis="touch the reference", predicted=PredictedEffect(metric="t", direction="down", speedup=2),
                 edits=[Edit(file="task.py", search="def reference", replace="def reference")]).model_dump(),
        Proposal(hypothesis="same text", predicted=PredictedEffect(metric="t", direction="down", speedup=2),
                 edits=[Edit(file="matmul.cpp", search="#define BLOCK_M 16", replace="#define BLOCK_M 16")]).model_dump(),
        Proposal(hypothesis="does not apply", predicted=PredictedEffect(metric="t", direction="down", speedup=2),
                 edits=[Edit(file="matmul.cpp", search="no such line", replace="x")]).model_dump(),
    ]
    (tmp_path / "p.json").write_text(json.dumps(props))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                "--target", "100x", "--iters", "5", "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    run = _only_run(root)
    recs = read_iterations(run)
    assert [r.outcome for r in recs] == [Outcome.edit_outside_editable, Outcome.no_change,
                                         Outcome.patch_did_not_apply]
    assert all(r.decision == Decision.skipped and r.commit_sha is None for r in recs)
    assert "replayed" in read_state(run).stop_reason
    cfg = read_config(run)
    assert git(root, "rev-parse", cfg.branch) == cfg.base_sha


def test_bad_target_and_missing_task_are_one_line_errors(tmp_path):
    root = make_user_repo(tmp_path / "user")
    res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "fast")
    assert res.returncode == 2 and "--target 'fast'" in res.stderr and "Traceback" not in res.stderr
    res = agent(root, "optimize", "kernels/nope")
    assert res.returncode == 2 and "Traceback" not in res.stderr
