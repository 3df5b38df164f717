"""The keep rule through `agent optimize` on a loaded machine (issue 63): an honest 1.13x change is kept, twenty no-op
candidates are not, and a doubtful bench is re-benched (the rule itself, branch by branch: tests/test_attempt.py;
its rates over many runs: scripts/keep_rule_rates.py, VERIFICATION.md)."""

from __future__ import annotations

import pytest

from agent.records.schema import Decision, Outcome
from agent.records.store import read_config, read_iterations
from tests.fixtures.keep_rule import HONEST_GAIN, busy, honest, make_repo, noop, optimize
from tests.userrepo import agent, git

pytestmark = pytest.mark.slow

NOOPS = 20


def test_an_honest_small_gain_is_kept_and_no_op_candidates_never_are_on_a_loaded_machine(tmp_path):
    root = make_repo(tmp_path / "user")
    props = [noop(i) for i in range(1, 11)] + [honest()] + [noop(i) for i in range(11, NOOPS + 1)]
    with busy(1):     # with the suite's other worker, two cores and three busy processes
        run = optimize(root, props, agent)
    recs = read_iterations(run)
    assert len(recs) == NOOPS + 1
    fair = recs[10]
    assert fair.decision == Decision.kept, fair.reason
    assert abs(fair.bench.speedup_vs_baseline.median / HONEST_GAIN - 1) < 0.1, fair.reason
    assert fair.confirm is not None and fair.confirm.speedup_vs_baseline.low > 1.0
    others = recs[:10] + recs[11:]
    assert [r.iteration for r in others if r.decision == Decision.kept] == []
    odd = [(r.iteration, r.outcome.value, r.reason) for r in others
           if r.outcome not in (Outcome.not_faster, Outcome.inconclusive)]
    assert odd == []
    for r in recs:      # every re-bench on record and on disk, each with more rounds than the bench it replaced
        for i, doubt in enumerate(r.bench_undecided + r.confirm_undecided):
            assert (run / f"iter-{r.iteration}" / f"rebench-{i + 1}.json").exists()
        chain = r.bench_undecided + [r.bench]
        assert all(b.speedup_vs_baseline.rounds < c.speedup_vs_baseline.rounds for b, c in zip(chain, chain[1:]))
        if r.bench_undecided:
            assert "rounds at 99%" in r.reason or r.decision == Decision.kept
    # the run's branch holds the honest change alone
    cfg = read_config(run)
    assert git(root, "log", "--format=%H", f"{cfg.base_sha}..{cfg.branch}").split() == [fair.commit_sha]
    assert git(root, "show", f"{fair.commit_sha}:kernels/matmul_cpu/matmul.cpp").count("#define REDO 15") == 1
