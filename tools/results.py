"""One typed, total result per stage. Every tool returns one of these; all serialize to JSON.

Never None for a failed stage, never an exception object: a status plus a message written for the
reader who must act on it (the proposer or the user).
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

RESULT_SCHEMA = 1


# --- build ----------------------------------------------------------------------------------
class BuildStatus(str, Enum):
    ok = "ok"
    compile_error = "compile_error"
    timeout = "timeout"
    toolchain_missing = "toolchain_missing"   # nvcc / c++ / ninja not found
    scan_rejected = "scan_rejected"           # the source scan before the build (tools/build/scan.py)


class KernelResources(BaseModel):
    """What ptxas said about one kernel (CUDA only)."""
    name: str                 # demangled where possible
    mangled: str = ""
    registers: int = 0
    spill_stores_bytes: int = 0
    spill_loads_bytes: int = 0
    stack_frame_bytes: int = 0
    smem_static_bytes: int = 0
    cmem_bytes: int = 0
    advisories: list[str] = []   # ptxas' performance notes for it, as "(C7511) ..." (wgmma serialized, waits injected)


class BuildResult(BaseModel):
    status: BuildStatus
    message: str = ""                     # first error lines on failure
    lib_path: str | None = None
    build_dir: str
    seconds: float = 0.0
    steps_run: int = 0                    # ninja edges that ran (0 = nothing to do)
    log: str = ""                         # full compiler output
    arch: str | None = None
    kernels: list[KernelResources] = []
    commands: list[str] = []              # each compile and link command, as a person would type it


# --- launch (CTA) check -----------------------------------------------------------------------
class LaunchStatus(str, Enum):
    ok = "ok"
    rejected = "rejected"
    not_applicable = "not_applicable"     # CPU task
    error = "error"                        # could not obtain the geometry (crash, timeout, ...)


class Launch(BaseModel):
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_dynamic_bytes: int = 0
    smem_static_bytes: int | None = None
    registers: int | None = None
    source: str = "plan"                   # plan (the .so's own launch_plan) | trace (torch profiler) | ncu

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


class DeviceLimits(BaseModel):
    name: str
    arch: str                              # sm_90
    sm_count: int
    max_threads_per_block: int = 1024
    max_smem_per_block_optin: int          # bytes
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    source: str = "table"                  # table (compile-only) | device


class LaunchViolation(BaseModel):
    rule: str                              # block_multiple_of_32, block_too_large, smem_over_optin, ...
    kernel: str
    message: str


class LaunchResult(BaseModel):
    status: LaunchStatus
    message: str = ""
    mode: str = "static"                   # static | dynamic
    limits: DeviceLimits | None = None
    launches: list[Launch] = []
    violations: list[LaunchViolation] = []
    main_ctas: int | None = None
    waves: float | None = None
    seconds: float = 0.0
    # a task without launch_plan: the static check had no geometry, so the trace checks the parent's
    # CTA count (the collapse rule) itself; this carries that count from the static check to the trace
    parent_main_ctas: int | None = None
    # a task without launch_plan: the kernels its build compiled (ptxas' names), for the trace to find the main one
    # among; [] where it compiled none (a scaffold's ATen calls: every launch is a library's)
    own_kernels: list[str] | None = None


# --- parity -------------------------------------------------------------------------------
class ParityStatus(str, Enum):
    ok = "ok"
    mismatch = "mismatch"                  # values outside tolerance
    nan_inf = "nan_inf"                    # NaN or Inf where the reference has none
    unwritten = "unwritten"                # elements still holding the poison
    input_mutated = "input_mutated"
    out_of_bounds = "out_of_bounds"        # wrote into the guard bytes around the output tensor
    nondeterministic = "nondeterministic"  # repeated calls disagree beyond tolerance
    output_state = "output_state"          # the result depended on what the output held before the call
    stale_input = "stale_input"            # after a few input values changed in place, the old inputs' answer
    side_effect = "side_effect"            # the kernel wrote files (not allowed by task.toml), or its GPU context outlived its host
    imprecise = "imprecise"                # error past [parity] error_budget x the reference implementation's own
    invalid_access = "invalid_access"      # compute-sanitizer memcheck: a read or write outside every allocation
    race = "race"                          # compute-sanitizer racecheck: shared memory read and written with no barrier between
    unchecked = "unchecked"                # a before-a-keep check (compute-sanitizer) could not run: no pass without it
    crashed = "crashed"
    timeout = "timeout"
    error = "error"                        # the harness could not run (bad lib, missing symbol, ...)


class ShapeCheck(BaseModel):
    shape: dict[str, int | bool]
    label: str
    dist: str
    seed: int
    hidden: bool = False
    ok: bool
    status: ParityStatus
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatches: int = 0
    numel: int = 0
    worst_index: list[int] | None = None
    expected: float | None = None
    got: float | None = None
    err_ratio: float | None = None   # the error as a multiple of the reference implementation's (error budget)
    # values:large's elements past tolerance that an fp32 rounding decides there, let past (domains.excuse)
    excused: int = 0
    message: str = ""
    seconds: float | None = None     # what the check cost, the reference's calls included
    # where those seconds went (issue 66): "draw" (the inputs made; a values draw's edge search), "calls" (the
    # candidate's, through its host); the rest is the reference, the comparisons, the error budget
    parts: dict[str, float] | None = None


class SanitizerResult(BaseModel):
    """compute-sanitizer on a CUDA candidate about to be kept (tools/judge/sanitize.py)."""
    tool: str = "memcheck"
    status: str                  # ok | failed | skipped (no sanitizer here) | error (it could not start)
    message: str = ""
    seconds: float = 0.0         # what it cost, the sanitizer's start included
    shapes: int = 0              # calls made under it
    errors: int = 0
    # where its seconds went (issue 66): "wait" (from when it was asked to when its host had started), "load" (the
    # candidate's library into the host), "calls" (each shape's inputs and call), "finish" (the tool's end and its
    # report); "slowest" the slowest call's seconds, "slowest_shape" its shape
    steps: dict[str, float] = {}
    slowest_shape: str = ""


class ParityResult(BaseModel):
    status: ParityStatus
    message: str = ""
    checks: list[ShapeCheck] = []
    seconds: float = 0.0
    memcheck: SanitizerResult | None = None
    racecheck: SanitizerResult | None = None
    later: list[str] = []        # the sanitizers left for after the keep (tools/judge/later.py), where they apply

    def worst(self) -> ShapeCheck | None:
        bad = [c for c in self.checks if not c.ok]
        return bad[0] if bad else None


# --- bench --------------------------------------------------------------------------------
class BenchStatus(str, Enum):
    ok = "ok"
    crashed = "crashed"
    timeout = "timeout"
    error = "error"
    suspicious = "suspicious"   # timing cross-checks failed (side stream, repeated-call shortcut...)
    side_effect = "side_effect"  # the kernel wrote files while timed (not allowed by task.toml)


class TimingStats(BaseModel):
    label: str                   # candidate | baseline | reference
    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    reps: int
    tflops: float | None = None
    gbps: float | None = None


class SpeedupCI(BaseModel):
    """Speedup of `candidate` over `baseline` (baseline_time / candidate_time)."""
    median: float
    low: float                   # confidence interval bounds
    high: float
    confidence: float = 0.95
    rounds: int

    def excludes_one(self) -> bool:
        return self.low > 1.0 or self.high < 1.0


class StageBudget(BaseModel):
    """A candidate stage's time limit, measured at the run's setup (tools/judge/budgets.py)."""
    seconds: float
    basis: str = ""


class ScratchFile(BaseModel):
    """A file a candidate process left in its scratch directory (listed, then removed with it)."""
    path: str                    # relative to the scratch directory
    bytes: int
    process: str = ""            # which child: host (the judge's), plan_child-plan, batch_child, ...


class DevicePeak(BaseModel):
    """The device's spec-sheet peaks for the task's dtype, for "% of peak" (known GPUs only)."""
    tflops: float
    gbps: float
    label: str                   # e.g. "H200, float16 tensor"


class BenchResult(BaseModel):
    status: BenchStatus
    message: str = ""
    shape: dict[str, int | bool] = {}
    device: str = ""
    timings: list[TimingStats] = []
    speedup_vs_baseline: SpeedupCI | None = None
    speedup_vs_reference: float | None = None   # the median of speedup_vs_reference_ci
    speedup_vs_reference_ci: SpeedupCI | None = None   # reference time / candidate time, interleaved
    peak: DevicePeak | None = None             # None: a CPU, or a GPU without a known spec sheet
    threads: int | None = None                 # torch's CPU threads in the process that timed (TaskSpec.threads)
    seconds: float = 0.0
    probe_seconds: dict[str, float] = {}       # what each probe that ran cost (tools/measure/probes.py)
    # where the rest of `seconds` went (tools/measure/bench.py _bench_shape): inputs (the sets, outputs and arms),
    # warm (each arm's warm-up and rep estimate), rounds (the timed rounds, their refills and spot checks),
    # again (a second timing where the clocks or the reference's rounds disagreed)
    phase_seconds: dict[str, float] = {}

    def timing(self, label: str) -> TimingStats | None:
        return next((t for t in self.timings if t.label == label), None)


# --- batched evaluation (agent sweep) ----------------------------------------------------------
class BatchStatus(str, Enum):
    ok = "ok"                        # parity passed and the bench answered
    launch_rejected = "launch_rejected"   # the static launch check of the library's plan failed; nothing ran
    parity_failed = "parity_failed"
    bench_failed = "bench_failed"
    crashed = "crashed"              # its host (or the batch child) died while this library ran
    timeout = "timeout"              # the watchdog or the batch's timeout ended the child on this library


class BatchItemResult(BaseModel):
    """The static launch check, parity, then bench against the baseline, of one library in a batch
    child (tools/judge/batch.py)."""
    status: BatchStatus
    message: str = ""
    launch: LaunchResult | None = None        # the static check, where a launch context was given
    seed: int | None = None                   # parity's seed
    parity: ParityResult | None = None        # None: the child died before parity answered, or a screen
    bench: BenchResult | None = None          # None: parity failed, or the child died first
    seconds: float = 0.0


KnobWhich = Literal["each", "all"]


class KnobFailure(BaseModel):
    knobs: dict[str, int]        # the whole configuration
    moved: dict[str, int]        # the knobs whose value differs from the committed one
    outcome: str                 # compile_failed | launch_rejected | parity_failed | crashed | timeout
    reason: str


class KnobCheck(BaseModel):
    """`agent check --knobs each|all` (agent/sweep/knobcheck.py): every other allowed value built and parity-checked."""
    which: KnobWhich
    committed: dict[str, int]
    configurations: int          # checked besides the committed one
    passed: int
    failures: list[KnobFailure] = []


class CheckSummary(BaseModel):
    """`agent check TASK`: the four instruments in order, stopping at the first failure."""
    schema_version: int = RESULT_SCHEMA
    task: str
    build: BuildResult
    launch: LaunchResult | None = None
    parity: ParityResult | None = None
    bench: list[BenchResult] = Field(default_factory=list)
    knobs: KnobCheck | None = None      # --knobs each|all: the other allowed values' build and parity
    ok: bool
    notes: list[str] = Field(default_factory=list)   # the table's notes, "step: detail" (not failures)
