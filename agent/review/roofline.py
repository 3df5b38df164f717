"""runs/RUN/roofline.png (`plot_roofline`), where the task declares FLOP and byte formulas (bench timings then
carry TFLOP/s and GB/s): arithmetic intensity against achieved TFLOP/s, log-log, for the initial kernel, the
reference and each kept iteration, under the device's memory and compute roofs when the GPU is in
tools/measure/roofline.py's table of peaks (a CPU, or a GPU not in the table: no roofs, and the title says "device
peaks unknown"; the CPU figures there are deliberately generous bounds, not peaks). `roofline_figure` builds it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from agent.review.plot import matplotlib_figure, move_label
from agent.review.runs import Run
from tools.measure.roofline import GPU_PEAKS, gpu_key
from tools.results import BenchResult, TimingStats
from tools.task import shape_label


@dataclass
class RoofPoint:
    label: str            # initial | reference | "#3 SMEM_PAD 0->2"
    kind: str             # initial | reference | kept
    intensity: float      # FLOP per byte
    tflops: float         # achieved


@dataclass
class Roofs:
    gpu: str                              # the table's name for it, e.g. H100
    bandwidth: float                      # bytes/s
    ceilings: list[tuple[str, float]]     # (what, FLOP/s)


def _point(t: TimingStats | None, label: str, kind: str) -> RoofPoint | None:
    if t is None or not t.tflops or not t.gbps:
        return None
    return RoofPoint(label, kind, t.tflops * 1e12 / (t.gbps * 1e9), t.tflops)


def initial_bench(run: Run) -> BenchResult | None:
    """runs/RUN/initial/bench.json: the initial kernel and the reference, timed at setup."""
    try:
        return BenchResult.model_validate_json((run.dir / "initial" / "bench.json").read_text())
    except (OSError, ValueError):
        return None


def roofline_points(run: Run) -> list[RoofPoint]:
    """The initial kernel, the reference and each kept iteration, where their timing has TFLOP/s and GB/s."""
    init = initial_bench(run)
    pts = [_point(init.timing("candidate") if init else None, "initial", "initial"),
           _point(init.timing("reference") if init else None, "reference", "reference")]
    pts += [_point(r.bench.timing("candidate") if r.bench else None, f"#{r.iteration} {move_label(r)}", "kept")
            for r in run.kept()]
    return [p for p in pts if p is not None]


def task_dtype(run: Run) -> str | None:
    """The task's (first) dtype, from its task.toml in the run's worktree or the user's repository."""
    for root in (run.dir / "worktree", Path(run.cfg.worktree), Path(run.cfg.repo)):
        try:
            data = tomllib.loads((root / run.cfg.task_dir / "task.toml").read_text())
        except (OSError, ValueError):
            continue
        dtypes = data.get("dtypes", ["float32"])
        return str(dtypes[0]) if isinstance(dtypes, list) and dtypes else None
    return None


def device_roofs(device: str, dtype: str | None) -> Roofs | None:
    """The GPU's HBM bandwidth and compute peaks from tools/measure/roofline.py's table; None for a CPU or a GPU
    the table does not name (its UNKNOWN_GPU and CPU figures are bounds for a sanity check, not peaks)."""
    key = gpu_key(device)
    if key is None:
        return None
    fp16, tf32, fp32, hbm = GPU_PEAKS[key]
    if dtype in ("float16", "bfloat16"):
        ceilings = [(f"{dtype} tensor", fp16)]
    elif dtype == "float32":
        ceilings = [("fp32", fp32), ("tf32 tensor", tf32)]
    else:
        ceilings = [("fp32", fp32), ("tf32 tensor", tf32), ("fp16/bf16 tensor", fp16)]
    return Roofs(key.upper(), hbm * 1e12, [(w, f * 1e12) for w, f in ceilings])


def _device(run: Run) -> tuple[str, dict]:
    """The device the benches name ('cpu' or 'cuda: NAME'; the run's environment where they name none)
    and the shape they timed."""
    benches = [initial_bench(run)] + [r.bench for r in run.kept()]
    for b in benches:
        if b is not None and b.device:
            return b.device, b.shape
    shape = next((b.shape for b in benches if b is not None), {})
    return (f"cuda: {run.cfg.env.gpu}" if run.cfg.env.gpu else ""), shape


