"""The heuristic proposer's rules, on real tasks and profiles parsed from real ncu reports."""

from __future__ import annotations

from pathlib import Path

from agent.proposers.base import Context, HistoryItem, ProposerExhausted
from agent.proposers.heuristic import HeuristicProposer
from tools.profile.model import Bottleneck, KernelProfile, ProfileEnv, ProfileReport, ProfileStatus
from tools.task import load_task

REPO = Path(__file__).resolve().parent.parent


def _ctx(task, profile=None, history=()):
    return Context(task=task, iteration=1, sources={f: task.path(f).read_text() for f in task.spec.editable},
                   profile=profile, history=list(history), knobs=task.read_knobs(),
                   measured_knobs=[{k: v for k, v in task.read_knobs().items()}])


def _prof(ctas: int = 64, **kw) -> ProfileReport:
    k = KernelProfile(name="attention_fwd_kernel", grid=(ctas, 1, 1), block=(128, 1, 1), ctas=ctas, **kw)
    return ProfileReport(status=ProfileStatus.ok, env=ProfileEnv(sm_count=132), kernels=[k])


def test_small_grid_raises_the_split_knob_and_names_the_metric():
    task = load_task(REPO / "kernels" / "attention_fwd")
    p, _ = HeuristicProposer(task).propose(_ctx(task, _prof(bottleneck=Bottleneck.small_grid)))
    assert p.knobs["KV_SPLITS"] == 2 and "64 CTAs on 132 SMs" in p.hypothesis
    assert p.edits[0].search.strip().startswith("#define KV_SPLITS 1")
    assert any(e.metric == "launch.ctas" and e.value == "64" for e in p.evidence)


def test_bank_conflicts_pad_and_idle_tensor_pipe_enables_tensor_cores():
    task = load_task(REPO / "kernels" / "attention_fwd")
    prof = _prof(2048, smem_bank_conflicts=470086736, bottleneck=Bottleneck.memory)
    p, _ = HeuristicProposer(task).propose(_ctx(task, prof))
    assert p.knobs["SMEM_PAD"] == 2 and "bank conflicts" in p.hypothesis
    prof = _prof(2048, bottleneck=Bottleneck.compute, tensor_pipe_pct=0.0, sol_compute_pct=80.0)
    p, _ = HeuristicProposer(task).propose(_ctx(task, prof))
    assert p.knobs["USE_TENSOR_CORES"] == 1 and "tensor pipe" in p.hypothesis


def test_exploration_tries_the_vector_knob_before_threads_and_never_repeats():
    task = load_task(REPO / "kernels" / "softmax")
    prop = HeuristicProposer(task)
    p, _ = prop.propose(_ctx(task))
    assert set(k for k, v in p.knobs.items() if v != task.read_knobs()[k]) == {"VEC"}
    seen = [p.knobs]
    hist = [HistoryItem(iteration=1, hypothesis=p.hypothesis, outcome="not_faster", reason="", knobs=p.knobs)]
    for i in range(6):
        q, _ = prop.propose(_ctx(task, history=hist))
        assert q.knobs not in seen and q.knobs != task.read_knobs()
        seen.append(q.knobs)
        hist.append(HistoryItem(iteration=i + 2, hypothesis=q.hypothesis, outcome="not_faster", reason="",
                                knobs=q.knobs))


def test_a_rule_move_that_failed_is_not_retried_before_the_untried_ones():
    task = load_task(REPO / "kernels" / "softmax")
    prof = ProfileReport(status=ProfileStatus.ok, env=ProfileEnv(sm_count=132), kernels=[KernelProfile(
        name="softmax_kernel", grid=(8192, 1, 1), block=(128, 1, 1), ctas=8192, bottleneck=Bottleneck.compute,
        sol_compute_pct=73.0, sol_memory_pct=52.0, tensor_pipe_pct=None)])
    prop = HeuristicProposer(task)
    # softmax declares no FLOPs: "compute-bound" is instruction issue, so wider accesses come first
    first, _ = prop.propose(_ctx(task, prof))
    assert first.knobs["VEC"] == 2 and "instructions" in first.hypothesis, first.hypothesis
    assert any(e.metric == "task.flop_per_byte" for e in first.evidence)
    # the tile move is the rule's second suggestion
    failed = [HistoryItem(iteration=1, hypothesis=first.hypothesis, outcome="not_faster", reason="slower",
                          knobs=first.knobs)]
    tile, _ = prop.propose(_ctx(task, prof, failed))
    assert tile.knobs["ROWS_PER_CTA"] == 2 and tile.knobs["VEC"] == 1 and "Compute-bound" in tile.hypothesis
    failed.append(HistoryItem(iteration=2, hypothesis=tile.hypothesis, outcome="not_faster", reason="slower",
                              knobs=tile.knobs))
    third, _ = prop.propose(_ctx(task, prof, failed))
    assert third.knobs not in [h.knobs for h in failed] and third.knobs["ROWS_PER_CTA"] != 2, third.hypothesis


