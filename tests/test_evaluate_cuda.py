"""The loop's evaluation pipeline on the CUDA tasks: compile-only (static launch check) on CI, the
real loop for two iterations on a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.evaluation.attempt import Attempt
from agent.evaluation.ended import LaunchRejected
from agent.evaluation.evaluate import Evaluator
from agent.records.schema import Decision, Outcome, StageTimes
from agent.records.store import read_config, read_iterations, read_state
from tests.userrepo import REPO, agent, git
from tools.backends.device import device_limits
from tools.results import BenchStatus, LaunchStatus, ParityStatus
from tools.task import load_task

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
@pytest.mark.nvcc
def test_static_launch_check_through_the_evaluator(tmp_path):
    task = load_task(REPO / "kernels" / "attention_fwd")
    ev = Evaluator(task, tmp_path / "build", device_limits("sm_90"))
    times = StageTimes()
    b = ev.build(times)
    res = ev.launch(b, None, times)
    assert res.status == LaunchStatus.ok and res.main_ctas == 2048   # 32*8*512/64 query tiles
    # a parent with 8x the CTAs (the rule: below 0.25 x the parent): this candidate collapsed the grid
    parent = res.model_copy(update={"main_ctas": 8 * 2048,
                                    "launches": [l.model_copy(update={"grid": (8 * 2048, 1, 1)}) for l in res.launches]})
    with pytest.raises(LaunchRejected, match="collapse|CTA"):
        ev.launch(b, parent, times)
    # the loop's path: the same check inside the one evaluate child, before anything runs
    att = Attempt(iteration=1, run_id="r", started="t", parent_sha="p")
    t2 = StageTimes()
    with pytest.raises(LaunchRejected, match="collapse|CTA"):
        ev.evaluate_candidate(Path(b.lib_path), None, t2, into=att, launch_context=ev.launch_context(b, parent))
    assert att.launch.status == LaunchStatus.rejected and att.launch.main_ctas == 2048
    assert att.parity is None and t2.launch > 0


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_two_iterations_on_softmax(tmp_path):
    root = tmp_path / "user"
    shutil.copytree(REPO / "kernels" / "softmax", root / "kernels" / "softmax")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    res = agent(root, "optimize", "kernels/softmax", "--iters", "2", "--target", "100x", "--quiet", "--run-id", "g")
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_iterations(root / "runs" / "g")
    state = read_state(root / "runs" / "g")
    assert len(recs) == 2 and state.status == "done"
    assert all(r.launch is None or r.launch.status.value in ("ok", "rejected") for r in recs)
    # each iteration ended with a verdict of its own (agent/optimize/loop.py): an outcome and a decision that agree, and the
    # reason given; none interrupted or cut by a budget in a run that finished
    assert [(r.run_id, r.iteration) for r in recs] == [("g", 1), ("g", 2)]
    for r in recs:
        assert isinstance(r.outcome, Outcome) and isinstance(r.decision, Decision) and r.reason, r
        assert r.outcome not in (Outcome.interrupted, Outcome.budget_exhausted), (r.outcome, r.reason)
        assert (r.decision == Decision.kept) == (r.outcome == Outcome.kept), (r.decision, r.outcome, r.reason)
        if r.outcome == Outcome.parity_failed:
            assert r.parity is not None and r.parity.status != ParityStatus.ok, r.reason
        if r.decision == Decision.reverted:   # a commit that was evaluated: kept for review, off the branch
            assert r.rejected_ref, r.reason
    # a kept one passed every check it met and was faster twice (the bench and the confirmation); the last kept is the
    # run's best
    kept = [r for r in recs if r.decision == Decision.kept]
    for r in kept:
        assert r.parity is not None and r.parity.status == ParityStatus.ok, (r.iteration, r.parity)
        assert r.launch is not None and r.launch.status == LaunchStatus.ok, (r.iteration, r.launch)
        assert r.bench is not None and r.bench.status == BenchStatus.ok, (r.iteration, r.bench)
        assert r.confirm is not None and r.confirm.status == BenchStatus.ok, (r.iteration, r.confirm)
        assert r.commit_sha and r.speedup_vs_best is not None and r.speedup_vs_best > 1.0, (r.iteration, r.reason)
    assert state.best_iteration == (kept[-1].iteration if kept else None), (state.best_iteration, kept)
    if kept:
        assert state.best_sha == kept[-1].commit_sha == git(root, "rev-parse", read_config(root / "runs" / "g").branch)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_a_slower_candidate_is_profiled_when_asked_and_its_figures_reach_the_next_prompt(tmp_path):
    """Issue 63: a model told only that a candidate was slower guessed why. With --profile-rejected (a model's
    default) the rejected candidate gets its own Nsight Compute profile: achieved occupancy and SOL in its record and
    on its history line; without it, nothing is profiled."""
    import json

    from agent.llm.context import format_history_item
    from agent.proposal import Edit, PredictedEffect, Proposal
    from agent.optimize.propose import history_item
    root = tmp_path / "user"
    shutil.copytree(REPO / "kernels" / "softmax", root / "kernels" / "softmax")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    anchor = "    const int gl = threadIdx.x % GROUP;\n"
    slow = Proposal(hypothesis="a dependent chain of 4000 FMAs a thread before the row: slower on purpose",
                    predicted=PredictedEffect(metric="t", direction="up", speedup=0.5),
                    edits=[Edit(file="softmax.cu", search=anchor, replace=anchor + (
                        "    { float z = threadIdx.x; for (int k = 0; k < 4000; ++k) z = z * 0.999f + 1e-3f;\n"
                        "      if (z == -1.f) y[0] = __float2half(z); }\n"))])
    (tmp_path / "p.json").write_text(json.dumps([slow.model_dump()]))
    for run, flag in (("on", "--profile-rejected"), ("off", "--no-profile-rejected")):
        res = agent(root, "optimize", "kernels/softmax", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                    "--iters", "1", "--target", "100x", "--quiet", "--run-id", run, flag)
        assert res.returncode == 0, res.stderr[-3000:]
        [r] = read_iterations(root / "runs" / run)
        assert r.outcome == Outcome.not_faster and r.speedup_vs_best < 1.0, (r.outcome, r.reason)
        if run == "off":
            assert r.profile_summary is None and not (root / "runs" / run / "iter-1" / "profile.json").exists()
            continue
        p = r.profile_summary
        assert p is not None and p["source"] == "ncu" and p["occupancy_achieved_pct"] > 0, p
        assert (root / "runs" / run / "iter-1" / "profile.json").exists() and r.times.profile > 0
        line = format_history_item(history_item(r))
        assert "its own profile: softmax_kernel" in line and "achieved occupancy" in line, line
