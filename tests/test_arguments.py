"""Bad arguments are refused before anything is created: no run folder, no branch, no worktree, no ref,
and one line that names the argument and what to give instead. `agent check` and `agent optimize`
pick the task the same way."""

from __future__ import annotations

import json

import pytest

from tests.userrepo import agent, git, make_user_repo


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    return make_user_repo(tmp_path_factory.mktemp("args") / "user")


def _nothing_created(root) -> None:
    assert not (root / "runs").exists()
    assert git(root, "for-each-ref", "--format=%(refname)", "refs/heads/agent", "refs/agent") == ""
    assert len(git(root, "worktree", "list").splitlines()) == 1
    assert ".git/info/exclude" not in git(root, "status", "--porcelain")


def _refused(root, *args: str) -> str:
    """`agent optimize ARGS` exits 2 with no traceback and creates nothing; returns what it printed."""
    res = agent(root, "optimize", *args, "--quiet", timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out
    _nothing_created(root)
    return out


@pytest.mark.parametrize("args, says", [
    (["--iters", "0"], "--iters 0: give at least 1"),
    (["--iters", "-3"], "--iters -3: give at least 1"),
    (["--target", "0.5"], "--target 0.5: a target at or below 1x"),
    (["--target", "1x"], "--target 1x: a target at or below 1x"),
    (["--target", "fast"], "--target 'fast': give a speedup such as 1.5x"),
    (["--min-gain", "-0.1"], "--min-gain -0.1: give 0 or more"),
    (["--budget-seconds", "0"], "--budget-seconds 0: give more than 0"),
    (["--budget-tokens", "-5"], "--budget-tokens -5: give more than 0"),
])
def test_a_bad_number_is_refused_before_anything_is_created(user, args, says):
    assert says in _refused(user, "kernels/matmul_cpu", *args)


def test_a_missing_task_folder_is_named_as_missing(user):
    out = _refused(user, "kernels/no_such_task")
    assert "kernels/no_such_task does not exist" in out and "git repository" not in out


def test_a_folder_without_task_toml_is_named(user):
    assert "no task.toml" in _refused(user, "kernels")


def test_check_and_optimize_pick_the_same_task(tmp_path):
    # a user repository whose one task is not the first shipped task: both commands must take the user's
    root = make_user_repo(tmp_path / "user")
    git(root, "mv", "kernels/matmul_cpu", "kernels/my_matmul")
    git(root, "commit", "-qm", "rename")
    chk = agent(root, "check", "--json", "--build-dir", str(tmp_path / "b"), timeout=300)
    assert chk.returncode in (0, 1), chk.stderr
    assert json.loads(chk.stdout)["task"] == "matmul_cpu"   # the task's name is in its task.toml
    # the table's notes are in the JSON too (the knob values left unchecked, here)
    assert any(n.startswith("knobs: only the committed values checked") for n in json.loads(chk.stdout)["notes"])
    assert "my_matmul" in chk.stderr, chk.stderr             # and the folder it came from is said
    outside = agent(tmp_path, "check", "--json", timeout=120)   # no repository, no task given
    assert outside.returncode == 2 and "git repository" not in outside.stderr
    assert "no task" in outside.stderr


def test_version_is_the_installed_distributions():
    import tomllib
    from pathlib import Path
    want = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["version"]
    res = agent(Path.cwd(), "--version", timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == f"agent {want}", res.stdout + res.stderr


def test_a_run_that_kept_nothing_does_not_suggest_cherry_picking(tmp_path):
    from agent.proposal import Edit, PredictedEffect, Proposal
    root = make_user_repo(tmp_path / "user")
    broken = Proposal(hypothesis="LOOP_ORDER 0->1: a typo", predicted=PredictedEffect(metric="t", direction="down",
                      speedup=2.0), edits=[Edit(file="matmul.cpp", search="#define LOOP_ORDER 0",
                                                replace="#define LOOP_ORDER 1\nthis is not C++")])
    (tmp_path / "p.json").write_text(json.dumps([broken.model_dump()]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "p.json"),
                "--iters", "1", "--run-id", "none", "--quiet", timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "0 kept of 1" in out and "cherry-pick" not in out and "agent clean none" in out


@pytest.mark.slow
def test_a_target_the_initial_kernel_already_meets_stops_before_trying_unless_asked(tmp_path):
    # a reference that is slow on purpose: the initial kernel is already well past 1.5x "vs reference"
    root = make_user_repo(tmp_path / "user")
    task_py = root / "kernels" / "matmul_cpu" / "task.py"
    src = task_py.read_text()
    assert "    return a @ b\n" in src
    task_py.write_text(src.replace("    return a @ b\n", "    for _ in range(40):\n        c = a.double() @ b.double()\n"
                                   "    return c.float()\n"))
    git(root, "commit", "-qam", "a slow reference")
    res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "1.5x", "--baseline", "reference", "--iters", "3", "--proposer", "heuristic",
                "--run-id", "met", "--quiet", timeout=300)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out
    assert "the initial kernel already meets the target" in out and "--past-target" in out
    state = json.loads((root / "runs" / "met" / "state.json").read_text())
    recs = root / "runs" / "met" / "iterations.jsonl"
    assert state["iterations_done"] == 0 and (not recs.exists() or not recs.read_text().strip()), state
    assert "reached" not in state["stop_reason"]
    # asked to go past it: every iteration runs
    res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "1.5x", "--baseline", "reference", "--iters", "2", "--proposer", "heuristic",
                "--run-id", "past", "--past-target", "--quiet", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    state = json.loads((root / "runs" / "past" / "state.json").read_text())
    assert state["iterations_done"] == 2 and state["stop_reason"] == "2 iterations done", state
