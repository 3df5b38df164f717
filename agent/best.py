"""The run's best version and the figures a run reports about it.

The best is a commit (`RunState.best_sha`), its library (runs/RUN/best/), its launch geometry and its
profile. Its speedups come from one of two measurements, named here and nowhere else: the
confirmation bench (the best against the initial kernel, interleaved, and against the reference) once
the best has been confirmed, else the estimate from the best's median and the baseline's median
measured at setup.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.evaluate import Evaluator, IterationEnded, snapshot_lib
from agent.runlog import RunConfig, RunState, StageTimes, write_json_atomic
from agent.view import View
from tools.profile.model import ProfileReport
from tools.results import LaunchResult
from tools.task import shape_label


class SetupFailed(Exception):
    """The run cannot start (the initial kernel fails to build or fails parity, ...)."""


class Best:
    def __init__(self, run_dir: Path, cfg: RunConfig, state: RunState, evaluator: Evaluator, view: View):
        self.run_dir, self.cfg, self.state, self.evaluator, self.view = run_dir, cfg, state, evaluator, view
        lib_name = f"lib{cfg.task}.so"
        self.lib = run_dir / "best" / lib_name
        self.initial_lib = run_dir / "initial" / lib_name
        self.launch: LaunchResult | None = None
        self.profile: ProfileReport | None = None

    def save(self) -> None:
        write_json_atomic(self.run_dir / "state.json", self.state)

    def measure_initial(self, head_sha: str) -> None:
        """Build, check and time the initial kernel (the branch's first commit); its profile seeds iteration 1."""
        ev, st, times = self.evaluator, self.state, StageTimes()
        self.view.message(f"[bold]initial kernel[/bold]: build, launch check, parity, bench vs reference "
                          f"({shape_label(ev.task.spec.main)})")
        try:
            b = ev.build(times)
            self.launch = ev.launch(b, None, times)
            snapshot_lib(b.lib_path, self.lib)
            snapshot_lib(b.lib_path, self.initial_lib)
            ev.parity(self.lib, times)
            bench = ev.bench(self.lib, None, times, with_reference=True)[0]
        except IterationEnded as e:
            raise SetupFailed(f"the initial kernel cannot be the starting point: {e.reason}") from None
        cand, ref = bench.timing("candidate"), bench.timing("reference")
        st.initial_ms = st.best_ms = cand.median_ms if cand else None
        st.reference_ms = ref.median_ms if ref else None
        st.best_sha = head_sha
        st.initial_knobs = {k: v for k, v in ev.task.read_knobs().items() if v is not None}
        dump(self.run_dir / "initial" / "bench.json", bench)
        self.reprofile(self.run_dir / "initial")
        self.save()
        vs_ref = f", reference {st.reference_ms * 1e3:.1f} us" if st.reference_ms else ""
        self.view.message(f"initial: {st.initial_ms * 1e3:.1f} us{vs_ref}")

    def reprofile(self, out_dir: Path) -> None:
        """Profile the best library (CUDA only: a CPU task has no counters; the heuristic explores its
        knobs); a profile with no kernels keeps the previous one."""
        task = self.evaluator.task
        if task.spec.device != "cuda":
            self.profile = None
            return
        try:
            from tools.profile import profile_task
        except ImportError:
            self.profile = None
            return
        rep = profile_task(task, self.lib, tier=self.cfg.profile_tier, out_dir=out_dir)
        dump(out_dir / "profile.json", rep)
        self.profile = rep if rep.kernels else self.profile

    def load_profile(self, path: Path) -> None:
        if path.exists():
            rep = ProfileReport.model_validate_json(path.read_text())
            self.profile = rep if rep.kernels else None

    def speedup_vs(self, which: str) -> float | None:
        """The best's speedup over "initial" or "reference": the confirmed (interleaved) figure where the
        best was confirmed, else an estimate from the best's time and the baseline's time at setup."""
        st = self.state
        if st.confirmed_sha and st.confirmed_sha == st.best_sha:
            return st.confirmed_vs_reference if which == "reference" else st.confirmed_vs_initial
        base = st.reference_ms if which == "reference" else st.initial_ms
        if not base or not st.best_ms:
            return None
        return base / st.best_ms

    def target_reached(self) -> bool:
        s = self.speedup_vs(self.cfg.baseline)
        return s is not None and s >= self.cfg.target

    def confirm(self) -> None:
        """Time the best against the initial kernel, interleaved, and against the reference."""
        st = self.state
        if st.confirmed_sha == st.best_sha or st.best_iteration is None:
            if st.best_iteration is None and st.confirmed_sha != st.best_sha:
                st.confirmed_sha, st.confirmed_vs_initial = st.best_sha, 1.0
                st.confirmed_vs_initial_low = st.confirmed_vs_initial_high = 1.0
                st.confirmed_vs_reference = (st.reference_ms / st.best_ms) if st.reference_ms and st.best_ms else None
            return
        self.view.message("confirming the best against the initial kernel (interleaved) and the reference")
        try:
            b = self.evaluator.bench(self.lib, self.initial_lib, StageTimes(), with_reference=True)[0]
        except IterationEnded as e:
            self.view.message(f"[yellow]confirmation bench failed[/yellow]: {e.reason}")
            return
        dump(self.run_dir / "confirm.json", b)
        ci = b.speedup_vs_baseline
        st.confirmed_sha = st.best_sha
        st.confirmed_vs_initial = ci.median if ci else None
        st.confirmed_vs_initial_low, st.confirmed_vs_initial_high = (ci.low, ci.high) if ci else (None, None)
        st.confirmed_vs_reference = b.speedup_vs_reference
        self.save()


def dump(path: Path, model) -> None:
    """A typed result (or plain JSON data) as an artifact of the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=2) if hasattr(model, "model_dump_json") else json.dumps(model))
