"""Repair inside the iteration (issue 43, agent/optimize/repair.py): `agent optimize --proposer llm` as a subprocess, the real
openai client, a local server playing a strong model that makes a model's mistakes. Its first answer does not
compile (a semicolon dropped), its repair computes the wrong result on odd row counts (rows taken in pairs, the odd
last row dropped), its second repair is right: with `--iters 1` the candidate is kept in that one iteration, the
two failed attempts are in the record with their outcomes and tokens, and the second and third requests carry the
failed code and its error (read from the server's log)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.records.schema import Decision, Outcome
from agent.records.store import read_iterations
from tests.fake_openai import FakeOpenAI
from tests.userrepo import agent, configure_llm, git, make_user_repo, snapshot

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

ROWS = "                for (int i = i0; i < i1; ++i)\n                    for (int k = k0; k < k1; ++k) {"
LOAD = "                        const float a = A[(size_t)i * K + k];"


def _proposal(hyp: str, *edits: tuple[str, str]) -> dict:
    return {"hypothesis": hyp, "evidence": [{"metric": "knob.LOOP_ORDER", "value": "0"}],
            "predicted": {"metric": "time.median_ms", "direction": "down", "speedup": 3.0},
            "edits": [{"file": "matmul.cpp", "search": s, "replace": r} for s, r in edits]}


SWITCH = ("#define LOOP_ORDER 0", "#define LOOP_ORDER 1")
# 1: the i-k-j order, with the A load's semicolon dropped in passing
TYPO = _proposal("Switch to the i-k-j order so that B and C stream along rows; hoist A[i,k] into a register",
                 SWITCH, (LOAD, LOAD.rstrip(";")))
# 2: the typo fixed, and rows taken two at a time "to share each B row": the odd last row is dropped
PAIRS = _proposal("i-k-j order, rows in pairs so each loaded B row serves two rows of C",
                  SWITCH, (ROWS, ROWS.replace("i < i1", "i < (i1 & ~1)")))
# 3: right
RIGHT = _proposal("i-k-j order alone: B and C stream along rows", SWITCH)


def test_a_candidate_that_fails_to_compile_then_fails_parity_is_repaired_and_kept_in_one_iteration(tmp_path):
    root = make_user_repo(tmp_path / "user")
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url, timeout_s=5.0, max_attempts=2)
        before = snapshot(root)
        for p in (TYPO, PAIRS, RIGHT):
            srv.push_proposal(p)
        res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "100x", "--iters", "1", "--quiet",
                    "--run-id", "repair", timeout=600)
        assert res.returncode == 0, res.stderr + res.stdout
        reqs = srv.chat_requests
    run = root / "runs" / "repair"
    [rec] = read_iterations(run)
    assert rec.decision == Decision.kept and rec.outcome == Outcome.kept, (rec.outcome, rec.reason)
    assert [a.outcome for a in rec.attempts] == [Outcome.compile_failed, Outcome.parity_failed], rec.attempts
    assert all(a.usage.calls == 1 and a.usage.prompt_tokens > 0 for a in rec.attempts)
    assert rec.usage.calls == 3 and rec.proposal.hypothesis == RIGHT["hypothesis"]
    assert [a.attempt for a in rec.attempts] == [1, 2] and all(a.rejected_ref for a in rec.attempts)
    assert "i1 & ~1" in rec.attempts[1].patch and "i1 & ~1" not in rec.patch
    # one conversation: each repair request holds the earlier ones, and its last message the failure
    assert len(reqs) == 3
    assert [len(r.body["messages"]) for r in reqs] == [2, 4, 6]
    second, third = (r.body["messages"][-1]["content"] for r in reqs[1:])
    assert "did not compile" in second and "error" in second
    assert LOAD.strip().rstrip(";") in second                 # the failing line, quoted from the compiled file
    assert "```diff" in second and "LOOP_ORDER 1" in second   # the change it made
    assert "wrong result" in third and "mismatch" in third.lower()
    assert "i1 & ~1" in third                                  # its diff, with the dropped row
    # every failing shape, and the ones that passed: the odd row counts fail, the even ones pass
    assert "The failing checks" in third and "M=131" in third.split("These shapes passed")[0]
    assert "M=64,N=64,K=64" in third.split("These shapes passed")[1]
    # the failed commits stay reviewable; the user's repository is untouched
    refs = git(root, "for-each-ref", "--format=%(refname)", "refs/agent/repair/rejected").split()
    assert sorted(refs) == ["refs/agent/repair/rejected/1.1", "refs/agent/repair/rejected/1.2"], refs
    shown = agent(root, "show", "repair", "--iter", "1")
    assert shown.returncode == 0, shown.stderr
    assert "attempt 1" in shown.stdout and "compile_failed" in shown.stdout and "attempt 3" in shown.stdout
    # the conversation as the model saw it (docs/TRANSCRIPT.md is this view of a GPU run)
    tr = agent(root, "show", "repair", "--iter", "1", "--transcript")
    assert tr.returncode == 0, tr.stderr
    assert tr.stdout.count("## Call ") == 3 and "did not compile" in tr.stdout and "wrong result" in tr.stdout
    assert "| 2 | parity_failed |" in tr.stdout and "**kept**" in tr.stdout
    assert snapshot(root) == before


def test_repairs_zero_ends_the_iteration_at_the_first_failure(tmp_path):
    root = make_user_repo(tmp_path / "user")
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url, timeout_s=5.0, max_attempts=2)
        for p in (TYPO, RIGHT):
            srv.push_proposal(p)
        res = agent(root, "optimize", "kernels/matmul_cpu", "--target", "100x", "--iters", "1", "--quiet",
                    "--run-id", "norepair", "--repairs", "0", timeout=600)
        assert res.returncode == 0, res.stderr + res.stdout
        assert len(srv.chat_requests) == 1
    [rec] = read_iterations(root / "runs" / "norepair")
    assert rec.outcome == Outcome.compile_failed and rec.attempts == []
    bad = agent(root, "optimize", "kernels/matmul_cpu", "--repairs", "-1")
    assert bad.returncode == 2 and "--repairs -1" in bad.stderr


def _repair_softmax():
    import importlib.util
    spec = importlib.util.spec_from_file_location("repair_softmax", REPO / "scripts" / "device" / "repair_softmax.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.nvcc
def test_a_launch_rejection_goes_back_with_the_broken_limit_and_the_shape_and_its_repair_passes(tmp_path):
    """The device script's second and fourth answers (scripts/device/repair_softmax.py) on a machine with nvcc and no
    GPU: the row staged in shared memory is fine on the main shape (16 KiB) and 1 MiB on the 262144-wide rows; the
    static launch check (the library's own plan on every shape, ptxas's resources, the sm_90 table) refuses it; the
    repair request, through the real client, carries the limit, the shape and the diff; the repair passes the check.
    The same conversation through `agent optimize` runs on the device (the script), where the setup bench can run."""
    import subprocess

    from agent.evaluation.attempt import Attempt
    from agent.evaluation.ended import LaunchRejected
    from agent.evaluation.evaluate import launch_ok
    from agent.proposers.base import Context
    from agent.llm.proposer import LLMProposer
    from agent.optimize.repair import feedback
    from agent.llm.settings import LLMSettings
    from tools.backends.device import table_limits
    from tools.build.build import build, find_nvcc
    from tools.measure.launch import static_check
    from tools.task import load_task
    if find_nvcc() is None:
        pytest.skip("nvcc not installed")
    rs = _repair_softmax()
    root = tmp_path / "softmax"
    shutil.copytree(REPO / "kernels" / "softmax", root, ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "softmax")
    original = (root / "softmax.cu").read_text()
    limits = table_limits("sm_90")

    def checked(answer: dict):
        (root / "softmax.cu").write_text(rs.apply(original, answer))
        task = load_task(root)
        b = build(task, tmp_path / "build")
        assert b.status.value == "ok", b.message
        return task, launch_ok(static_check(task, b, limits))

    with FakeOpenAI() as srv:
        srv.push_proposal(rs.ANSWERS["smem_row"])
        srv.push_proposal(rs.ANSWERS["right"])
        task = load_task(root)
        proposer = LLMProposer(LLMSettings(model="m", base_url=srv.base_url, api_key="k", timeout_s=5,
                                           max_attempts=2), task)
        ctx = Context(task=task, iteration=1, sources={"softmax.cu": original}, profile=None,
                      knobs=task.read_knobs(), iter_dir=str(tmp_path / "iter-1"))
        first, _ = proposer.propose(ctx)
        with pytest.raises(LaunchRejected) as e:
            checked(first.model_dump())
        a = Attempt(iteration=1, run_id="r", started="now", parent_sha="x", proposal=first,
                    patch=subprocess.run(["git", "diff"], cwd=root, capture_output=True, text=True).stdout)
        told = feedback(e.value, a, root)
        (root / "softmax.cu").write_text(original)   # the loop reverts the candidate before the repair
        ctx.feedback, ctx.feedback_kind = told, e.value.outcome.value
        second, _ = proposer.propose(ctx)
        reqs = srv.chat_requests
    msg = reqs[1].body["messages"][-1]["content"]
    assert len(reqs) == 2 and len(reqs[1].body["messages"]) == 4       # the same conversation
    assert "launch (CTA) safety check" in msg and "opt-in limit" in msg and "M=4,N=262144" in msg, msg
    assert "1048608 B" in msg and "extern __shared__ float row_s[]" in msg   # the figure, and its diff
    _, res = checked(second.model_dump())
    assert res.status.value == "ok" and not res.violations
