"""The proposer's view of a ProfileReport: a few lines per kernel, small enough for a prompt
(under about 3000 characters for one kernel): geometry, resources, SOL, occupancy, stalls, and
ncu's rules ordered by estimated speedup, each message whole (issue 63: cut at 170 characters, a rule arrived
mid-sentence, "This kernel's theoretical occupancy (7...")."""

from __future__ import annotations

from tools.profile.model import KernelProfile, ProfileReport, ProfileStatus

MAX_RULES = 4


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}%"


def _kernel(k: KernelProfile) -> list[str]:
    g = "x".join(map(str, k.grid)) if k.grid[1:] != (1, 1) else str(k.grid[0])
    b = "x".join(map(str, k.block)) if k.block[1:] != (1, 1) else str(k.block[0])
    res = [f"{k.registers_per_thread} regs/thr" if k.registers_per_thread is not None else None,
           f"smem {k.smem_static_bytes or 0}+{k.smem_dynamic_bytes or 0} B" if k.smem_static_bytes is not None or k.smem_dynamic_bytes is not None else None,
           f"{k.waves_per_sm:.2f} waves" if k.waves_per_sm is not None else None,
           f"{k.duration_us:.1f} us" if k.duration_us is not None else None]
    lines = [f"kernel {k.name}: grid {g} ({k.ctas} CTAs) x block {b}; " + ", ".join(r for r in res if r),
             f"bottleneck: {k.bottleneck.value} ({k.bottleneck_reason})"]
    if k.sol_compute_pct is not None or k.sol_memory_pct is not None:
        extra = [f"DRAM {_pct(k.dram_pct)}", f"L1 hit {_pct(k.l1_hit_pct)}", f"L2 hit {_pct(k.l2_hit_pct)}"]
        if k.tensor_pipe_pct is not None:
            extra.append(f"tensor pipe {_pct(k.tensor_pipe_pct)}")
        if k.smem_bank_conflicts:
            extra.append(f"smem bank conflicts {k.smem_bank_conflicts}")
        lines.append(f"SOL compute {_pct(k.sol_compute_pct)}, memory {_pct(k.sol_memory_pct)}; " + ", ".join(extra))
    occ = f"occupancy theoretical {_pct(k.occupancy_theoretical_pct)}"
    if k.occupancy_achieved_pct is not None:
        occ += f", achieved {_pct(k.occupancy_achieved_pct)}"
    if k.occupancy_limiter:
        occ += f" (limited by {k.occupancy_limiter})"
    lines.append(occ)
    if k.stalls:
        lines.append("top stalls: " + ", ".join(f"{s.reason} {s.pct:.0f}%" for s in k.stalls[:4]))
    rules = sorted((r for r in k.rules if r.type in ("OPT", "WRN", "ERR")), key=lambda r: -(r.speedup or 0.0))
    for r in rules[:MAX_RULES]:
        sp = f" ~{r.speedup:.0f}% {r.speedup_kind or ''}".rstrip() if r.speedup else ""
        lines.append(f"- [{r.title or r.id}{sp}] {' '.join(r.message.split())}")
    return lines


def compact(report: ProfileReport) -> str:
    e = report.env
    if report.status not in (ProfileStatus.ok, ProfileStatus.fallback):
        return f"profile {report.status.value}: {report.message}\nfix: {report.hint}"
    head = [f"profile ({report.source}" + (f", tier {e.tier}" if report.source == "ncu" else "") + ")"]
    if e.gpu:
        head.append(f"{e.gpu}" + (f" {e.sm_count} SMs" if e.sm_count else ""))
    if e.ncu_version:
        head.append(f"ncu {e.ncu_version}, clocks {e.clock_control or '?'}")
    lines = [", ".join(head)]
    if report.status == ProfileStatus.fallback:
        lines.append("NO COUNTERS (fallback): geometry and estimated occupancy only")
    for k in report.kernels:
        lines += _kernel(k)
    return "\n".join(lines)


def profile_summary(rep: ProfileReport | None) -> dict | None:
    """The few figures of the main (longest) kernel that an iteration record keeps for the review."""
    if rep is None or not rep.kernels:
        return None
    k = max(rep.kernels, key=lambda k: k.duration_us or 0)
    return {"kernel": k.name, "ctas": k.ctas, "sol_compute_pct": k.sol_compute_pct,
            "sol_memory_pct": k.sol_memory_pct, "dram_pct": k.dram_pct,
            "occupancy_achieved_pct": k.occupancy_achieved_pct, "registers": k.registers_per_thread,
            "bottleneck": k.bottleneck.value, "source": rep.source}
