"""`agent check [TASK]`: the instruments in order (build, launch check, parity, bench), stopping at
the first failure. `agent doctor`: what this machine has for the CPU and GPU paths, with fixes."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
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
    d = subparsers.add_parser("doctor", help="what this machine has: GPU, compilers, ncu, torch, LLM endpoint")
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-probe", action="store_true", help="skip the ncu counter-permission probe (a few seconds)")
    d.set_defaults(func=cmd_doctor)


# --- check -------------------------------------------------------------------------------------
class _Steps:
    """The rows of the check table, in order."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, step: str, status: str, detail: str) -> None:
        self.rows.append((step, status, detail))


def _ignore_runs(runs: Path) -> None:
    """The runs folder default_build_dir chose, out of `git status` where a repository holds it."""
    from agent import gitops
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
    (agent/knobcheck.py). Stops at the first failure; `say` gets the progress of the knobs' builds."""
    from agent.attempt import Attempt
    from agent.evaluate import CompileFailed, Evaluator, IterationEnded
    from agent.review.show import throughput
    from tools.measure.cpu_peak import peak_for
    from agent.runlog import StageTimes
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
        from agent.knobcheck import check_knobs, summary_line
        # inside the build folder (runs/_build/NAME by default, out of git status; or the one --build-dir
        # named): never beside it, where a relative --build-dir would put it in the user's checkout
        out = Path(tempfile.mkdtemp(prefix=".knobs-", dir=build_dir))
        summary.knobs = check_knobs(task, knobs, Path(b.lib_path), build_dir, out, say)   # type: ignore[arg-type]
        summary.ok = not summary.knobs.failures
        steps.add(f"knobs ({knobs})", "ok" if summary.ok else "failed", summary_line(summary.knobs))
    elif task.spec.knobs:
        from agent.knobcheck import configurations
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
    from agent.session import UsageError, choose_task
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


# --- doctor ------------------------------------------------------------------------------------
class DoctorRow(BaseModel):
    name: str
    status: Literal["ok", "warn", "missing"]
    detail: str = ""
    hint: str = ""
    required: bool = False          # needed for the CPU path: missing -> exit code 1


class DoctorReport(BaseModel):
    rows: list[DoctorRow]
    ok: bool                        # everything required for the CPU path is present


