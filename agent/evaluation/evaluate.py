"""Evaluate one version of a task: build, launch (CTA) check, parity, bench, cheapest first.

Each way out is an exception carrying the outcome and a one-line reason, which the loop logs and
shows to the proposer. Optimize, `agent sweep`, `agent check` and `agent gate` share evaluate_candidate().
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.evaluation.attempt import Attempt, confirm_rounds, ratio
from agent.evaluation.ended import (BenchFailed, CompileFailed, IterationEnded, LaunchRejected, ParityFailed,
                                    RangeParityFailed, TouchedCheckout)
from agent.evaluation.spares import Spares
from agent.records.schema import StageTimes
from tools.results import (BenchResult, BenchStatus, BuildResult, BuildStatus, DeviceLimits, LaunchResult,
                           LaunchStatus, ParityResult, ParityStatus)
from tools.task import Task


class Evaluator:
    """The instruments for one task, with the run's build directory and device limits."""

    def __init__(self, task: Task, build_dir: Path, limits: DeviceLimits | None, scratch_root: Path | None = None,
                 checkout: Path | str | None = None):
        self.task, self.build_dir, self.limits = task, build_dir, limits
        # the loop's candidate stages' time limits, measured at the run's setup (agent/optimize/best.py, tools/judge/budgets.py)
        self.budgets: dict = {}
        # the loop's minimum gain (--min-gain): a candidate's first bench below it skips the probes only a keep needs
        self.keep_gain: float | None = None
        # an earlier build whose objects of non-editable sources may be linked as they are (the sweep's binding, once)
        self.reuse_objects: Path | list[Path] | None = None
        # each child that loads a candidate runs in a directory of its own under here (tools/isolation/scratch.py)
        self.scratch_root = scratch_root or Path(build_dir).parent / "scratch"
        # the user's checkout: file modes compared around each candidate child (tools/isolation/checkout.py)
        self.watch = None
        # (library, report) of the last ncu pass that served a launch check (verify_launch's `profile`); `no_ncu`: why
        # this machine's ncu cannot take it (not tried again); `later`: the sanitizers a confirmation leaves for after
        # its keep (the loop's, agent/optimize/revoke.py)
        self.taken, self.no_ncu, self.later = None, None, ()
        self.spare = Spares()     # a keep's ncu pass and judge children, started early (agent/evaluation/spares.py)
        if checkout is not None:
            from tools.isolation.checkout import CheckoutWatch
            self.watch = CheckoutWatch(checkout)

    def _modes(self) -> dict | None:
        return self.watch.modes() if self.watch is not None else None

    def _checkout_unchanged(self, before: dict | None) -> None:
        """After a candidate child: a file mode it changed in the user's checkout is put back, and the
        candidate fails for it (the fence stops writes, not chmod)."""
        changed = self.watch.restore(before) if self.watch is not None and before is not None else []
        if changed:
            raise TouchedCheckout("the candidate changed the user's checkout: " + "; ".join(changed[:5])
                                  + (f" (+{len(changed) - 5} more)" if len(changed) > 5 else ""))

    def build(self, times: StageTimes) -> BuildResult:
        """The source scan (tools/build/scan.py: what no kernel needs, in milliseconds, the line quoted), then the
        build."""
        from tools.build.build import build
        from tools.build.expand import expand
        from tools.build.scan import rejection, scan_expanded, scan_task
        t0 = time.monotonic()
        hits = scan_task(self.task)
        if not hits:
            # the sources as the compiler reads them (macros expanded, tools/build/expand.py), preprocessed beside
            # the build: what only the preprocessor builds is refused before anything runs
            with ThreadPoolExecutor(1) as pool:
                compiled = pool.submit(expand, self.task)
                res = build(self.task, self.build_dir, reuse=self.reuse_objects)
                ex = compiled.result()
            hits = scan_expanded(ex.lines, self.task.root, set(self.task.spec.scan.allow), units=ex.units)
            if ex.failed:
                res.log += "\nscan: the sources as compiled were not read (" + "; ".join(ex.failed) + ")\n"
        if hits:
            times.build += time.monotonic() - t0
            res = BuildResult(status=BuildStatus.scan_rejected, message=rejection(hits), build_dir=str(self.build_dir),
                              seconds=time.monotonic() - t0)
            raise CompileFailed(f"{res.status.value}: {first_lines(res.message, 8)}", res)
        times.build += time.monotonic() - t0
        if res.status != BuildStatus.ok:
            raise CompileFailed(f"{res.status.value}: {first_lines(res.message, 8)}", res)
        return res

    def launch(self, build: BuildResult, parent: LaunchResult | None, times: StageTimes,
               dynamic: bool = True) -> LaunchResult:
        """The static check (the library's own plan + ptxas against the limits), then, on a GPU and
        when `dynamic`, the real geometry from a profiler trace. The loop asks for the dynamic part
        only for a candidate about to be kept (it costs a fresh torch process, 12-15 s on an H200)."""
        if not self.task.backend.gpu or self.limits is None:
            return LaunchResult(status=LaunchStatus.not_applicable, message="CPU task: no launch geometry")
        from tools.measure import launch as launch_tool
        t0 = time.monotonic()
        try:
            res = launch_tool.static_check(self.task, build, self.limits, parent, scratch_root=self.scratch_root)
            if res.status == LaunchStatus.ok and dynamic:
                res = self._dynamic(build.lib_path, res)
        finally:
            times.launch += time.monotonic() - t0
        return launch_ok(res)

    def verify_launch(self, lib: Path, static: LaunchResult, times: StageTimes,
                      profile: tuple[Path, int] | None = None) -> LaunchResult:
        """The dynamic part alone, for a candidate that passed everything else. With `profile` (its folder, its tier),
        on a GPU with Nsight Compute, one ncu pass over every launch of one call is both the launch trace and the
        profile (tools/profile/ncu.py whole_call): take_profile() hands it to the keep; where it cannot serve, the
        torch profiler traces the launch as before."""
        self.taken = None     # a pass over an earlier candidate (one the confirmation then refused) serves no keep
        if static.status != LaunchStatus.ok:
            return static
        t0 = time.monotonic()
        try:
            res = self._from_profile(lib, static, *profile) if profile is not None else None
            if res is None:
                res = self._dynamic(str(lib), static)
        finally:
            times.launch += time.monotonic() - t0
        return launch_ok(res)

    def _from_profile(self, lib: Path, static: LaunchResult, out_dir: Path, tier: int) -> LaunchResult | None:
        if not self.task.backend.gpu or self.limits is None or self.limits.source != "device":
            return None
        from tools.backends.toolchain import find_ncu
        from tools.measure.launch import from_profile
        from tools.profile.model import ProfileStatus
        from tools.profile.ncu import CALL_LAUNCHES_MAX
        if self.no_ncu is not None or find_ncu() is None:
            return None
        rep = self.spare.profile(self.task, lib, tier, out_dir)   # the keep's one pass (the one held, if it serves)
        if rep.status in (ProfileStatus.counters_not_permitted, ProfileStatus.driver_incompatible):
            self.no_ncu = rep.status.value      # the machine's, not the candidate's: every later pass would fail so
        self.taken = (Path(lib), rep)
        if len(rep.kernels) >= CALL_LAUNCHES_MAX:   # the pass's cap: launches past it unseen, the trace sees them all
            return None
        return from_profile(self.task, rep, self.limits, static)

    def take_profile(self, lib: Path):
        """The report of the ncu pass that checked `lib`'s launch (verify_launch), once; None where none served."""
        taken, self.taken = self.taken, None
        if taken is None or Path(taken[0]) != Path(lib) or not taken[1].kernels:
            return None
        return taken[1]

    def _dynamic(self, lib_path: str, static: LaunchResult) -> LaunchResult:
        if self.limits is None or self.limits.source != "device":
            return static   # compile-only machine: the static check is all there is
        from tools.measure.launch import dynamic_check
        return dynamic_check(self.task, lib_path, self.limits, static, scratch_root=self.scratch_root)

    def parity(self, lib: Path, times: StageTimes, seed: int | None = None, extent: str = "full") -> ParityResult:
        from tools.measure.parity import run_parity
        t0, before = time.monotonic(), self._modes()
        res = run_parity(self.task, lib, seed=seed, scratch_root=self.scratch_root, extent=extent)
        times.parity += time.monotonic() - t0
        self._checkout_unchanged(before)
        if res.status != ParityStatus.ok:
            raise ParityFailed(f"parity {res.status.value}: {res.message}", res)
        return res

    def confirm_bench(self, lib: Path, baseline: Path | None, a: Attempt, warm=None) -> BenchResult:
        """The confirmation for a candidate about to be kept, in ONE fresh child: the parity the loop's first one
        (parity_extent="quick") left out, the other seeds, the extremes of the task's [dims] and the value draws past
        the sample (tools/measure/domains.py: every task has them, so there is always such a parity) (issue 39's probe
        budget, issue 44's cost of a rejected candidate: a candidate pays for them once, not on every iteration that
        loses at the bench), then the second bench against `baseline`. The child draws a root seed of its own: its
        listed shapes get seeds the first parity did not use, its hidden shapes are new ones (a full parity's worth of
        checks, not the first one's hidden shapes again). These checks join a.parity; their failure raises
        RangeParityFailed (the iteration's parity failure), the bench's BenchFailed. The bench times the reference too:
        a kept candidate's figure against it is measured beside it (agent/optimize/best.py side_by_side); not the
        probes of the library alone that its first bench ran clean (tools/judge/judge.py bench)."""
        tmp = Attempt(iteration=0, run_id="", started="", parent_sha="")
        rounds = confirm_rounds(ratio(a.bench), self.task.spec.bench.rounds)   # sized to the first bench's noise
        done = tuple(a.bench.probe_seconds) if a.bench is not None and a.bench.status == BenchStatus.ok else ()
        try:   # on a GPU, compute-sanitizer memcheck after the range parity (tools/judge/sanitize.py)
            self.evaluate_candidate(lib, baseline, a.times, into=tmp, parity_extent="rest", warm=warm,
                                    memcheck=self.task.backend.gpu, with_reference=True, rounds=rounds,
                                    probes_done=done)
        except ParityFailed as e:
            if e.result is not None:
                a.parity = _joined(a.parity, e.result)
            raise RangeParityFailed(e.reason, a.parity) from None
        finally:
            if tmp.parity is not None and tmp.parity.status == ParityStatus.ok:
                a.parity = _joined(a.parity, tmp.parity)
        return tmp.bench

    def confirm(self, lib: Path, baseline: Path | None, a: Attempt, reparity: bool, save, warm=None) -> None:
        """decide()'s confirmation: quick parity on a fresh seed where the gain is implausible; then one child: what
        quick parity left out, a second bench (a.confirm, saved as confirm-bench.json); a failure of the bench is
        a.confirm_error, one of the parity ends the iteration."""
        try:
            if reparity:
                self.parity(lib, a.times, seed=int(time.time()) % 100000 + 7, extent="quick")
            a.confirm = self.confirm_bench(lib, baseline, a, warm)
            save("confirm-bench.json", a.confirm)
        except RangeParityFailed:
            raise
        except IterationEnded as e:
            a.confirm = e.result if isinstance(e, BenchFailed) and e.result is not None else a.confirm
            a.confirm_error = e.reason

    def rebench(self, lib: Path, baseline: Path | None, a: Attempt, v, save) -> None:
        """decide()'s re-bench of a doubtful bench (`v`, an attempt.Verdict: its stage, rounds and interval): the
        candidate against `baseline` again in a fresh child; the doubtful bench goes to the attempt's undecided list,
        the new one takes its place (saved as rebench-N.json). A failed re-bench of the first bench ends the
        iteration as that bench's failure would; of the confirmation, it leaves the gain unconfirmed."""
        first = v.stage == "bench"
        (a.bench_undecided if first else a.confirm_undecided).append(a.bench if first else a.confirm)
        try:
            res, failed = self.bench(lib, baseline, a.times, rounds=v.rounds, confidence=v.confidence,
                                     with_reference=not first)[0], None
        except BenchFailed as e:
            res, failed = e.result, e
        if res is not None:
            save(f"rebench-{len(a.bench_undecided) + len(a.confirm_undecided)}.json", res)
        if first:
            a.bench = res
            if failed is not None:
                raise failed
        else:
            a.confirm, a.confirm_error = res, (failed.reason if failed is not None else None)

    def launch_context(self, build: BuildResult, parent: LaunchResult | None) -> dict | None:
        """What a child needs to run the static launch check on the plan of the library it loaded
        (tools.judge.judge and tools.judge._batch_child: the host answers the plan, tools.measure.launch
        judges it): the device limits, ptxas' resources, the parent's launch. None for a CPU task or
        where no limits are known."""
        if not self.task.backend.gpu or self.limits is None:
            return None
        return {"limits": self.limits.model_dump(mode="json"),
                "kernels": [k.model_dump(mode="json") for k in build.kernels],
                "parent": parent.model_dump(mode="json") if parent is not None else None}

    def prestart(self, confirmation: bool = False):
        """The candidate's evaluate child, started before its build (its torch and CUDA context start up while nvcc
        runs), and what a keep would need where not held (agent/evaluation/spares.py): a WarmChild the caller closes in
        any case; None when AGENT_NO_PRESTART=1. `confirmation` (confirm()'s, agent/evaluation/keep.py): the one held,
        else one started now, on a GPU with its compute-sanitizer hosts (but those it leaves for later)."""
        if os.environ.get("AGENT_NO_PRESTART") == "1":
            return None
        if confirmation and (held := self.spare.take_confirmation(self.task)) is not None:
            return held
        if not confirmation:
            self.spare.ensure(self)
        from tools.judge.candidate import prestart_candidate
        return prestart_candidate(self.task, self.scratch_root, confirmation and self.task.backend.gpu, self.later)

    def evaluate_candidate(self, lib: Path, baseline: Path | None, times: StageTimes, *,
                           launch_context: dict | None = None, into: Attempt | None = None, warm=None,
                           with_reference: bool = False, verify_launch: bool = False,
                           parity_extent: str = "full", memcheck: bool = False, rounds: int | None = None,
                           profile: tuple[Path, int] | None = None, probes_done: tuple[str, ...] = ()) -> Attempt:
        """The one candidate pipeline of optimize, sweep, `agent check` and `agent gate`: in ONE child,
        the static launch check of the library's own plan (where `launch_context` is given: see
        launch_context()), parity, then the main-shape bench against `baseline` (None: the candidate
        alone) and, `with_reference`, the reference. With `verify_launch`, a candidate that passed all
        of it then gets the dynamic launch check (the profiler trace; on a GPU only; `profile`: verify_launch's).

        Each result goes into the attempt (`into`, or a new one, returned) as soon as it exists; a
        failure raises the stage's IterationEnded with its typed result. The child's start-up, where
        a prestart() `warm` child does not hide it, is charged to parity. `parity_extent`: "quick" leaves
        the other seeds and the [dims] extremes to a parity_extent="rest" before a keep (the loop's probe budget). `memcheck`: on a
        GPU, the candidate under compute-sanitizer memcheck after parity (tools/judge/sanitize.py). The loop's
        candidates ("quick") are held to `budgets`; the confirmation, `agent check` and `agent gate` to the task's."""
        from tools.judge.candidate import run_candidate
        a = Attempt(iteration=0, run_id="", started="", parent_sha="") if into is None else into
        if launch_context is None:
            a.launch = LaunchResult(status=LaunchStatus.not_applicable,
                                    message="CPU task: no launch geometry" if not self.task.backend.gpu
                                    else "no device limits known: no launch check")
        t0, before = time.monotonic(), self._modes()
        launch, par, bench, dropped = run_candidate(self.task, lib, baseline, launch_context=launch_context,
                                                    warm=warm, with_reference=with_reference,
                                                    scratch_root=self.scratch_root, parity_extent=parity_extent,
                                                    memcheck=memcheck, later=self.later if memcheck else (),
                                                    budgets=self.budgets if parity_extent == "quick" else None,
                                                    keep_gain=self.keep_gain if parity_extent == "quick" else None,
                                                    rounds=rounds, probes_done=probes_done)
        a.output_dropped_bytes += dropped
        total = time.monotonic() - t0
        l_secs = launch.seconds if launch is not None else 0.0
        b_secs = sum(b.seconds for b in bench) if bench else 0.0
        times.launch += min(l_secs, total)
        times.bench += min(b_secs, max(total - l_secs, 0.0))
        times.parity += max(total - l_secs - b_secs, 0.0)
        self._checkout_unchanged(before)
        if launch is not None:
            a.launch = launch
            launch_ok(launch)
        if par is None:
            raise ParityFailed("parity: the evaluate child returned no parity result")
        a.parity = par
        if par.status != ParityStatus.ok:
            raise ParityFailed(f"parity {par.status.value}: {par.message}", par)
        if not bench:
            raise BenchFailed("bench: the child returned no result after parity passed")
        a.bench = bench[0]
        bad = next((r for r in bench if r.status != BenchStatus.ok), None)
        if bad is not None:
            raise BenchFailed(f"bench {bad.status.value}: {bad.message}", bench[0])
        if verify_launch:
            a.launch = self.verify_launch(lib, a.launch, times, profile)
        return a

    def bench(self, lib: Path, baseline: Path | None, times: StageTimes, with_reference: bool = False,
              shapes: list[dict] | None = None, rounds: int | None = None,
              confidence: float | None = None) -> list[BenchResult]:
        from tools.measure.bench import run_bench
        t0, before = time.monotonic(), self._modes()
        res = run_bench(self.task, lib, baseline_lib=baseline, shapes=shapes, with_reference=with_reference,
                        scratch_root=self.scratch_root, rounds=rounds, confidence=confidence)
        times.bench += time.monotonic() - t0
        self._checkout_unchanged(before)
        bad = next((r for r in res if r.status != BenchStatus.ok), None)
        if bad is not None:
            raise BenchFailed(f"bench {bad.status.value}: {bad.message}", res[0])
        return res


def _joined(first: ParityResult, then: ParityResult) -> ParityResult:
    """One parity record: the quick one's checks, then the rest's (its status and message where it failed)."""
    ok = then.status == ParityStatus.ok
    return ParityResult(status=then.status, checks=first.checks + then.checks, seconds=first.seconds + then.seconds,
                        message=f"{first.message}; then, before the keep, {then.message}" if ok else then.message,
                        memcheck=then.memcheck or first.memcheck, racecheck=then.racecheck or first.racecheck,
                        later=then.later or first.later)


def launch_ok(res: LaunchResult) -> LaunchResult:
    """The launch check's result, or LaunchRejected with every broken rule (the limit and the shape in each)."""
    if res.status not in (LaunchStatus.ok, LaunchStatus.not_applicable):
        msgs = "; ".join(v.message for v in res.violations) or res.message
        raise LaunchRejected(f"launch {res.status.value}: {msgs}", res)
    return res


def snapshot_lib(lib_path: str | Path, dest: Path) -> Path:
    """Copy a built library out of the build dir (the next build overwrites it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(lib_path, dest)
    return dest


def first_lines(text: str, n: int) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n])
