"""The run's records: runs/RUN/run.json (RunConfig), runs/RUN/state.json (RunState) and one IterationRecord a line
in runs/RUN/iterations.jsonl, schema-versioned. How they are written and read: agent/records/store.py.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum

from pydantic import BaseModel, Field

from agent.proposal import Proposal
from tools.results import BenchResult, BuildResult, DevicePeak, LaunchResult, ParityResult, ScratchFile, StageBudget

SCHEMA_VERSION = 1


class Decision(str, Enum):
    kept = "kept"
    reverted = "reverted"          # evaluated and rejected; commit kept under refs/agent/RUN/rejected/N
    skipped = "skipped"            # no candidate commit (proposal failed, patch did not apply, ...)
    interrupted = "interrupted"    # Ctrl-C / kill during the iteration
    revoked = "revoked"            # kept, then refused by a check run after the keep (agent/records/revoked.py)


class Outcome(str, Enum):
    """Why an iteration ended: the first stage that failed, or kept/not_faster."""
    kept = "kept"
    proposal_failed = "proposal_failed"
    patch_did_not_apply = "patch_did_not_apply"
    edit_outside_editable = "edit_outside_editable"
    no_change = "no_change"
    compile_failed = "compile_failed"
    launch_rejected = "launch_rejected"
    parity_failed = "parity_failed"
    bench_failed = "bench_failed"
    not_faster = "not_faster"
    implausible = "implausible"     # speedup failed re-verification
    inconclusive = "inconclusive"   # re-benched within its budget, the gain neither shown nor ruled out (attempt.py)
    touched_checkout = "touched_checkout"   # changed a file mode in the user's checkout (tools/isolation/checkout.py)
    interrupted = "interrupted"
    budget_exhausted = "budget_exhausted"
    refused_after_keep = "refused_after_keep"   # a sanitizer run after the keep refused it (tools/judge/later.py)
    parent_revoked = "parent_revoked"   # older runs' candidate on a keep revoked meanwhile; now re-parented (revoke.py)


class EnvFingerprint(BaseModel):
    host: str = ""
    gpu: str | None = None
    sm_count: int | None = None
    driver: str | None = None
    cuda_runtime: str | None = None
    nvcc: str | None = None
    cxx: str | None = None
    ncu: str | None = None
    torch: str | None = None
    python: str = ""
    clocks: str | None = None          # e.g. "ncu --clock-control none; SM 1980 MHz at start"
    git_sha: str = ""
    git_dirty: bool = False


def now() -> str:
    """A record's timestamp: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunConfig(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    task: str                          # task name
    task_dir: str                      # relative to the repository root
    repo: str                          # the user's repository (absolute path)
    branch: str                        # agent/TASK/RUN
    base_sha: str                      # the user's HEAD when the run started
    worktree: str
    proposer: str                      # heuristic | llm | replay
    model: str | None = None
    target: float
    past_target: bool = False          # the target stops nothing: run every iteration
    iters: int
    baseline: str                      # reference | initial
    min_gain: float = 0.02
    budget_tokens: int | None = None
    budget_usd: float | None = None
    budget_seconds: float | None = None
    repairs: int = 2                   # a failed candidate goes back to the model this often in its iteration
    candidates: int = 1                # proposals evaluated per iteration (agent/optimize/candidates.py)
    at_once: bool = False              # --at-once: the K model requests sent together, each asked for its rank
    workers: int | None = None         # --workers N: a local dask cluster (agent/evaluation/executor.py)
    scheduler: str | None = None       # --scheduler ADDRESS: a running one
    profile_tier: int = 1
    profile_rejected: bool = False     # a GPU candidate rejected as not faster or inconclusive profiled too
    started: str
    env: EnvFingerprint = Field(default_factory=EnvFingerprint)
    extra: dict = Field(default_factory=dict)


class StageTimes(BaseModel):
    propose: float = 0.0
    patch: float = 0.0
    build: float = 0.0
    launch: float = 0.0
    parity: float = 0.0
    bench: float = 0.0
    profile: float = 0.0
    git: float = 0.0
    later: float = 0.0     # waiting, before its edits, for the last keep's checks (agent/optimize/revoke.py)

    def agent_overhead(self) -> float:
        """Everything but proposing, building and measuring: what the harness itself costs."""
        return self.patch + self.git


class Usage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(calls=self.calls + other.calls, prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     cost_usd=self.cost_usd + other.cost_usd)


class RepairAttempt(BaseModel):
    """One attempt of an iteration that failed and went back to the model for repair (agent/optimize/repair.py): what it
    proposed, how it failed, what it cost. The iteration's own fields are its last attempt's."""
    attempt: int                       # 1 for the first proposal, 2 for its first repair, ...
    hypothesis: str = ""
    outcome: Outcome
    reason: str
    patch: str = ""                    # its diff against the parent (cut)
    rejected_ref: str | None = None    # its commit, kept for review
    usage: Usage = Field(default_factory=Usage)
    seconds: float | None = None       # its wall clock: the model's call, the patch, the build and the checks it reached


