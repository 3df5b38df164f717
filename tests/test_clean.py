"""agent clean, on real runs of the real loop in a real git repository (no git is mocked).

Three runs are made once in one user repository: r1 (the heuristic, two iterations; whether it keeps
something is up to the measurements, and the tests follow its state.json), r2 (two replayed candidates
that do not compile: it keeps nothing, and its branch stays at the commit it started from) and r3 (one
such candidate, then marked "running" as a killed run leaves it). The tests run in file order: the
read-only and refusing cases first, then the cleaning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.records.store import read_state
from tests.userrepo import agent, git, make_user_repo, snapshot

# the module's fixture makes three runs of the loop (14-15 s on 2 cores): every test here drives runs, as slow tests do
pytestmark = pytest.mark.slow

TASK = "kernels/matmul_cpu"


def broken(n: int) -> dict:
    """A candidate that fails to compile: rejected, deterministically, with a ref under refs/agent/RUN/rejected/."""
    return Proposal(hypothesis=f"does not compile ({n})",
                    predicted=PredictedEffect(metric="t", direction="down", speedup=1.1),
                    edits=[Edit(file="matmul.cpp", search="#include <cstddef>",
                                replace=f"#include <cstddef>\n#error clean test {n}")]).model_dump()


def optimize(root: Path, run_id: str, *args: str) -> None:
    p = agent(root, "optimize", TASK, "--run-id", run_id, "--quiet", "--target", "100x", *args)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("clean")
    root = make_user_repo(tmp / "repo")
    optimize(root, "r1", "--iters", "2")
    (tmp / "broken.json").write_text(json.dumps([broken(1), broken(2)]))
    replay = ["--proposer", "replay", "--replay", str(tmp / "broken.json")]
    optimize(root, "r2", "--iters", "2", *replay)
    optimize(root, "r3", "--iters", "1", *replay)
    state = root / "runs" / "r3" / "state.json"
    data = json.loads(state.read_text())
    data["status"] = "running"
    state.write_text(json.dumps(data, indent=2))
    return root


@pytest.fixture(scope="module")
def before(repo: Path) -> tuple:
    """The user's repository as the runs left it: what no clean may change."""
    return snapshot(repo)


def files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))


def refs(root: Path, prefix: str = "refs/") -> list[str]:
    return git(root, "for-each-ref", "--format=%(refname)", prefix).splitlines()


