"""Launch (CTA) check, DESIGN step 5: is the launch geometry legal and big enough for the GPU?

static_check: the library's own launch plan (asked in a child process; no GPU needed) plus the
ptxas resources of the build, on the main shape and, rule by rule, on every other shape parity runs. dynamic_check (GPU): the geometry the driver really saw, from the
torch profiler trace of one run of the main shape, checked by the same rules and compared with the
plan (a plan that lies is rejected). A task without launch_plan (a torch extension as its author
wrote it) passes the static check with no launches, and the trace alone is checked, the parent's CTA
count included; on a machine without a GPU its launch is not checked, and the result says so.

    python -m tools.measure.launch kernels/TASK [--json] [--build-dir D] [--static-only]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable

from tools.results import (BuildResult, BuildStatus, DeviceLimits, KernelResources, Launch, LaunchResult,
                           LaunchStatus, LaunchViolation)
from tools.isolation.sandbox import ProcStatus, run_python_json
from tools.task import Task, shape_label

CHILD = "tools.judge._plan_child"
REG_ALLOC_UNIT = 256        # registers are allocated per warp in units of 256


# --- the rules ----------------------------------------------------------------------------------
def block_registers(regs_per_thread: int, threads: int) -> int:
    """Registers a block really takes: per-warp allocation rounded to the allocation unit."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(regs_per_thread * 32 / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    return per_warp * warps


def main_index(task: Task, launches: list[Launch], own: list[str] | None = None) -> int | None:
    """The first launch matching task.kernel_regex, else the first of the build's own kernels (`own`, where known:
    not a cuBLAS or ATen launch before it), else the first; none where the build compiled none (a scaffold)."""
    if not launches:
        return None
    if task.spec.kernel_regex:
        rx = re.compile(task.spec.kernel_regex)
        for i, ln in enumerate(launches):
            if rx.search(ln.kernel):
                return i
    if own is not None:
        names = {_base_name(n) for n in own}
        return next((i for i, ln in enumerate(launches) if _base_name(ln.kernel) in names), 0 if own else None)
    return 0


def per_launch(ln: Launch, limits: DeviceLimits, bad: Callable[[str, Launch, str], None]) -> None:
    """The rules one launch must keep on any shape (the block, the grid, shared memory, registers)."""
    t = ln.threads
    if min(ln.block) < 1:
        bad("block_invalid", ln, f"block {ln.block} has a dimension below 1")
        return
    if t > limits.max_threads_per_block:
        bad("block_too_large", ln, f"block {ln.block} = {t} threads > {limits.max_threads_per_block} per block")
    for axis, (v, lim) in enumerate(zip(ln.block, limits.max_block)):
        if v > lim:
            bad("block_dim_too_large", ln, f"block.{'xyz'[axis]} = {v} > {lim}")
    if t % 32:
        bad("block_multiple_of_32", ln, f"block of {t} threads is not a multiple of 32 (a partial warp idles lanes)")
    for axis, (v, lim) in enumerate(zip(ln.grid, limits.max_grid)):
        if v < 1:
            bad("grid_invalid", ln, f"grid.{'xyz'[axis]} = {v} (must be at least 1)")
        elif v > lim:
            bad("grid_dim_too_large", ln, f"grid.{'xyz'[axis]} = {v} > {lim}")
    smem = ln.smem_dynamic_bytes + (ln.smem_static_bytes or 0)
    if smem > limits.max_smem_per_block_optin:
        bad("smem_over_optin", ln, f"shared memory {smem} B (dynamic {ln.smem_dynamic_bytes} + static "
            f"{ln.smem_static_bytes or 0}) > {limits.max_smem_per_block_optin} B opt-in limit per block")
    if ln.registers:
        need = block_registers(ln.registers, t)
        cap = min(limits.regs_per_block, limits.regs_per_sm)
        if need > cap:
            bad("registers_over_sm", ln, f"{ln.registers} registers x {t} threads = {need} (allocated per warp) "
                f"> {cap} registers per block/SM: the launch fails (lower registers or threads)")