def test_compute_bound_with_real_math_still_grows_tiles():
    """attention declares about S/2 = 256 FLOP/B on its main shape: a compute-bound profile with the
    tensor pipe busy gets the tile move, not an access-width one."""
    task = load_task(REPO / "kernels" / "attention_fwd")
    prof = _prof(2048, bottleneck=Bottleneck.compute, tensor_pipe_pct=60.0, sol_compute_pct=80.0)
    cur = task.read_knobs()
    p, _ = HeuristicProposer(task).propose(_ctx(task, prof))
    moved = {k for k, v in p.knobs.items() if v != cur[k]}
    assert len(moved) == 1 and moved <= {"BLOCK_M", "BLOCK_N"} and "larger tiles" in p.hypothesis, p.hypothesis


def test_after_every_single_move_it_combines_the_two_cheapest_moves_first():
    """At a local optimum (every one-knob move measured slower), the combinations come in the order of
    the product of their measured single-move ratios, each stated in the hypothesis."""
    task = load_task(REPO / "kernels" / "attention_fwd")
    cur = {k: v for k, v in task.read_knobs().items() if v is not None}
    best_ms = 1.0
    cost = {("BLOCK_M", 32): 1.1, ("BLOCK_N", 128): 1.2, ("KV_SPLITS", 2): 1.5}   # the rest: 3x slower
    hist = []
    for k in task.spec.knobs:
        for v in k.values:
            cfg = {**cur, k.name: v}
            if v == cur[k.name] or not task.spec.restriction_ok(cfg):
                continue
            ms = best_ms * cost.get((k.name, v), 3.0)
            hist.append(HistoryItem(iteration=len(hist) + 1, hypothesis="-", outcome="not_faster", reason="slower",
                                    speedup=best_ms / ms, knobs=cfg, ms=ms))
    prop = HeuristicProposer(task)
    ctx = _ctx(task, history=hist)
    ctx.best_ms = best_ms
    p, _ = prop.propose(ctx)
    changed = {n: v for n, v in p.knobs.items() if cur[n] != v}
    assert changed == {"BLOCK_M": 32, "BLOCK_N": 128}, p.hypothesis
    assert "0.758x if the moves did not interact" in p.hypothesis and "BLOCK_M->32 0.909x" in p.hypothesis
    assert {e.metric for e in p.evidence} >= {"single_move.BLOCK_M=32.speedup", "single_move.BLOCK_N=128.speedup"}
    assert [e.file for e in p.edits] == ["attention.cu", "attention.cu"]
    # measured (slower): the next pair by the same estimate
    hist.append(HistoryItem(iteration=len(hist) + 1, hypothesis=p.hypothesis, outcome="not_faster", reason="slower",
                            speedup=0.8, knobs=p.knobs, ms=1.25))
    ctx = _ctx(task, history=hist)
    ctx.best_ms = best_ms
    q, _ = prop.propose(ctx)
    assert {n: v for n, v in q.knobs.items() if cur[n] != v} == {"BLOCK_M": 32, "KV_SPLITS": 2}, q.hypothesis


def test_every_hypothesis_names_its_move_first():
    """Tables, `agent runs`, the report and the commit subject show the start of a hypothesis: it must be
    the move ("VEC 1->2: ..."), the reason after it, for a profile rule, exploration and a combination."""
    import re
    move = re.compile(r"^[A-Z_]+ -?\d+->-?\d+(, [A-Z_]+ -?\d+->-?\d+)*: \S")
    seen = []
    attn = load_task(REPO / "kernels" / "attention_fwd")
    for prof in (_prof(bottleneck=Bottleneck.small_grid), _prof(2048, smem_bank_conflicts=10 ** 6),
                 _prof(2048, bottleneck=Bottleneck.compute, tensor_pipe_pct=0.0, sol_compute_pct=80.0)):
        seen.append(HeuristicProposer(attn).propose(_ctx(attn, prof))[0])
    cpu = load_task(REPO / "kernels" / "matmul_cpu")
    h, hist = HeuristicProposer(cpu), []
    for i in range(len(cpu.spec.knob_space()) - 1):   # exploration until every single move is measured
        try:
            p, _ = h.propose(_ctx(cpu, None, hist))
        except ProposerExhausted:   # the space is explored
            break
        seen.append(p)
        hist.append(HistoryItem(iteration=i + 1, hypothesis=p.hypothesis, outcome="not_faster", reason="slower",
                                knobs=p.knobs, speedup=0.9))
    assert len(seen) > 5 and any(len([1 for n, v in p.knobs.items() if cpu.read_knobs().get(n) not in (None, v)]) > 1
                                 for p in seen[3:]), [p.hypothesis for p in seen]
    bad = [p.hypothesis for p in seen if not move.match(p.hypothesis)]
    assert bad == []