def worktree_paths(root: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(root, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def everything(root: Path) -> tuple:
    """Every file under runs/, every ref and every worktree: what a dry run or a skip must leave alone."""
    return files(root / "runs"), refs(root), worktree_paths(root)


def clean(root: Path, *args: str):
    return agent(root, "clean", *args, timeout=120)


def assert_one_line_error(p) -> None:
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


# --- refused, read-only -----------------------------------------------------------------------
def test_neither_run_nor_all_is_a_usage_error(repo: Path, before: tuple) -> None:
    start = everything(repo)
    assert_one_line_error(clean(repo))
    assert_one_line_error(clean(repo, "r1", "--all"))
    assert everything(repo) == start
    assert snapshot(repo) == before


def test_unknown_run_is_a_usage_error(repo: Path) -> None:
    start = everything(repo)
    p = clean(repo, "nosuchrun")
    assert_one_line_error(p)
    assert "nosuchrun" in p.stderr
    assert everything(repo) == start


def test_dry_run_removes_nothing(repo: Path, before: tuple) -> None:
    start = everything(repo)
    p = clean(repo, "--all", "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "run r1: would remove worktree" in p.stdout
    assert "run r2: would remove worktree" in p.stdout and "would delete branch agent/matmul_cpu/r2" in p.stdout
    assert "run r3: skipped" in p.stdout
    assert "would free" in p.stdout
    assert everything(repo) == start
    assert snapshot(repo) == before


def test_running_run_is_skipped_and_left_intact(repo: Path, before: tuple) -> None:
    start = everything(repo)
    p = clean(repo, "r3")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "run r3: skipped" in p.stdout and "running" in p.stdout
    assert everything(repo) == start
    assert refs(repo, "refs/agent/r3/"), "r3's rejected candidate should still be there"
    assert snapshot(repo) == before


# --- cleaning ---------------------------------------------------------------------------------
def test_clean_finished_run(repo: Path, before: tuple) -> None:
    run = repo / "runs" / "r1"
    branch = "agent/matmul_cpu/r1"
    libs = list(run.glob("iter-*/lib*.so"))
    jsons = sorted(p.relative_to(run) for p in run.glob("iter-*/*.json"))
    logs = sorted(p.relative_to(run) for p in run.glob("iter-*/*.log")) + sorted(run.glob("iter-*/*.diff"))
    assert libs and jsons and (run / "build").is_dir() and (run / "worktree").is_dir()
    others = refs(repo, "refs/agent/r2/") + refs(repo, "refs/agent/r3/")
    p = clean(repo, "r1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("run r1: removed worktree runs/r1/worktree"), p.stdout
    assert "freed" in p.stdout
    assert str(run / "worktree") not in worktree_paths(repo) and not (run / "worktree").exists()
    assert not (run / "build").exists()
    assert not list(run.glob("iter-*/lib*.so"))
    assert refs(repo, "refs/agent/r1/") == []
    # kept: the logs, every iteration's JSON and log, best/ and initial/; the other runs' refs
    assert (run / "iterations.jsonl").is_file() and (run / "run.json").is_file() and (run / "state.json").is_file()
    assert sorted(p.relative_to(run) for p in run.glob("iter-*/*.json")) == jsons
    assert all((run / rel).exists() for rel in logs)
    assert list((run / "best").glob("lib*.so")) and list((run / "initial").glob("lib*.so"))
    assert refs(repo, "refs/agent/r2/") + refs(repo, "refs/agent/r3/") == others
    # the branch: kept when the run kept a change (agent cherry-pick needs it), deleted when it kept nothing
    if read_state(run).best_iteration is not None:
        assert refs(repo, f"refs/heads/{branch}"), "a run that kept something keeps its branch"
        assert f"kept branch {branch}" in p.stdout
    else:
        assert refs(repo, f"refs/heads/{branch}") == []
        assert f"deleted branch {branch}" in p.stdout
    show = agent(repo, "show", "r1")
    assert show.returncode == 0, show.stdout + show.stderr
    assert snapshot(repo) == before


def test_keep_branches_then_branch_of_a_run_that_kept_nothing(repo: Path, before: tuple) -> None:
    run, branch = repo / "runs" / "r2", "agent/matmul_cpu/r2"
    assert read_state(run).best_iteration is None
    p = clean(repo, "r2", "--keep-branches")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "removed worktree" in p.stdout and "2 refs" in p.stdout and "branch" not in p.stdout
    assert refs(repo, f"refs/heads/{branch}") and refs(repo, "refs/agent/r2/") == []
    assert not (run / "worktree").exists() and not (run / "build").exists()
    # the user checks the branch out (it is at the commit they started from): it is not deleted
    git(repo, "checkout", "-q", branch)
    p = clean(repo, "r2")
    git(repo, "checkout", "-q", "main")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "nothing to remove" in p.stdout and f"kept branch {branch}: it is checked out" in p.stdout
    assert refs(repo, f"refs/heads/{branch}")
    assert snapshot(repo) == before
    p = clean(repo, "r2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"deleted branch {branch}" in p.stdout
    assert refs(repo, f"refs/heads/{branch}") == []
    assert agent(repo, "show", "r2").returncode == 0
    assert snapshot(repo) == before


def test_clean_all_skips_the_running_run(repo: Path, before: tuple) -> None:
    r3 = repo / "runs" / "r3"
    start = files(r3), refs(repo, "refs/agent/r3/"), refs(repo, "refs/heads/agent/matmul_cpu/r3")
    p = clean(repo, "--all")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "run r3: skipped" in p.stdout
    assert "run r1: nothing to remove" in p.stdout and "run r2: nothing to remove" in p.stdout
    assert (files(r3), refs(repo, "refs/agent/r3/"), refs(repo, "refs/heads/agent/matmul_cpu/r3")) == start
    assert str(r3 / "worktree") in worktree_paths(repo)
    assert git(repo, "branch", "--list", "main")
    assert snapshot(repo) == before


def test_unreadable_run_is_reported(tmp_path: Path, repo: Path) -> None:
    bad = tmp_path / "runs" / "bad"
    bad.mkdir(parents=True)
    (bad / "run.json").write_text("{")
    p = clean(repo, "--all", "--runs-dir", str(tmp_path / "runs"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "bad" in p.stderr
    assert (bad / "run.json").exists()
