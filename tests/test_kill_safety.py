"""Repository safety: kill the agent (SIGINT like Ctrl-C, and SIGKILL) at each stage in turn -
propose/patch, build, parity, bench, keep - in one run, resuming after each kill. After every kill the
user's checkout is untouched and the run's branch is at its best commit (SIGKILL: or at the one
candidate under evaluation, which `agent resume` moves aside); `agent resume` finishes the run.

Stages are found from the run's artifacts (runs/RUN/iter-N/): proposal.json after propose, patch.diff
after the commit (the build starts), build.log after the build (parity starts), parity.json after
parity (bench starts). The keep stage is held open by a post-commit hook in the user's repository
(git runs it for the keep's amend even with --no-verify) that sleeps once when armed: a slow user hook
is a real situation, and it makes the kill land inside the keep deterministically.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.records.schema import Decision
from agent.records.store import read_config, read_iterations, read_state
from tests.userrepo import REPO, agent, git, make_user_repo, snapshot

pytestmark = pytest.mark.slow

STAGES = ["propose", "build", "check+bench", "confirm", "keep"]
ARTIFACT = {"propose": "proposal.json", "build": "patch.diff", "check+bench": "build.log", "confirm": "bench.json"}

HOOK = """#!/bin/sh
# armed by the test: hold the keep's amend open once (the subject of a kept commit is "agent: ...")
subject=$(git log -1 --format=%s)
case "$subject" in
  "agent: iteration "*|"agent (rejected)"*) exit 0 ;;
  "agent: "*) if [ -f "{arm}" ]; then rm -f "{arm}"; touch "{reached}"; sleep 4; fi ;;