def check_rules(task: Task, launches: list[Launch], limits: DeviceLimits, parent: LaunchResult | None = None,
                own: list[str] | None = None) -> tuple[list[LaunchViolation], int | None]:
    """Every broken rule, each with the number and the limit (`own`: main_index). Returns (violations, main CTAs)."""
    out: list[LaunchViolation] = []

    def bad(rule: str, ln: Launch, msg: str) -> None:
        out.append(LaunchViolation(rule=rule, kernel=ln.kernel, message=f"{ln.kernel}: {msg}"))

    for ln in launches:
        per_launch(ln, limits, bad)
    idx = main_index(task, launches, own)
    main_ctas = launches[idx].ctas if idx is not None else None
    if idx is not None:
        ln = launches[idx]
        need = task.spec.launch.min_ctas_per_sm * limits.sm_count
        if main_ctas < need:
            bad("grid_too_small", ln, f"{main_ctas} CTAs on the main shape < {need:g} "
                f"({task.spec.launch.min_ctas_per_sm:g} x {limits.sm_count} SMs): most SMs idle")
        if parent is not None and parent.main_ctas:
            floor = task.spec.launch.collapse_ratio * parent.main_ctas
            if main_ctas < floor:
                bad("cta_collapse", ln, f"{main_ctas} CTAs < {task.spec.launch.collapse_ratio:g} x the parent's "
                    f"{parent.main_ctas} = {floor:g}")
    return out, main_ctas


def _result(mode: str, launches: list[Launch], limits: DeviceLimits, violations: list[LaunchViolation],
            main_ctas: int | None) -> LaunchResult:
    waves = main_ctas / limits.sm_count if main_ctas is not None and limits.sm_count else None
    if violations:
        msg = violations[0].message + (f" (+{len(violations) - 1} more)" if len(violations) > 1 else "")
        status = LaunchStatus.rejected
    else:
        msg = f"{len(launches)} launch(es) ok; " + (f"main kernel {main_ctas} CTAs on {limits.sm_count} SMs" if main_ctas
                                                    is not None else "each a library's (the build compiled no kernel)")
        status = LaunchStatus.ok
    return LaunchResult(status=status, message=msg, mode=mode, limits=limits, launches=launches,
                        violations=violations, main_ctas=main_ctas, waves=waves)


# --- ptxas resources -> launches -----------------------------------------------------------------
def _base_name(demangled: str) -> str:
    """'ns::foo<128>(float*, int)' -> 'foo'; a trace's 'void at::native::(anonymous namespace)::bar<4>(...)' -> 'bar'."""
    head = demangled.replace("(anonymous namespace)", "anon").split("(", 1)[0]
    depth, out = 0, ""
    for ch in head:  # drop template arguments
        depth += ch == "<"
        if depth == 0:
            out += ch
        depth -= ch == ">"
    words = out.rsplit("::", 1)[-1].split()
    return words[-1] if words else head


def match_resources(kernel: str, resources: list[KernelResources]) -> KernelResources | None:
    """ptxas entry for a plan's kernel name: exact base name first, else substring; the worst if several."""
    exact = [r for r in resources if _base_name(r.name) == kernel or r.mangled == kernel]
    cands = exact or [r for r in resources if kernel in r.name or kernel in r.mangled]
    if not cands:
        return None
    return max(cands, key=lambda r: (r.registers, r.smem_static_bytes))


# --- static ------------------------------------------------------------------------------------
def _main_shape_json(task: Task) -> str:
    return json.dumps({k: (v if isinstance(v, bool) else int(v)) for k, v in task.spec.main.items()})


def static_check(task: Task, build: BuildResult, limits: DeviceLimits, parent: LaunchResult | None = None,
                 *, timeout_s: float = 120, scratch_root: Path | None = None) -> LaunchResult:
    if not task.backend.gpu:
        return LaunchResult(status=LaunchStatus.not_applicable, message="CPU task: no launch geometry", limits=limits)
    if build.status != BuildStatus.ok or not build.lib_path:
        return LaunchResult(status=LaunchStatus.error, limits=limits,
                            message=f"no library to check (build status {build.status.value})")
    proc, data = run_python_json(CHILD, ["plan", str(task.root), build.lib_path,
                                         _main_shape_json(task)], timeout_s, scratch_root)
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
    return _result("static", launches, limits, violations, main_ctas)


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
    proc, data = run_python_json(CHILD, ["trace", str(task.root), lib_path, _main_shape_json(task),
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
    if not traced:
        return LaunchResult(status=LaunchStatus.error, mode="dynamic", limits=limits,
                            message="the trace shows no kernel launch for the main shape")
    parent = None
    if plan.parent_main_ctas:   # no plan: the trace is the only geometry, so it meets the parent's here
        parent = LaunchResult(status=LaunchStatus.ok, main_ctas=plan.parent_main_ctas)
    violations, main_ctas = check_rules(task, traced, limits, parent, plan.own_kernels)
    violations += compare_with_plan(traced, smem, plan)
    return _result("dynamic", traced, limits, violations, main_ctas)


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
