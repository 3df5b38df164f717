"""No counters: launch geometry, registers, shared memory and an occupancy estimate from the
torch profiler's chrome trace (Kineto records every kernel launch of the process, ctypes-loaded
libraries included) and, where given, ptxas resource usage. Marked status=fallback, source=fallback.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel

from tools.profile.classify import HINTS, classify_bottleneck
from tools.profile.model import KernelProfile, ProfileEnv, ProfileReport, ProfileStatus
from tools.results import KernelResources
from tools.isolation.sandbox import run_isolated
from tools.isolation.scratch import Scratch
from tools.profile.target import target_env
from tools.task import Task


class SmLimits(BaseModel):
    """Per-SM limits the occupancy estimate needs (defaults: sm_80/sm_90 class GPUs)."""
    sm_count: int | None = None
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472
    reserved_smem_per_block: int = 1024
    reg_alloc_unit: int = 256          # registers are allocated per warp in units of 256
    name: str | None = None


def limits_from_trace(trace: dict) -> SmLimits:
    props = (trace.get("deviceProperties") or [{}])[0]
    lim = SmLimits(sm_count=props.get("numSms"), name=props.get("name"))
    for ours, theirs in (("max_threads_per_sm", "maxThreadsPerMultiprocessor"), ("regs_per_sm", "regsPerMultiprocessor"),
                         ("smem_per_sm", "sharedMemPerMultiprocessor")):
        if props.get(theirs):
            setattr(lim, ours, int(props[theirs]))
    return lim


def estimate_occupancy(threads: int, regs: int | None, smem_bytes: int | None, lim: SmLimits) -> tuple[float, str, int]:
    """Theoretical occupancy (% of max warps per SM), its limiter and CTAs per SM, as the CUDA
    occupancy calculator computes them."""
    warps = math.ceil(threads / 32)
    max_warps = lim.max_threads_per_sm // 32
    per = {"warps": max_warps // warps, "blocks": lim.max_blocks_per_sm}
    if regs:
        regs_per_warp = math.ceil(regs * 32 / lim.reg_alloc_unit) * lim.reg_alloc_unit
        per["registers"] = (lim.regs_per_sm // regs_per_warp) // warps
    if smem_bytes:
        per["shared_memory"] = lim.smem_per_sm // (smem_bytes + lim.reserved_smem_per_block)
    order = ["registers", "shared_memory", "warps", "blocks"]
    limiter = min(per, key=lambda k: (per[k], order.index(k)))
    return round(100.0 * per[limiter] * warps / max_warps, 1), limiter, per[limiter]


def kernels_from_trace(trace: dict, kernel_regex: str | None, resources: list[KernelResources] | None = None
                       ) -> tuple[list[KernelProfile], SmLimits]:
    """One KernelProfile per distinct (kernel, grid, block) in the trace whose name matches."""
    lim = limits_from_trace(trace)
    pat = re.compile(kernel_regex) if kernel_regex else None
    res = {r.name.split("(")[0]: r for r in resources or []} | {r.mangled: r for r in resources or [] if r.mangled}
    groups: dict[tuple, list[dict]] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel" or (pat and not pat.search(ev.get("name", ""))):
            continue
        a = ev.get("args", {})
        groups.setdefault((ev["name"], tuple(a.get("grid", (0, 0, 0))), tuple(a.get("block", (0, 0, 0)))), []).append(ev)
    out = []
    for (name, grid, block), evs in groups.items():
        a = evs[0].get("args", {})
        r = res.get(name) or res.get(name.split("(")[0])
        regs = a.get("registers per thread") or (r.registers if r else None)
        smem_total = a.get("shared memory")
        smem_static = r.smem_static_bytes if r else None
        smem_dynamic = smem_total - smem_static if smem_total is not None and smem_static is not None else None
        threads = block[0] * block[1] * block[2]
        occ, limiter, per_sm = estimate_occupancy(threads, regs, smem_total if smem_total is not None else smem_static, lim)
        metrics: dict[str, float | int | str] = {"trace:launches": len(evs)}
        for key in ("est. achieved occupancy %", "blocks per SM", "warps per SM", "shared memory", "registers per thread"):
            if key in a:
                metrics[f"trace:{key}"] = a[key]
        if r:
            metrics |= {"ptxas:spill_stores_bytes": r.spill_stores_bytes, "ptxas:spill_loads_bytes": r.spill_loads_bytes}
        ctas = grid[0] * grid[1] * grid[2]
        k = KernelProfile(name=name.split("(")[0], demangled=name, grid=grid, block=block, ctas=ctas,
                          waves_per_sm=round(ctas / (lim.sm_count * per_sm), 3) if lim.sm_count and per_sm else None,
                          registers_per_thread=regs, smem_static_bytes=smem_static, smem_dynamic_bytes=smem_dynamic,
                          duration_us=round(sum(e.get("dur", 0.0) for e in evs) / len(evs), 3),
                          occupancy_theoretical_pct=occ, occupancy_limiter=limiter, metrics=metrics)
        k.bottleneck, k.bottleneck_reason = classify_bottleneck(k, lim.sm_count)
        out.append(k)
    return out, lim


def report_from_trace(trace_path: str | Path, kernel_regex: str | None,
                      resources: list[KernelResources] | None = None) -> ProfileReport:
    try:
        trace = json.loads(Path(trace_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        return ProfileReport(status=ProfileStatus.error, source="fallback", message=f"trace {trace_path}: {e}",
                             hint=HINTS[ProfileStatus.error])
    kernels, lim = kernels_from_trace(trace, kernel_regex, resources)
    if not kernels:
        return ProfileReport(status=ProfileStatus.no_kernel_matched, source="fallback",
                             message=f"no kernel in the trace matches {kernel_regex!r}",
                             hint=HINTS[ProfileStatus.no_kernel_matched])
    return ProfileReport(status=ProfileStatus.fallback, source="fallback", kernels=kernels,
                         env=ProfileEnv(gpu=lim.name, sm_count=lim.sm_count, tier=0))


def profile_fallback(task: Task, lib_path: str | Path, *, shape: int | None = None, timeout_s: float = 300,
                     resources: list[KernelResources] | None = None, out_dir: str | Path | None = None) -> ProfileReport:
    """Run the target once under the torch profiler (needs CUDA) and read its trace."""
    from tools.profile.target import target_argv
    if out_dir is None:   # the trace is read into the report and not kept: nothing is left in /tmp
        with tempfile.TemporaryDirectory(prefix="agent-trace-") as tmp:
            return profile_fallback(task, lib_path, shape=shape, timeout_s=timeout_s, resources=resources, out_dir=tmp)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.json"
    with Scratch(out, "profile") as s:   # the target fences itself to it (tools/profile/target.py): its trace is written
        mine = s.dir / "trace.json"       # there and moved out by this process
        proc = run_isolated(target_argv(task, lib_path, shape, 2, 1, trace=str(mine)), timeout_s, cwd=s.dir,
                            env=target_env(s))
        if mine.is_file():
            shutil.move(str(mine), str(trace))
    if proc.status.value != "ok" or not trace.is_file():
        status = ProfileStatus.timeout if proc.status.value == "timeout" else ProfileStatus.target_failed
        last = (proc.tail(1) or proc.reason()).strip()
        why = "timed out" if status == ProfileStatus.timeout else f"the program failed: {last}"
        return ProfileReport(status=status, source="fallback", task=task.name, message=why, hint=HINTS[status])
    rep = report_from_trace(trace, task.spec.kernel_regex, resources)
    shp = dict(task.spec.shapes[task.spec.main_shape if shape is None else shape])
    return rep.model_copy(update={"task": task.name, "shape": shp, "env": rep.env.model_copy(update={"wall_seconds": round(proc.seconds, 3)})})