esac
exit 0
"""


def _faster(n: int) -> dict:
    return Proposal(hypothesis=f"i-k-j loop order ({n})", predicted=PredictedEffect(metric="t", direction="down",
                    speedup=3.0), edits=[Edit(file="matmul.cpp", search="#define LOOP_ORDER 0",
                                              replace="#define LOOP_ORDER 1")]).model_dump()


def _comment(n: int) -> dict:
    return Proposal(hypothesis=f"a comment ({n})", predicted=PredictedEffect(metric="t", direction="down", speedup=1.0),
                    edits=[Edit(file="matmul.cpp", search="#include <cstddef>",
                                replace=f"#include <cstddef>\n// note {n}")]).model_dump()


def _start(root: Path, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for k in ("AGENT_BASE_URL", "AGENT_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_API_KEY"):
        env.pop(k, None)
    with open(log, "a") as f:
        return subprocess.Popen([sys.executable, "-m", "agent", *args, "--quiet"], cwd=root, env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_stage(proc: subprocess.Popen, run: Path, iteration: int, stage: str, since: float, marker: Path,
                timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stage == "keep":
            if marker.exists():
                return
        else:
            f = run / f"iter-{iteration}" / ARTIFACT[stage]
            if f.exists() and f.stat().st_mtime >= since:
                return
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before stage {stage} of iteration {iteration}"
        time.sleep(0.02)
    pytest.fail(f"stage {stage} of iteration {iteration} never came")


def _gone(listing, timeout: float = 30, every: float = 0.1) -> list:
    """What `listing()` still names once it names nothing, polled every `every` s, or at the deadline: a child that a
    kill reached is gone within moments, one that outlived it never is (a fixed sleep is both slow and flaky)."""
    deadline = time.monotonic() + timeout
    while (left := listing()) and time.monotonic() < deadline:
        time.sleep(every)
    return left


def _orphans(tag: str) -> list[str]:
    """Live processes whose command line names this test's temp dir, or whose working directory is in
    it (a child that outlived the agent; a judge forked from the fork server has the server's command
    line, and its scratch directory for a working directory)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(p / "cwd")
                if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            except OSError:
                continue
            if tag in cmd or cwd.startswith(tag):
                out.append(f"{p.name}: {cmd[:160]} (in {cwd})")
    return out


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_kill_at_each_stage_then_resume(tmp_path, sig):
    root = make_user_repo(tmp_path / "user")
    arm, reached = tmp_path / "arm-keep", tmp_path / "keep-reached"
    hook = root / ".git" / "hooks" / "post-commit"
    hook.write_text(HOOK.format(arm=arm, reached=reached))
    hook.chmod(hook.stat().st_mode | stat.S_IEXEC)
    before = snapshot(root)
    # SIGINT: each interrupted iteration is recorded, undecided, and `agent resume` evaluates its
    # candidate again first, so iteration k meets the k-th kill and every one of 1-5 is the faster loop
    # order; SIGKILL: iteration 1 is never recorded and is tried again after each kill. Either way the
    # replay's next proposal (the comment) comes only after the faster loop order was decided.
    props = [_faster(0), _comment(0)]
    (tmp_path / "p.json").write_text(json.dumps(props))
    iters = 6 if sig == "SIGINT" else 2
    run = root / "runs" / "kills"
    log = tmp_path / "agent.log"
    signum = getattr(signal, sig)
    seen = []
    for k, stage in enumerate(STAGES):
        iteration = k + 1 if sig == "SIGINT" else 1
        since = time.time() - 0.01
        if stage == "keep":
            arm.touch()
        args = (["optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                 "--iters", str(iters), "--target", "100x", "--run-id", "kills"] if k == 0 else ["resume", "kills"])
        proc = _start(root, args, log)
        _wait_stage(proc, run, iteration, stage, since, reached)
        os.killpg(proc.pid, signum)   # the whole foreground group, as a terminal's Ctrl-C does
        rc = proc.wait(timeout=120)
        cfg, state, recs = read_config(run), read_state(run), read_iterations(run)
        branch = git(root, "rev-parse", cfg.branch)
        # the user's checkout, branch, index and uncommitted work: untouched, whatever the stage
        assert snapshot(root) == before, f"{sig} at {stage}"
        if sig == "SIGINT":
            assert rc == 130, log.read_text()[-2000:]
            assert state.status == "interrupted", f"{stage}: {state.status}"
            last = recs[-1]
            assert last.iteration == iteration
            # Ctrl-C during a keep waits until the kept record is written; anywhere else it reverts
            assert last.decision == (Decision.kept if stage == "keep" else Decision.interrupted), (stage, last.reason)
            assert branch == state.best_sha, f"SIGINT at {stage}: branch {branch} != best {state.best_sha}"
            assert git(Path(cfg.worktree), "status", "--porcelain") == ""
        else:
            assert rc == -signal.SIGKILL
            assert recs == [] and state.status == "running", f"SIGKILL at {stage} wrote a record"
            # the branch is at the best, or at the one candidate under evaluation (on top of the best)
            if branch != state.best_sha:
                assert git(root, "rev-parse", f"{branch}~1") == state.best_sha, f"SIGKILL at {stage}"
            assert _gone(lambda: _orphans(str(tmp_path))) == [], "a child outlived the killed agent"
        seen.append((stage, rc, branch[:10], [r.decision.value for r in recs]))
    assert reached.exists(), "the keep-stage kill never happened inside the keep"

    res = agent(root, "resume", "kills", "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-2000:]
    cfg, state, recs = read_config(run), read_state(run), read_iterations(run)
    assert [r.iteration for r in recs] == list(range(1, iters + 1)), seen
    assert state.status == "done"
    kept = [r for r in recs if r.decision == Decision.kept]
    assert len(kept) == 1, [(r.iteration, r.decision.value, r.reason) for r in recs]
    assert kept[0].iteration == (5 if sig == "SIGINT" else 1)
    assert git(root, "rev-parse", cfg.branch) == state.best_sha == kept[0].commit_sha
    assert git(root, "log", "--format=%H", f"{cfg.base_sha}..{cfg.branch}").split() == [kept[0].commit_sha]
    assert git(Path(cfg.worktree), "status", "--porcelain") == ""
    assert snapshot(root) == before
    # the resumed run's best library is the kept commit's: the last iteration (a comment on top of it)
    # measures as no faster than it, not as a 3x speedup over a stale library
    last = recs[-1]
    assert last.bench is not None and last.bench.speedup_vs_baseline.median < 1.5, last.reason
    if sig == "SIGINT":    # each interrupted candidate came back as the next iteration, marked as a retry
        for a, b in zip(recs, recs[1:]):
            if a.decision == Decision.interrupted:
                assert b.proposal.edits == a.proposal.edits and f"retry of iteration {a.iteration}" in b.proposal.proposer
        assert recs[-1].proposal.hypothesis == "a comment (0)"
    if sig == "SIGKILL":   # the candidates killed mid-evaluation stay reviewable
        refs = git(root, "for-each-ref", "--format=%(refname)", f"refs/agent/{cfg.run_id}/interrupted")
        assert refs, "a killed candidate was not kept under refs/agent/RUN/interrupted/N"


def test_resume_removes_the_git_locks_a_kill_left_and_refuses_a_second_agent(tmp_path):
    """A SIGKILL inside a git command leaves its lock file (the worktree's index.lock, the branch's ref
    lock), and every later git command in the run's worktree would fail on it. `agent resume` removes the
    run's own stale locks, never the user's (their checkout's index.lock is theirs: their git may be
    running), and a second agent on a run that is still held is refused rather than racing the first."""
    import fcntl

    root = make_user_repo(tmp_path / "user")
    props = [_comment(0), _comment(1)]
    (tmp_path / "p.json").write_text(json.dumps(props))
    run = root / "runs" / "locks"
    log = tmp_path / "agent.log"
    proc = _start(root, ["optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay",
                         str(tmp_path / "p.json"), "--iters", "2", "--target", "100x", "--run-id", "locks"], log)
    _wait_stage(proc, run, 1, "propose", time.time() - 60, tmp_path / "unused")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    cfg = read_config(run)
    wt_git = Path(git(Path(cfg.worktree), "rev-parse", "--absolute-git-dir"))
    stale = [wt_git / "index.lock", root / ".git" / "refs" / "heads" / f"{cfg.branch}.lock"]
    users = root / ".git" / "index.lock"
    for f in [*stale, users]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    git_entries = sorted(p.name for p in (root / ".git").iterdir())

    # a second agent while the run is held: refused with the holder named, nothing touched
    with open(run / "agent.lock", "a+") as held:
        # the killed agent is reaped, but a child it was starting may hold a copy of the lock's descriptor until its
        # exec closes it: the fork server is started in a session of its own (setsid before exec), so the group's
        # SIGKILL misses it in that window (.ci/run at 70ebeae: BlockingIOError here, once in 7 full runs): wait, bounded
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        res = agent(root, "resume", "locks", timeout=120)
    assert res.returncode != 0
    assert "in use by another agent process" in res.stderr + res.stdout, res.stderr[-2000:]
    assert all(f.exists() for f in stale) and read_state(run).status == "running"

    res = agent(root, "resume", "locks", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    out = res.stdout + res.stderr
    for f in stale:
        assert not f.exists() and f"removed {f}" in out, out[-2000:]
    assert users.exists(), "the user's own index.lock was removed"
    assert sorted(p.name for p in (root / ".git").iterdir()) == git_entries
    state, recs = read_state(run), read_iterations(run)
    assert state.status == "done" and [r.iteration for r in recs] == [1, 2]
