"""speedup.png and roofline.png, drawn by real matplotlib from a run written to disk as the loop writes it
(run.json, state.json, iterations.jsonl, initial/bench.json) and read back with load_run. Fast: no
compiler, no bench; the figures are inspected before they are saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.review.plot import move_label, plot_speedup, shorten, speedup_figure, target_vs_initial
from agent.review.roofline import plot_roofline, roofline_figure
from agent.review.runs import Run, load_run
from agent.records.schema import Decision, IterationRecord, Outcome, RunConfig, RunState
from agent.records.store import append_iteration, write_json_atomic
from tools.results import BenchResult, BenchStatus, SpeedupCI, TimingStats

PNG = b"\x89PNG\r\n\x1a\n"
FLOPS, NBYTES = 2 * 1024**3, 3 * 4 * 1024**2          # a 1024-cube fp32 matmul
LONG = "Stage K tiles through shared memory with double buffering so the loads overlap the math"


def timing(label: str, ms: float, metrics: bool) -> TimingStats:
    return TimingStats(label=label, median_ms=ms, p10_ms=ms * 0.98, p90_ms=ms * 1.02, mean_ms=ms, reps=50,
                       tflops=FLOPS / (ms * 1e-3) / 1e12 if metrics else None,
                       gbps=NBYTES / (ms * 1e-3) / 1e9 if metrics else None)


def bench(cand_ms: float, base_ms: float | None, device: str, metrics: bool, ref_ms: float | None = None
          ) -> BenchResult:
    ts = [timing("candidate", cand_ms, metrics)]
    ci = None
    if base_ms is not None:
        ts.append(timing("baseline", base_ms, metrics))
        s = base_ms / cand_ms
        ci = SpeedupCI(median=s, low=s * 0.97, high=s * 1.03, rounds=8)
    if ref_ms is not None:
        ts.append(timing("reference", ref_ms, metrics))
    return BenchResult(status=BenchStatus.ok, shape={"M": 1024, "N": 1024, "K": 1024}, device=device, timings=ts,
                       speedup_vs_baseline=ci)


def proposal(hypothesis: str, knobs: dict | None = None) -> Proposal:
    return Proposal(hypothesis=hypothesis, predicted=PredictedEffect(metric="time.median_ms", direction="down",
                    speedup=1.2), edits=[Edit(file="k.cu", search="a", replace="b")], knobs=knobs)


def make_run(d: Path, *, baseline: str = "initial", target: float = 1.5, reference_ms: float | None = 0.5,
             device: str = "cuda: NVIDIA H100 80GB HBM3", metrics: bool = True, **state) -> Run:
    """A four-iteration run: kept (a knob move), rejected, compile failure, kept (an LLM hypothesis)."""
    d.mkdir(parents=True)
    cfg = RunConfig(run_id="plot-test", task="matmul", task_dir="kernels/matmul", repo=str(d / "nowhere"),
                    branch="agent/matmul/plot-test", base_sha="0" * 40, worktree=str(d / "nowhere"),
                    proposer="heuristic", target=target, iters=4, baseline=baseline, started="2026-01-01T00:00:00")
    write_json_atomic(d / "run.json", cfg)
    initial_ms = 1.0
    (d / "initial").mkdir()
    (d / "initial" / "bench.json").write_text(
        bench(initial_ms, None, device, metrics, ref_ms=reference_ms).model_dump_json(indent=2))
    steps = [  # (decision, outcome, proposal, candidate ms, best ms at the time or None: no bench)
        (Decision.kept, Outcome.kept, proposal("BLOCK_M 64->128: more reuse per CTA", {"BLOCK_M": 128}), 0.8, 1.0),
        (Decision.reverted, Outcome.not_faster, proposal("BLOCK_N 64->32: fewer registers", {"BLOCK_N": 32}), 0.9,
         0.8),
        (Decision.reverted, Outcome.compile_failed, proposal("unroll the k loop by 8"), None, None),
        (Decision.kept, Outcome.kept, proposal(LONG), 0.64, 0.8),
    ]
    best = initial_ms
    for i, (dec, out, prop, ms, base) in enumerate(steps, 1):
        b = bench(ms, base, device, metrics) if ms is not None else None
        if dec == Decision.kept:
            best = ms
        append_iteration(d, IterationRecord(run_id=cfg.run_id, iteration=i, started="t", finished="t", proposal=prop,
                                            decision=dec, outcome=out, reason="r", bench=b, best_ms=best))
    write_json_atomic(d / "state.json", RunState(status="done", iterations_done=4, best_sha="1" * 40,
                                                 best_iteration=4, best_ms=best, initial_ms=initial_ms,
                                                 reference_ms=reference_ms, **state))
    return load_run(d)


def target_line(ax):
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("target") and len(ln.get_ydata())]
    assert len(lines) == 1, [ln.get_label() for ln in ax.get_lines()]
    return lines[0]


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_far_target_is_drawn_inside_the_axis(tmp_path):
    run = make_run(tmp_path / "run", baseline="initial", target=20.0)   # the best is 1.56x: 20x is far above
    top = speedup_figure(run).axes[0]
    line = target_line(top)
    y = line.get_ydata()[0]
    lo, hi = top.get_ylim()
    assert y == pytest.approx(20.0) and lo < y < hi
    assert "target 20x vs initial" in legend_texts(top)
    assert all(lo < c < hi for c in (1.0, 1.25, 1.5625))       # the steps stay on the chart too


def test_a_target_vs_reference_is_drawn_converted_to_vs_initial(tmp_path):
    # the reference is 2x faster than the initial kernel: 1.5x vs reference means 3x vs initial
    run = make_run(tmp_path / "run", baseline="reference", target=1.5, reference_ms=0.5)
    top = speedup_figure(run).axes[0]
    y = target_line(top).get_ydata()[0]
    lo, hi = top.get_ylim()
    assert y == pytest.approx(3.0) and lo < y < hi
    assert "target 1.5x vs reference (= 3x vs initial)" in legend_texts(top)

    # a far one too
    run = make_run(tmp_path / "far", baseline="reference", target=12.0, reference_ms=0.5)
    top = speedup_figure(run).axes[0]
    y = target_line(top).get_ydata()[0]
    lo, hi = top.get_ylim()
    assert y == pytest.approx(24.0) and lo < y < hi

    # the initial kernel's speedup over the reference timed interleaved at setup, where the state has it,
    # is what the run's figures use (agent/records/figures.py): the target follows it
    run = make_run(tmp_path / "interleaved", baseline="reference", target=1.5, reference_ms=0.5,
                   initial_vs_reference=0.4)
    assert target_line(speedup_figure(run).axes[0]).get_ydata()[0] == pytest.approx(3.75)


def test_a_target_vs_reference_without_a_reference_time_is_named_not_drawn(tmp_path):
    run = make_run(tmp_path / "run", baseline="reference", reference_ms=None)
    assert target_vs_initial(run)[0] is None
    top = speedup_figure(run).axes[0]
    assert not [ln for ln in top.get_lines() if ln.get_label().startswith("target") and len(ln.get_ydata())]
    assert any("no reference time" in t for t in legend_texts(top)), legend_texts(top)
    out = plot_speedup(run, tmp_path / "speedup.png")
    assert out.read_bytes()[:8] == PNG


def test_each_kept_step_is_labelled_with_its_move(tmp_path):
    run = make_run(tmp_path / "run")
    fig = speedup_figure(run)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "BLOCK_M 64->128" in texts                        # a knob move: the move itself
    long = [t for t in texts if t.startswith("Stage K tiles")]
    assert len(long) == 1 and long[0].endswith("…") and len(long[0]) <= 24, texts
    for r in run.kept():
        assert move_label(r) in texts
    assert not any(t.startswith(("BLOCK_N", "unroll")) for t in texts)   # rejected moves are not labelled
    # the two labels are not on the same side of the line (cheap overlap avoidance)
    anns = [t for t in fig.axes[0].texts if t.get_text() in (move_label(r) for r in run.kept())]
    assert len(anns) == 2 and {a.xyann[1] > 0 for a in anns} == {True, False}
    assert shorten("x" * 40).endswith("…") and len(shorten("x" * 40)) == 24


def test_plot_roofline_needs_flops_and_bytes(tmp_path):
    run = make_run(tmp_path / "run", metrics=False)
    assert roofline_figure(run) is None
    assert plot_roofline(run, run.dir / "roofline.png") is None
    assert not (run.dir / "roofline.png").exists()
    assert roofline_figure(make_run(tmp_path / "with", metrics=True)) is not None   # the formulas were the reason


def test_plot_roofline_on_a_known_gpu_draws_every_kept_kernel_under_the_roofs(tmp_path):
    run = make_run(tmp_path / "run")
    out = plot_roofline(run, run.dir / "roofline.png")
    assert out == run.dir / "roofline.png" and out.read_bytes()[:8] == PNG
    import matplotlib.image
    img = matplotlib.image.imread(out)
    assert img.shape[0] >= 500 and img[..., :3].std() > 0.05

    ax = roofline_figure(run).axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    kernels = next(c for c in ax.collections if c.get_gid() == "kernels")
    pts = kernels.get_offsets()
    assert len(pts) == len(run.kept()) + 1                    # the initial kernel and each kept iteration
    # initial at 1.0 ms: 2.15 TFLOP/s at 2*1024^3 / (12 MiB) = 170.7 FLOP/byte
    assert pts[0][0] == pytest.approx(FLOPS / NBYTES) and pts[0][1] == pytest.approx(FLOPS / 1e-3 / 1e12)
    assert pts[-1][1] == pytest.approx(FLOPS / 0.64e-3 / 1e12)
    assert any(c.get_gid() == "reference" for c in ax.collections)
    texts = [t.get_text() for t in ax.texts]
    assert "initial" in texts and "reference" in texts
    for r in run.kept():
        assert f"#{r.iteration} {move_label(r)}" in texts
    roofs = [ln.get_label() for ln in ax.get_lines()]
    assert "H100 memory 3.35 TB/s" in roofs and any("TFLOP/s" in lab for lab in roofs), roofs
    assert "peaks unknown" not in ax.get_title()


@pytest.mark.parametrize("device", ["cpu", "cuda: Some Future GPU"])
def test_plot_roofline_without_known_peaks_draws_no_roofs_and_says_so(tmp_path, device):
    run = make_run(tmp_path / "run", device=device)
    ax = roofline_figure(run).axes[0]
    assert "device peaks unknown" in ax.get_title()
    assert not [ln for ln in ax.get_lines() if "TB/s" in ln.get_label() or "TFLOP/s" in ln.get_label()]
    assert len(next(c for c in ax.collections if c.get_gid() == "kernels").get_offsets()) == len(run.kept()) + 1
    assert plot_roofline(run, tmp_path / "r.png").read_bytes()[:8] == PNG
