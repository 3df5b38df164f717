"""Errors are classified once: ncu's own words -> a ProfileStatus with a one-line fix hint;
and a kernel's metrics -> a bottleneck class.

Failure patterns are ncu's real output lines (see tests/test_profile_status.py), matched in order.
"""

from __future__ import annotations

import re

from tools.profile.model import Bottleneck, KernelProfile, ProfileStatus
from tools.isolation.sandbox import ProcResult, ProcStatus

HINTS: dict[ProfileStatus, str] = {
    ProfileStatus.ncu_not_found: "install Nsight Compute and put `ncu` on PATH (or set NCU=/path/to/ncu)",
    ProfileStatus.counters_not_permitted: (
        "allow counter access: run as root, or load nvidia with NVreg_RestrictProfilingToAdminUsers=0 "
        "(containers need --cap-add=SYS_ADMIN); see https://developer.nvidia.com/ERR_NVGPUCTRPERM"),
    ProfileStatus.driver_incompatible: "use an ncu that supports this driver (or update the driver): compare `ncu --version` with `nvidia-smi`",
    ProfileStatus.no_kernel_matched: "check the task's kernel_regex against the kernel names (`ncu --print-summary per-kernel ...`) and that run() launches it",
    ProfileStatus.timeout: "raise --timeout, use a smaller shape, or profile tier 1 (fewer replay passes)",
    ProfileStatus.report_unreadable: "re-capture the report; read it with the same or a newer Nsight Compute (`pip install ncu-report`)",
    ProfileStatus.target_failed: "run the task without ncu first (`agent check TASK`): the program itself fails",
    ProfileStatus.error: "re-run with --json and read `message` (ncu's own last lines)",
}

# (status, regex over ncu's stdout+stderr), first match wins; order matters
_PATTERNS: list[tuple[ProfileStatus, re.Pattern[str]]] = [
    (ProfileStatus.counters_not_permitted, re.compile(r"ERR_NVGPUCTRPERM")),
    (ProfileStatus.driver_incompatible, re.compile(
        r"driver[^\n]*(not compatible|incompatible|too old|not supported)"
        r"|(not compatible|incompatible)[^\n]*driver"
        r"|Failed to initialize the profiler: LibraryNotLoaded", re.I)),
    (ProfileStatus.no_kernel_matched, re.compile(r"No kernels were profiled")),
    (ProfileStatus.target_failed, re.compile(r"The application returned an error code")),
]

_ERR_LINE = re.compile(r"^==(ERROR|WARNING)==.*$", re.M)


def classify_failure(proc: ProcResult, report_exists: bool) -> tuple[ProfileStatus, str] | None:
    """The status of an ncu run, or None when it succeeded and wrote its report."""
    if proc.status == ProcStatus.not_started:
        return ProfileStatus.ncu_not_found, f"could not start {proc.argv[0]}: {proc.stderr.strip()}"
    if proc.status == ProcStatus.timeout:
        return ProfileStatus.timeout, f"ncu {proc.reason()}"
    text = f"{proc.stdout}\n{proc.stderr}"
    for status, pat in _PATTERNS:
        m = pat.search(text)
        if m:
            return status, _message(text, m)
    if proc.status == ProcStatus.ok and report_exists:
        return None
    if proc.status == ProcStatus.ok:
        return ProfileStatus.error, "ncu exited 0 but wrote no report: " + (proc.tail(3) or "(no output)")
    return ProfileStatus.error, f"ncu {proc.reason()}"


def _message(text: str, m: re.Match[str]) -> str:
    """ncu's own line around the match, plus up to two of its other ==ERROR== lines."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    line = text[start:end if end >= 0 else None].strip()
    others = [e.group(0).strip() for e in _ERR_LINE.finditer(text) if e.group(0).strip() != line][:2]
    return " | ".join([line, *others])


def missing_metric(text: str) -> str | None:
    m = re.search(r"Failed to find metric\s+(\S+)", text)
    return m.group(1).rstrip(".") if m else None


# --- bottleneck -----------------------------------------------------------------------------
SOL_HIGH = 60.0   # % of peak: a unit this busy is the limiter; both below it -> latency bound
SMALL_GRID_TITLES = ("small grid",)


def small_grid_rule(k: KernelProfile) -> bool:
    """ncu's LaunchStats rule: title "Small Grid" ("...configured to execute only N blocks...")."""
    for r in k.rules:
        if r.title.lower() in SMALL_GRID_TITLES or "grid for this launch is configured to execute only" in r.message:
            return True
    return False


def classify_bottleneck(k: KernelProfile, sm_count: int | None) -> tuple[Bottleneck, str]:
    """Thresholds (SOL_HIGH above; the same text is the `bottleneck_reason`):
    - small_grid: CTAs < SM count, or ncu's Small Grid rule fired. (Waves < 1 alone is not enough:
      132 CTAs at 8 CTAs/SM is 0.125 waves yet every SM is busy.)
    - memory: SOL memory % >= 60 and >= SOL compute %
    - compute: SOL compute % >= 60
    - latency: both below 60 (neither unit is busy: too few warps or dependent stalls)
    """
    if sm_count and k.ctas < sm_count:
        return Bottleneck.small_grid, f"grid is {k.ctas} CTAs on {sm_count} SMs ({sm_count - k.ctas} SMs idle)"
    if small_grid_rule(k):
        return Bottleneck.small_grid, f"ncu Small Grid rule: grid is {k.ctas} CTAs" + (f" on {sm_count} SMs" if sm_count else "")
    c, m = k.sol_compute_pct, k.sol_memory_pct
    if c is None or m is None:
        return Bottleneck.unknown, "no SOL throughput metrics (fallback profile or section missing)"
    if m >= SOL_HIGH and m >= c:
        return Bottleneck.memory, f"SOL memory {m:.0f}% >= {SOL_HIGH:.0f}% and above compute {c:.0f}%"
    if c >= SOL_HIGH:
        return Bottleneck.compute, f"SOL compute {c:.0f}% >= {SOL_HIGH:.0f}% (memory {m:.0f}%)"
    return Bottleneck.latency, f"SOL compute {c:.0f}% and memory {m:.0f}% both below {SOL_HIGH:.0f}%"