def roofline_figure(run: Run):
    """The roofline figure of plot_roofline, unsaved; None when no timing has both TFLOP/s and GB/s."""
    pts = roofline_points(run)
    if not pts:
        return None
    Figure, _ = matplotlib_figure()
    import numpy as np
    device, shape = _device(run)
    roofs = device_roofs(device, task_dtype(run))
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")

    kernels = [p for p in pts if p.kind != "reference"]
    ax.plot([p.intensity for p in kernels], [p.tflops for p in kernels], color="tab:gray", lw=0.8, alpha=0.6)
    ax.scatter([p.intensity for p in kernels], [p.tflops for p in kernels], s=50, zorder=3,
               c=["tab:blue" if p.kind == "initial" else "tab:green" for p in kernels],
               label="initial (blue), kept iterations (green)", gid="kernels")
    ref = [p for p in pts if p.kind == "reference"]
    if ref:
        ax.scatter([p.intensity for p in ref], [p.tflops for p in ref], marker="D", s=45, color="tab:purple",
                   zorder=3, label="reference", gid="reference")
    xs = [p.intensity for p in pts]
    ys = [p.tflops for p in pts]
    if roofs is not None:
        xs += [c / roofs.bandwidth for _, c in roofs.ceilings]
        ys += [c / 1e12 for _, c in roofs.ceilings]
    lo, hi = min(xs) / 4, max(xs) * 4
    ylo, yhi = min(ys) / 4, max(ys) * 3
    if roofs is not None:
        top = max(c for _, c in roofs.ceilings)
        x = np.geomspace(lo, top / roofs.bandwidth, 64)
        ax.plot(x, x * roofs.bandwidth / 1e12, color="black", lw=1.2,
                label=f"{roofs.gpu} memory {roofs.bandwidth / 1e12:g} TB/s")
        for (what, c), ls in zip(sorted(roofs.ceilings, key=lambda w: w[1]), ("--", "-.", ":")):
            ax.plot([c / roofs.bandwidth, hi], [c / 1e12] * 2, color="black", lw=1.2, ls=ls,
                    label=f"{roofs.gpu} {what} {c / 1e12:g} TFLOP/s")
    ax.set_xlim(lo, hi)
    ax.set_ylim(ylo, yhi)
    _spread_labels(ax, pts, (lo, hi), (ylo, yhi))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    where = device.split(":", 1)[-1].strip() if device else "unknown device"
    note = "" if roofs is not None else ": device peaks unknown"
    ax.set_title(f"run {run.id}: {run.cfg.task} roofline, {shape_label(shape)} on {where}{note}", fontsize=10)
    return fig


def _spread_labels(ax, pts: list[RoofPoint], xlim: tuple[float, float], ylim: tuple[float, float],
                   gap: float = 0.045) -> None:
    """Label each point to its right, pushed apart vertically (in axes fractions) where points crowd:
    with the task's formulas every kernel of one shape has the same intensity, so the points stack in
    one column."""
    import math

    def frac(v: float, a: float, b: float) -> float:
        return (math.log(v) - math.log(a)) / (math.log(b) - math.log(a))

    order = sorted(pts, key=lambda p: p.tflops)
    ys: list[float] = []
    for p in order:
        ys.append(max(frac(p.tflops, *ylim), ys[-1] + gap) if ys else frac(p.tflops, *ylim))
    over = ys[-1] - 0.97 if ys else 0
    if over > 0:
        ys = [y - over for y in ys]
    for p, y in zip(order, ys):
        ax.annotate(p.label, (p.intensity, p.tflops), xytext=(frac(p.intensity, *xlim) + 0.04, y),
                    textcoords="axes fraction", va="center", fontsize=8,
                    arrowprops=dict(arrowstyle="-", color="tab:gray", lw=0.6, shrinkA=0, shrinkB=3))


def plot_roofline(run: Run, path: Path) -> Path | None:
    """runs/RUN/roofline.png; None (no file) when the task declares no FLOP and byte formulas."""
    fig = roofline_figure(run)
    if fig is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
