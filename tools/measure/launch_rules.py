"""The launch rules (DESIGN step 5), for a plan's launches (tools/measure/launch.py) and for those the GPU ran
(tools/measure/launch.py): block size, shared memory against the opt-in limit, registers x threads, grid limits,
the main kernel's CTAs against the SMs and the parent's; ptxas' resources matched to a plan's kernels."""

from __future__ import annotations

import json
import math
import re
from typing import Callable

from tools.results import DeviceLimits, KernelResources, Launch, LaunchResult, LaunchStatus, LaunchViolation
from tools.task import Task

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


def launch_result(mode: str, launches: list[Launch], limits: DeviceLimits, violations: list[LaunchViolation],
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


def main_shape_json(task: Task) -> str:
    """The task's main shape as the plan and trace children take it."""
    return json.dumps({k: (v if isinstance(v, bool) else int(v)) for k, v in task.spec.main.items()})
