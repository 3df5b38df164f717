"""Launch (CTA) check, DESIGN step 5: is the launch geometry legal and big enough for the GPU?

static_check: the library's own launch plan (asked in a child process; no GPU needed) plus the ptxas resources of
the build, on the main shape and, rule by rule, on every other shape parity runs (the rules: tools/measure/launch_rules.py).
dynamic_check (GPU): the geometry the driver really saw, from the torch profiler trace of one run of the main shape (or,
from_profile, from an Nsight Compute pass over every launch of one call), checked by the same rules and compared with
the plan (a plan that lies is rejected). A task without launch_plan (a torch extension as its author wrote it) passes
the static check with no launches, and the trace alone is checked, the parent's CTA count included; on a machine
without a GPU its launch is not checked, and the result says so.

    python -m tools.measure.launch kernels/TASK [--json] [--build-dir D] [--static-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.results import (BuildResult, BuildStatus, DeviceLimits, KernelResources, Launch, LaunchResult,
                           LaunchStatus, LaunchViolation)
from tools.isolation.sandbox import ProcStatus, run_python_json
from tools.measure.launch_rules import (CHILD, check_rules, launch_result, main_shape_json, match_resources,
                                        per_launch)
from tools.task import Task, shape_label


# --- static ------------------------------------------------------------------------------------
def static_check(task: Task, build: BuildResult, limits: DeviceLimits, parent: LaunchResult | None = None,
                 *, timeout_s: float = 120, scratch_root: Path | None = None) -> LaunchResult:
    if not task.backend.gpu:
        return LaunchResult(status=LaunchStatus.not_applicable, message="CPU task: no launch geometry", limits=limits)
    if build.status != BuildStatus.ok or not build.lib_path:
        return LaunchResult(status=LaunchStatus.error, limits=limits,
                            message=f"no library to check (build status {build.status.value})")
    proc, data = run_python_json(CHILD, ["plan", str(task.root), build.lib_path,
                                         main_shape_json(task)], timeout_s, scratch_root)
    if data is None:
        data = {"ok": False, "error": f"launch-plan child {proc.reason()}"}
    return from_plan(task, data, build.kernels, limits, parent)


def from_context(task: Task, plan: dict, ctx: dict) -> LaunchResult:
    """from_plan for a plan answered by the process that loaded the library (the judge's host, the
    sweep's batch child), with the context the agent sent: {limits, kernels, parent}."""
    parent = LaunchResult.model_validate(ctx["parent"]) if ctx.get("parent") else None
    return from_plan(task, plan, [KernelResources.model_validate(k) for k in ctx.get("kernels", [])],
                     DeviceLimits.model_validate(ctx["limits"]), parent)


def from_plan(task: Task, data: dict, kernels: list[KernelResources], limits: DeviceLimits,
              parent: LaunchResult | None = None) -> LaunchResult:
    """The static check proper: the plan (what _plan_child.plan_from answered) with ptxas's resources,
    against the device's limits and the parent's geometry. Pure: no process, no GPU."""
    if not data.get("ok"):
        return LaunchResult(status=LaunchStatus.error, limits=limits,
                            message=f"launch plan unavailable: {data.get('error')}")
    if data.get("planned") is False:
        return LaunchResult(status=LaunchStatus.ok, limits=limits, parent_main_ctas=parent.main_ctas if parent else None,
                            own_kernels=[k.name for k in kernels],
                            message="no launch_plan in the task: the launch is checked from a profiler trace on the GPU")
    launches = [planned(item, kernels) for item in data["launches"]]
    if not launches:
        return LaunchResult(status=LaunchStatus.error, limits=limits, message="launch_plan returned no launches")
    violations, main_ctas = check_rules(task, launches, limits, parent)
    violations += other_shapes(data.get("others", []), kernels, limits)
    return launch_result("static", launches, limits, violations, main_ctas)


def other_shapes(others: list[dict], kernels: list[KernelResources], limits: DeviceLimits) -> list[LaunchViolation]:
    """The per-launch rules that make a launch fail on every other shape the plan was asked for (tools/judge/_plan_child.py
    plan_shapes), each rule and kernel named once, on the first shape that breaks it. A block that is not a multiple of
    32 is a cost, not a failure: judged on the main shape only (a block of min(N, 256) threads on a row of 5 is right)."""
    out: list[LaunchViolation] = []
    named: set[tuple[str, str]] = set()
    for item in others:
        label = shape_label(item["shape"])

        def bad(rule: str, ln: Launch, msg: str) -> None:
            if rule != "block_multiple_of_32" and (rule, ln.kernel) not in named:
                named.add((rule, ln.kernel))
                out.append(LaunchViolation(rule=rule, kernel=ln.kernel, message=f"{ln.kernel} on {label}: {msg}"))

        for it in item["launches"]:
            per_launch(planned(it, kernels), limits, bad)
    return out


def planned(item: dict, kernels: list[KernelResources]) -> Launch:
    """A plan's launch entry with ptxas's resources of its kernel."""
    res = match_resources(item["kernel"], kernels)
    return Launch(kernel=item["kernel"], grid=tuple(item["grid"]), block=tuple(item["block"]),
                  smem_dynamic_bytes=item["smem_dynamic_bytes"], smem_static_bytes=res.smem_static_bytes if res else None,
                  registers=res.registers if res else None, source="plan")


# --- dynamic -----------------------------------------------------------------------------------
def _smem_matches(traced: int | None, planned: Launch) -> bool:
    if traced is None:
        return True
    ok = {planned.smem_dynamic_bytes}
    if planned.smem_static_bytes is not None:
        ok.add(planned.smem_dynamic_bytes + planned.smem_static_bytes)
    return int(traced) in ok


def compare_with_plan(traced: list[Launch], trace_smem: list[int | None], plan: LaunchResult) -> list[LaunchViolation]:
    """The trace must show the planned launches, in order, with the planned geometry."""
    out = []
    used = 0
    for p in plan.launches:
        hit = next((i for i in range(used, len(traced)) if p.kernel in traced[i].kernel), None)
        if hit is None:
            seen = ", ".join(sorted({t.kernel.split("(")[0] for t in traced})) or "no kernels"
            out.append(LaunchViolation(rule="plan_mismatch", kernel=p.kernel, message=(
                f"{p.kernel}: planned but not seen in the trace (the trace shows: {seen})")))
            continue
        t, used = traced[hit], hit + 1
        if t.grid != p.grid or t.block != p.block or not _smem_matches(trace_smem[hit], p):
            out.append(LaunchViolation(rule="plan_mismatch", kernel=p.kernel, message=(
                f"{p.kernel}: the plan says grid {p.grid} block {p.block} smem {p.smem_dynamic_bytes} B, the GPU ran "
                f"grid {t.grid} block {t.block} smem {trace_smem[hit]} B: launch_plan must describe the real launch")))
    return out


def dynamic_check(task: Task, lib_path: str, limits: DeviceLimits, plan: LaunchResult,
                  *, timeout_s: float = 180, scratch_root: Path | None = None) -> LaunchResult:
    if not task.backend.gpu:
        return LaunchResult(status=LaunchStatus.not_applicable, mode="dynamic", limits=limits,
                            message="CPU task: no launch geometry")
    from tools.backends.device import cuda_present
    if not cuda_present():
        return LaunchResult(status=LaunchStatus.not_applicable, mode="dynamic", limits=limits,
                            message="no CUDA GPU here: only the static check ran")
    proc, data = run_python_json(CHILD, ["trace", str(task.root), lib_path, main_shape_json(task),
                                         task.spec.distributions[0]], timeout_s, scratch_root)
    if data is None or not data.get("ok"):
        why = data.get("error") if data else f"trace child {proc.reason()}"
        if proc.status in (ProcStatus.crashed, ProcStatus.timeout):
            why = f"trace child {proc.reason()}"
        return LaunchResult(status=LaunchStatus.error, mode="dynamic", limits=limits,
                            message=f"could not trace the launch: {why}")
    traced, smem = [], []
    for item in data["launches"]:
        total = item.get("shared_memory")
        traced.append(Launch(kernel=item["kernel"], grid=tuple(item["grid"]), block=tuple(item["block"]),
                             smem_dynamic_bytes=int(total or 0), smem_static_bytes=0,
                             registers=item.get("registers"), source="trace"))
        smem.append(total)
    return judge_traced(task, traced, smem, limits, plan)


def from_profile(task: Task, report, limits: DeviceLimits, plan: LaunchResult) -> LaunchResult | None:
    """The dynamic check from an Nsight Compute report of every launch of one call of the main shape
    (tools/profile/ncu.py profile_task(whole_call=True)): its LaunchStats are the geometry the driver saw, judged by
    the same rules and held to the plan as the trace's are. None where the report cannot serve (not ncu's, or no
    launches in it): the caller traces the launch instead."""
    if report is None or report.status.value != "ok" or report.source != "ncu" or not report.kernels:
        return None
    traced = [Launch(kernel=k.demangled or k.name, grid=tuple(k.grid), block=tuple(k.block),
                     smem_dynamic_bytes=int(k.smem_dynamic_bytes or 0), smem_static_bytes=k.smem_static_bytes,
                     registers=k.registers_per_thread, source="ncu") for k in report.kernels]
    res = judge_traced(task, traced, [k.smem_dynamic_bytes for k in report.kernels], limits, plan)
    res.message += " (from the Nsight Compute pass that is also the profile)"
    return res


def judge_traced(task: Task, traced: list[Launch], smem: list[int | None], limits: DeviceLimits,
                 plan: LaunchResult) -> LaunchResult:
    """The launches one call of the main shape really made (a trace's or a profile's), by the rules and against the
    plan; `smem`: each launch's shared memory as the tool saw it (None: not known)."""
    if not traced:
        return LaunchResult(status=LaunchStatus.error, mode="dynamic", limits=limits,
                            message="the trace shows no kernel launch for the main shape")
    parent = None
    if plan.parent_main_ctas:   # no plan: the trace is the only geometry, so it meets the parent's here
        parent = LaunchResult(status=LaunchStatus.ok, main_ctas=plan.parent_main_ctas)
    violations, main_ctas = check_rules(task, traced, limits, parent, plan.own_kernels)
    violations += compare_with_plan(traced, smem, plan)
    return launch_result("dynamic", traced, limits, violations, main_ctas)


# --- CLI ---------------------------------------------------------------------------------------
def render(results: list[LaunchResult]) -> None:
    from rich.markup import escape
    from rich.table import Column, Table
    from rich.text import Text

    from tools.console import make_console
    con = make_console()
    for res in results:
        color = {"ok": "green", "rejected": "red", "error": "red"}.get(res.status.value, "yellow")
        lim = res.limits
        con.print(f"[bold]{res.mode}[/bold] [{color}]{res.status.value}[/{color}] "
                  + (escape(f"({lim.name}, {lim.sm_count} SMs, source {lim.source})") if lim else ""))
        if res.launches:
            t = Table(Column("kernel", overflow="fold", min_width=24), "grid", "block", "CTAs", "smem dyn+static B",
                      "regs", "source")
            for ln in res.launches:
                t.add_row(Text(ln.kernel), "x".join(map(str, ln.grid)), "x".join(map(str, ln.block)), str(ln.ctas),
                          f"{ln.smem_dynamic_bytes}+{ln.smem_static_bytes if ln.smem_static_bytes is not None else '?'}",
                          str(ln.registers if ln.registers is not None else "?"), Text(ln.source))
            con.print(t)
        for v in res.violations:
            con.print(f"  [red]{escape(v.rule)}[/red] {escape(v.message)}", highlight=False)
        if not res.violations:
            con.print(f"  {res.message}", highlight=False, markup=False)


def main(argv: list[str] | None = None) -> int:
    from tools.build.build import build, default_build_dir
    from tools.backends.device import device_limits
    from tools.task import TaskError, load_task
    ap = argparse.ArgumentParser(prog="python -m tools.measure.launch", description="Build a task, then check its launches.")
    ap.add_argument("task")
    ap.add_argument("--build-dir", type=Path, default=None)
    ap.add_argument("--static-only", action="store_true", help="skip the GPU trace even when a GPU is present")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        task = load_task(args.task)
    except TaskError as e:
        print(f"bad task: {e}", file=sys.stderr)
        return 2
    b = build(task, args.build_dir or default_build_dir(task))
    if b.status != BuildStatus.ok:
        if args.json:
            print(json.dumps({"build": b.model_dump(mode="json"), "static": None, "dynamic": None}))
        else:
            print(f"build {b.status.value}: {b.message}", file=sys.stderr)
        return 1
    limits = device_limits(b.arch)
    static = static_check(task, b, limits)
    dynamic = None
    if not args.static_only and static.status == LaunchStatus.ok:
        dynamic = dynamic_check(task, b.lib_path or "", limits, static)
    if args.json:
        print(json.dumps({"build": b.model_dump(mode="json", exclude={"log"}), "static": static.model_dump(mode="json"),
                          "dynamic": dynamic.model_dump(mode="json") if dynamic else None}))
    else:
        render([static] + ([dynamic] if dynamic else []))
    bad = [r for r in (static, dynamic) if r and r.status in (LaunchStatus.rejected, LaunchStatus.error)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