class CandidateTried(BaseModel):
    """One of an iteration's K candidates that was not the one it settled on (agent/optimize/candidates.py)."""
    candidate: int                     # 1..K, in the order proposed
    hypothesis: str = ""
    outcome: str                       # an Outcome value (not_faster: passed, another was faster), or lost: the
                                       # worker evaluating it died, and again on the worker it was given to
    reason: str = ""
    speedup: float | None = None       # over the best, timed side by side with it on its worker
    patch: str = ""
    ref: str | None = None             # refs/agent/RUN/candidate/N.K
    worker: str = ""                   # the worker and GPU (or cores) that evaluated it; "" here
    usage: Usage = Field(default_factory=Usage)


class IterationRecord(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    iteration: int
    started: str
    finished: str
    proposal: Proposal | None = None
    proposal_error: str | None = None
    patch: str = ""                    # unified diff of the candidate against its parent
    patch_message: str = ""            # what the patcher said (closest lines, blocks applied)
    parent_sha: str = ""
    commit_sha: str | None = None
    rejected_ref: str | None = None
    build: BuildResult | None = None
    launch: LaunchResult | None = None
    parity: ParityResult | None = None
    bench: BenchResult | None = None
    confirm: BenchResult | None = None   # the second, independent bench a gain must survive to be kept
    # the benches (the first; the confirmation) that neither showed the gain nor ruled it out, each then re-benched
    # with more rounds (attempt.py decide): bench and confirm hold the last of each
    bench_undecided: list[BenchResult] = []
    confirm_undecided: list[BenchResult] = []
    profile_summary: dict | None = None  # compact profile of the new best (after a keep)
    scratch_files: list[ScratchFile] = []   # what the candidate's processes wrote in their scratch dirs
    output_dropped_bytes: int = 0      # what the candidate's children printed past the output cap, left out
    decision: Decision
    outcome: Outcome
    reason: str                        # one line, also shown to the proposer next time
    kept_reason: str | None = None     # a revoked keep's reason when it was kept (agent/records/revoked.py)
    speedup_vs_best: float | None = None
    speedup_vs_initial: float | None = None
    speedup_vs_reference: float | None = None
    best_ms: float | None = None       # main-shape median of the best after this iteration
    times: StageTimes = Field(default_factory=StageTimes)
    wall_s: float | None = None        # the iteration's wall clock, start to record (times leave out the gaps)
    usage: Usage = Field(default_factory=Usage)
    attempts: list[RepairAttempt] = []   # the attempts before the last, each repaired (--repairs)
    candidates: list[CandidateTried] = []   # --candidates K: the others of the iteration's K
    worker: str = ""                   # --workers / --scheduler: the worker and GPU that evaluated this candidate


class RunState(BaseModel):
    """runs/RUN/state.json: where a run stands, rewritten atomically after every iteration."""
    schema_version: int = SCHEMA_VERSION
    status: str = "running"            # running | done | interrupted | failed
    stop_reason: str = ""
    iterations_done: int = 0
    best_sha: str = ""
    best_iteration: int | None = None  # None: the initial kernel
    best_ms: float | None = None
    initial_ms: float | None = None
    initial_knobs: dict[str, int] = Field(default_factory=dict)
    reference_ms: float | None = None
    peak: DevicePeak | None = None     # the device's peaks for the task's dtype, as the setup bench named them (a GPU)
    # the estimate's terms (agent/records/figures.py): the product of the kept steps' speedups over their
    # parents, and the initial kernel's speedup over the reference, both timed interleaved
    chain_vs_initial: float | None = None
    initial_vs_reference: float | None = None
    usage: Usage = Field(default_factory=Usage)
    finished: str | None = None
    # the best re-timed against the initial kernel interleaved (ABAB) and against the reference:
    # the run's headline figures, measured when the target looks reached and at the end
    confirmed_sha: str | None = None
    confirmed_vs_initial: float | None = None
    confirmed_vs_initial_low: float | None = None
    confirmed_vs_initial_high: float | None = None
    confirmed_vs_reference: float | None = None
    confirmed_vs_reference_low: float | None = None
    confirmed_vs_reference_high: float | None = None
    # that bench's medians by arm (candidate: the best, baseline: the initial kernel, reference where
    # its figure was stable), so that the times shown beside the figures are the same measurement's
    confirmed_ms: dict[str, float] | None = None
    # the best's keep's confirmation bench (the best, its parent and the reference in the same rounds): the figure
    # against the reference and the medians by arm, for the best it names (agent/records/figures.py)
    kept_sha: str | None = None
    kept_vs_reference: float | None = None
    kept_vs_reference_low: float | None = None
    kept_vs_reference_high: float | None = None
    kept_ms: dict[str, float] | None = None
    # each candidate stage's time limit, from the initial kernel's seconds in it (tools/judge/budgets.py)
    stage_budgets: dict[str, StageBudget] = Field(default_factory=dict)

