"""`agent check [TASK]`: the instruments in order (build, launch check, parity, bench), stopping at
the first failure. `agent doctor`: what this machine has for the CPU and GPU paths, with fixes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tools.console import make_console
from tools.results import BuildStatus, CheckSummary


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="build, launch-check, parity and bench one task")
    p.add_argument("task", nargs="?", help="kernels/TASK (default: [tool.agent].task, else the first task in the "
                   "repository's kernels/ that fits this machine)")
    p.add_argument("--build-dir", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print the CheckSummary as JSON")
    p.add_argument("--knobs", choices=["committed", "each", "all"], default="committed",
                   help="which knob values get build and parity: the committed ones (default); each allowed value, "
                        "one knob at a time; or every configuration the restrictions allow")
    p.set_defaults(func=cmd_check)


# --- check -------------------------------------------------------------------------------------
class _Steps:
    """The rows of the check table, in order."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, step: str, status: str, detail: str) -> None:
        self.rows.append((step, status, detail))


def _ignore_runs(runs: Path) -> None:
    """The runs folder default_build_dir chose, out of `git status` where a repository holds it."""
    from agent.optimize import gitops
    try:
        gitops.ensure_runs_ignored(gitops.open_repo(runs.parent), runs)
    except gitops.GitError:
        pass                 # no repository: nothing to keep clean


def run_check(task_path: Path, build_dir: Path | None = None, knobs: str = "committed",
              say: Callable[[str], None] = lambda _: None) -> tuple[CheckSummary, _Steps]:
    """_check, with the table's notes (a rebuild that recompiles torch's headers, a launch on the legacy stream, the
    knob values left unchecked) in the summary too, so that --json carries them."""
    summary, steps = _check(task_path, build_dir, knobs, say)
    summary.notes = [f"{step}: {detail}" for step, status, detail in steps.rows if status == "note"]
    return summary, steps


def _check(task_path: Path, build_dir: Path | None, knobs: str,
           say: Callable[[str], None]) -> tuple[CheckSummary, _Steps]:
    """Build, then the pipeline every candidate goes through (Evaluator.evaluate_candidate: the static
    launch check, parity and the main-shape bench with the reference, in one child), then the dynamic
    launch check where a GPU is visible; then, with `knobs` each or all, the other allowed knob values
    (agent/sweep/knobcheck.py). Stops at the first failure; `say` gets the progress of the knobs' builds."""
    from agent.evaluation.attempt import Attempt
    from agent.evaluation.ended import CompileFailed, IterationEnded
    from agent.evaluation.evaluate import Evaluator
    from agent.review.show import throughput
    from tools.measure.cpu_peak import peak_for
    from agent.records.schema import StageTimes
    from tools.build.build import default_build_dir
    from tools.isolation.checkout import checkout_of
    from tools.task import load_task

    task = load_task(task_path)
    steps = _Steps()
    times = StageTimes()
    if build_dir is None:   # runs/_build in the task's repository, kept out of its git status
        build_dir = default_build_dir(task)
        _ignore_runs(build_dir.parents[1])
    ev = Evaluator(task, build_dir, None, checkout=checkout_of(task.root))
    try:
        b = ev.build(times)
    except CompileFailed as e:
        b = e.result
    kern = "; ".join(f"{k.name.split('(')[0]}: {k.registers} regs, {k.spill_stores_bytes} B spilled, "
                     f"{k.smem_static_bytes} B smem" for k in b.kernels)
    steps.add("build", b.status.value, b.message or f"{b.steps_run} steps, {b.seconds:.1f}s" + (f"; {kern}" if kern else ""))
    from tools.backends.backend import slow_rebuild_note
    note = slow_rebuild_note(task)
    if note:
        steps.add("rebuild", "note", note)
    legacy = _legacy_stream_note(task)
    if legacy:
        steps.add("stream", "note", legacy)
    summary = CheckSummary(task=task.name, build=b, ok=False)
    if b.status != BuildStatus.ok:
        return summary, steps

    ev.limits = task.backend.limits(b.arch)
    a = Attempt(iteration=0, run_id="check", started="", parent_sha="")
    failed: IterationEnded | None = None
    try:
        ev.evaluate_candidate(Path(b.lib_path), None, times, into=a, launch_context=ev.launch_context(b, None),
                              with_reference=True, memcheck=True)
    except IterationEnded as e:
        e.fill(a)
        failed = e
    except Exception as e:  # noqa: BLE001 - the instrument's own bug: one line, not a traceback
        steps.add("evaluate", "error", f"the evaluate pipeline raised {type(e).__name__}: {e}")
        return summary, steps
    summary.launch, summary.parity = a.launch, a.parity
    if a.launch is not None:
        steps.add("launch (static)", a.launch.status.value, a.launch.message)
    if a.parity is not None:
        steps.add("parity", a.parity.status.value, a.parity.message or f"{len(a.parity.checks)} checks")
    for m in (a.parity.memcheck, a.parity.racecheck) if a.parity is not None else ():   # a GPU task (tools/judge/sanitize.py)
        if m is not None:
            steps.add(m.tool, {"skipped": "not available", "error": "note"}.get(m.status, m.status), m.message)
    if a.bench is not None:
        summary.bench = [a.bench]
        r = a.bench
        cand = r.timing("candidate")
        detail = r.message or (f"{cand.median_ms:.4f} ms median" if cand else "")
        if r.speedup_vs_reference is not None and "vs reference" not in detail:
            detail += f", {r.speedup_vs_reference:.2f}x vs reference"
        r.peak = peak_for(task, r.peak)     # a CPU task: this machine's measured peaks (tools/measure/cpu_peak.py)
        tp = throughput(cand, r.peak) if cand else ""
        detail += f"; {tp}" if tp and r.status.value == "ok" else ""
        steps.add(f"bench {','.join(f'{k}={int(v)}' for k, v in r.shape.items())}", r.status.value, detail)
    if failed is not None:
        if a.parity is None and a.launch is not None and a.launch.status.value in ("ok", "not_applicable"):
            steps.add("parity", "error", failed.reason)   # the child died before it said anything
        return summary, steps
    if a.launch is not None and a.launch.status.value == "ok":
        try:
            summary.launch = ev.verify_launch(Path(b.lib_path), a.launch, times)
        except IterationEnded as e:
            summary.launch = e.result if e.result is not None else summary.launch
            steps.add("launch (trace)", summary.launch.status.value, e.reason)
            return summary, steps
        if summary.launch is not a.launch:
            steps.add("launch (trace)", summary.launch.status.value, summary.launch.message)
    summary.ok = True
    if task.spec.knobs and knobs in ("each", "all"):
        from agent.sweep.knobcheck import check_knobs, summary_line
        # inside the build folder (runs/_build/NAME by default, out of git status; or the one --build-dir
        # named): never beside it, where a relative --build-dir would put it in the user's checkout
        out = Path(tempfile.mkdtemp(prefix=".knobs-", dir=build_dir))
        summary.knobs = check_knobs(task, knobs, Path(b.lib_path), build_dir, out, say)   # type: ignore[arg-type]
        summary.ok = not summary.knobs.failures
        steps.add(f"knobs ({knobs})", "ok" if summary.ok else "failed", summary_line(summary.knobs))
    elif task.spec.knobs:
        from agent.sweep.knobcheck import configurations
        n = {w: len(configurations(task, w)[1]) for w in ("each", "all")}   # type: ignore[arg-type]
        steps.add("knobs", "note", f"only the committed values checked; --knobs each builds and checks each other "
                  f"allowed value ({n['each']} configurations), --knobs all every configuration ({n['all']})")
    return summary, steps