def _first_line(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (res.stdout or res.stderr).strip().splitlines()[0] if res.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return ""


def doctor(probe: bool = True) -> DoctorReport:
    from tools.backends import device
    from tools.backends.toolchain import find_cxx, find_ninja, toolchain_hint

    rows: list[DoctorRow] = []
    py_ok = sys.version_info >= (3, 11)
    rows.append(DoctorRow(name="python", status="ok" if py_ok else "missing", required=True,
                          detail=f"{platform.python_version()} ({sys.executable})",
                          hint="" if py_ok else "Python >= 3.11 is required"))

    gpu = device.torch_cuda_available()
    drv = device.driver_info()
    if gpu:
        lim = device.device_limits()
        rows.append(DoctorRow(name="gpu", status="ok", detail=f"{lim.name}, {lim.arch}, {lim.sm_count} SMs, "
                              f"{lim.max_smem_per_block_optin} B smem opt-in, driver {drv.version or '?'}"))
    else:
        detail = "no CUDA GPU visible" + (f" (nvidia-smi: {drv.detail})" if drv.path else "")
        rows.append(DoctorRow(name="gpu", status="missing", detail=detail,
                              hint="CPU tasks run fully; CUDA tasks compile and get the static launch check only"))

    nv = device.nvcc_info()
    rows.append(DoctorRow(name="nvcc", status="ok" if nv.found else "missing",
                          detail=f"{nv.version or '?'} ({nv.path})" if nv.found else "",
                          hint="" if nv.found else toolchain_hint("nvcc")))
    cxx = find_cxx()
    rows.append(DoctorRow(name="c++", status="ok" if cxx else "missing", required=True,
                          detail=f"{_first_line([cxx, '--version'])} ({cxx})" if cxx else "",
                          hint="" if cxx else toolchain_hint("c++")))
    nj = find_ninja()
    rows.append(DoctorRow(name="ninja", status="ok" if nj else "missing", required=True,
                          detail=f"{_first_line([nj, '--version'])} ({nj})" if nj else "",
                          hint="" if nj else toolchain_hint("ninja")))
    git = shutil.which("git")
    rows.append(DoctorRow(name="git", status="ok" if git else "missing", required=True,
                          detail=_first_line([git, "--version"]) if git else "",
                          hint="" if git else "apt-get install git (runs work in git worktrees)"))

    ncu = device.ncu_info()
    if not ncu.found:
        rows.append(DoctorRow(name="ncu", status="warn" if not gpu else "missing", detail="not found",
                              hint="install Nsight Compute (ships with the CUDA toolkit) and put ncu on PATH; "
                                   "without it profiles fall back to the torch profiler trace and ptxas"))
    else:
        row = DoctorRow(name="ncu", status="ok", detail=f"{ncu.version or '?'} ({ncu.path})")
        if gpu and probe:
            pr = device.ncu_counter_probe()
            row.detail += f"; counters: {pr.status}"
            if pr.status != "ok":
                row.status, row.hint = "warn", pr.message
        elif gpu:
            row.detail += "; counters not probed (--no-probe)"
        rows.append(row)

    rep = device.ncu_report_info(ncu.path)
    rows.append(DoctorRow(name="ncu_report", status="ok" if rep.found else "warn",
                          detail=f"{rep.detail} ({rep.path})" if rep.found else "not importable",
                          hint="" if rep.found else "pip install ncu-report, or add <Nsight Compute>/extras/python "
                                                    "to PYTHONPATH"))

    try:
        import torch
        cuda_build = torch.version.cuda or "CPU-only build"
        rows.append(DoctorRow(name="torch", status="ok", required=True,
                              detail=f"{torch.__version__}, CUDA {cuda_build}, cuda available: {gpu}",
                              hint="" if (gpu or not drv.found) else
                              "a driver is present but torch sees no GPU: install a CUDA build of torch"))
    except Exception as e:  # noqa: BLE001
        rows.append(DoctorRow(name="torch", status="missing", required=True, detail=f"{type(e).__name__}: {e}",
                              hint="pip install torch"))

    base = next(((k, os.environ[k]) for k in ("AGENT_BASE_URL", "OPENAI_BASE_URL") if os.environ.get(k)), None)
    key = bool(os.environ.get("OPENAI_API_KEY"))
    if base or key:
        detail = (f"{base[0]}={base[1]}" if base else "api.openai.com (default)") + \
            f", OPENAI_API_KEY {'set' if key else 'not set'}"
        rows.append(DoctorRow(name="llm endpoint", status="ok", detail=detail))
    else:
        rows.append(DoctorRow(name="llm endpoint", status="warn", detail="not configured",
                              hint="set OPENAI_BASE_URL (or AGENT_BASE_URL) and OPENAI_API_KEY, "
                                   "or use the offline heuristic proposer"))
    ok = not any(r.required and r.status == "missing" for r in rows)
    return DoctorReport(rows=rows, ok=ok)


def cmd_doctor(args) -> int:
    rep = doctor(probe=not args.no_probe)
    if args.json:
        print(rep.model_dump_json())
    else:
        out = make_console()
        t = Table(title="agent doctor")
        for col in ("component", "status", "detail", "fix"):
            t.add_column(col, overflow="fold")
        for r in rep.rows:
            c = {"ok": "green", "warn": "yellow", "missing": "red" if r.required else "yellow"}[r.status]
            # versions, paths and the probes' messages as they were printed to us
            t.add_row(r.name, Text(r.status, style=c), Text(r.detail), Text(r.hint))
        out.print(t)
        if not rep.ok:
            out.print("[red]something the CPU path needs is missing[/red]")
    return 0 if rep.ok else 1
