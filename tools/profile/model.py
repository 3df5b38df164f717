"""The profile JSON (versioned): what the agent's hypotheses are built from.

Filled from an Nsight Compute report (source="ncu") or, where ncu is absent or not permitted,
from the torch profiler trace and ptxas (source="fallback": no counters, marked as such).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

PROFILE_SCHEMA = 1


class ProfileStatus(str, Enum):
    ok = "ok"
    fallback = "fallback"                     # no ncu counters: geometry/resources only
    ncu_not_found = "ncu_not_found"
    counters_not_permitted = "counters_not_permitted"   # ERR_NVGPUCTRPERM
    driver_incompatible = "driver_incompatible"
    no_kernel_matched = "no_kernel_matched"
    timeout = "timeout"
    report_unreadable = "report_unreadable"
    target_failed = "target_failed"           # the profiled program itself failed
    error = "error"


class Bottleneck(str, Enum):
    memory = "memory"
    compute = "compute"
    latency = "latency"
    small_grid = "small_grid"
    unknown = "unknown"


class RuleResult(BaseModel):
    id: str                                   # e.g. "SOLBottleneck", "LaunchConfiguration"
    title: str = ""
    type: str = ""                            # OPT | WRN | INF | ERR
    message: str
    speedup: float | None = None              # ncu's estimated speedup, in percent
    speedup_kind: str | None = None           # global | local


class Stall(BaseModel):
    reason: str                               # e.g. "long_scoreboard", "barrier"
    pct: float                                # share of stall samples, percent


class KernelProfile(BaseModel):
    name: str
    demangled: str = ""
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    ctas: int
    waves_per_sm: float | None = None
    registers_per_thread: int | None = None
    smem_static_bytes: int | None = None
    smem_dynamic_bytes: int | None = None
    duration_us: float | None = None          # under ncu's replay: relative, never the benchmark
    sol_compute_pct: float | None = None
    sol_memory_pct: float | None = None
    dram_pct: float | None = None
    l1_hit_pct: float | None = None
    l2_hit_pct: float | None = None
    occupancy_theoretical_pct: float | None = None
    occupancy_achieved_pct: float | None = None
    occupancy_limiter: str | None = None      # registers | shared_memory | warps | blocks
    tensor_pipe_pct: float | None = None
    smem_bank_conflicts: int | None = None
    stalls: list[Stall] = []                  # tier 2
    rules: list[RuleResult] = []
    bottleneck: Bottleneck = Bottleneck.unknown
    bottleneck_reason: str = ""
    metrics: dict[str, float | int | str] = {}  # every raw metric read, by ncu name


class ProfileEnv(BaseModel):
    ncu_version: str | None = None
    driver: str | None = None
    gpu: str | None = None
    sm_count: int | None = None
    clock_control: str | None = None          # e.g. "none" (the card's clocks, as found)
    tier: int = 1
    replay_passes: int | None = None
    wall_seconds: float | None = None
    bare_seconds: float | None = None         # the same program without ncu


class ProfileReport(BaseModel):
    schema_version: int = PROFILE_SCHEMA
    status: ProfileStatus
    message: str = ""
    hint: str = ""                            # one-line fix for a failure status
    source: str = "ncu"                       # ncu | fallback | report (converted from a user's file)
    task: str | None = None
    shape: dict[str, int | bool] = {}
    env: ProfileEnv = Field(default_factory=ProfileEnv)
    kernels: list[KernelProfile] = []