def _legacy_stream_note(task) -> str | None:
    """A torch extension's CUDA launches that name no stream: right for a caller on the default stream (the judge's
    calls, KernelBench's evaluator), wrong for a PyTorch caller on a torch.cuda.Stream (torch's streams are
    non-blocking: they do not wait for stream 0). Said, not refused: the kernel is honest where it is called."""
    if task.spec.form != "torch_extension" or not task.backend.gpu:
        return None
    from tools.backends.cu_scan import default_stream_launches
    found = [f"{f}:{','.join(map(str, lines))}" for f in task.spec.sources if f.endswith(".cu")
             for lines in [default_stream_launches(task.path(f).read_text(errors="replace"))] if lines]
    if not found:
        return None
    return (f"{' '.join(found)}: launches on the legacy default stream (no stream in <<<>>>): right for a caller on the "
            "default stream, but a PyTorch caller on a torch.cuda.Stream reads the output before it is written "
            "(torch's streams do not wait for stream 0). Launch on at::cuda::getCurrentCUDAStream()")


def cmd_check(args) -> int:
    from agent.optimize.session import choose_task, UsageError
    try:   # the same choice as `agent optimize`: the argument, [tool.agent] task, the repository's kernels/
        task_path, why = choose_task(args.task, Path.cwd())
    except UsageError as e:
        make_console(stderr=True).print(f"[red]error[/red]: {escape(str(e))}", highlight=False)
        return 2
    make_console(stderr=True).print(why, highlight=False, markup=False)
    err = make_console(stderr=True)
    summary, steps = run_check(task_path, args.build_dir, args.knobs,
                               lambda line: err.print(line, highlight=False, markup=False))
    if args.json:
        print(summary.model_dump_json())
    else:
        out = make_console()
        t = Table(title=escape(f"agent check {summary.task}"))   # a title is markup: the task's name escaped
        t.add_column("step")
        t.add_column("status")
        t.add_column("detail", overflow="fold")
        colors = {"ok": "green", "not_applicable": "dim", "not available": "yellow", "not run": "dim", "note": "yellow"}
        for step, status, detail in steps.rows:
            # the detail quotes the compiler and the instruments: text, not markup (`xr[i]` kept its `[i]`)
            t.add_row(Text(step), Text(status, style=colors.get(status, "red")), Text(detail))
        out.print(t)
        if summary.knobs is not None and summary.knobs.failures:
            f = Table(title="knob values that fail")
            for col in ("knobs (moved from the committed values)", "outcome", "reason"):
                f.add_column(col, overflow="fold")
            for x in summary.knobs.failures:
                f.add_row(Text(", ".join(f"{k}={v}" for k, v in x.moved.items())), Text(x.outcome, style="red"),
                          Text(x.reason))
            out.print(f)
        missing = [step for step, status, _ in steps.rows if status == "not available"]
        if summary.ok:
            out.print("[green]all checks passed[/green]")
        elif missing:
            out.print(f"[yellow]incomplete[/yellow]: {escape(', '.join(missing))} not available here, so the task is "
                      "not verified")
        else:
            out.print("[red]not ok[/red]: see the first failing step")
    return 0 if summary.ok else 1
