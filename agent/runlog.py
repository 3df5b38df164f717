"""The run log: runs/RUN/run.json and runs/RUN/iterations.jsonl, schema-versioned.

One record per iteration, appended (and fsynced) before the next iteration begins, so a killed
run can be resumed and every command that reviews runs reads the same files. A log written by a
schema this code does not know is refused with a clear message, never misread.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from agent.proposal import Proposal
from tools.results import BenchResult, BuildResult, DevicePeak, LaunchResult, ParityResult, ScratchFile, StageBudget

SCHEMA_VERSION = 1


class LogError(Exception):
    pass


class Decision(str, Enum):
    kept = "kept"
    reverted = "reverted"          # evaluated and rejected; commit kept under refs/agent/RUN/rejected/N
    skipped = "skipped"            # no candidate commit (proposal failed, patch did not apply, ...)
    interrupted = "interrupted"    # Ctrl-C / kill during the iteration


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
    candidates: int = 1                # proposals evaluated per iteration (agent/candidates.py)
    at_once: bool = False              # --at-once: the K model requests sent together, each asked for its rank
    workers: int | None = None         # --workers N: a local dask cluster (agent/executor.py)
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
    """One attempt of an iteration that failed and went back to the model for repair (agent/repair.py): what it
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
    """One of an iteration's K candidates that was not the one it settled on (agent/candidates.py)."""
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
    # the estimate's terms (agent/figures.py): the product of the kept steps' speedups over their
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
    # against the reference and the medians by arm, for the best it names (agent/figures.py)
    kept_sha: str | None = None
    kept_vs_reference: float | None = None
    kept_vs_reference_low: float | None = None
    kept_vs_reference_high: float | None = None
    kept_ms: dict[str, float] | None = None
    # each candidate stage's time limit, from the initial kernel's seconds in it (tools/judge/budgets.py)
    stage_budgets: dict[str, StageBudget] = Field(default_factory=dict)


# --- reading and writing ------------------------------------------------------------------
def check_version(data: dict, where: str) -> None:
    v = data.get("schema_version")
    if v != SCHEMA_VERSION:
        raise LogError(f"{where}: written by log schema version {v!r}; this agent reads version "
                       f"{SCHEMA_VERSION}. Use the agent version that wrote it.")


def fsync_dir(d: Path) -> None:
    """A rename or a new file in `d` reaches the disk: the directory's own entry is synced (POSIX leaves that to the
    caller; ext4 and xfs do not promise it after a crash without it)."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Written whole to a temporary file, synced, renamed over `path`, the folder synced: after a power cut the file
    is the old one or the new one, never empty."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """write_atomic of the model's JSON. The run's state says what the records already hold, so the record it follows
    (append_iteration, synced first) is on the disk before the state that names it (issue 61)."""
    write_atomic(path, model.model_dump_json(indent=2).encode())


def mend_tail(run_dir: Path) -> tuple[Path, int] | None:
    """A last record cut short by a kill during its write (the file does not end in a newline: each record is one
    write of a line) is moved to iterations.jsonl.torn-N and the file cut back to its last whole line, so that the next
    record is never appended onto it (issue 42: `agent report` then failed on the joined line). Returns (where the
    torn bytes went, how many), or None when the file ends whole."""
    p = run_dir / "iterations.jsonl"
    data = log_bytes(p)
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    n = 1
    while (aside := run_dir / f"iterations.jsonl.torn-{n}").exists():
        n += 1
    with open(aside, "wb") as f:
        f.write(data[cut:])
        f.flush()
        os.fsync(f.fileno())
    with open(p, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return aside, len(data) - cut


def log_bytes(p: Path) -> bytes | None:
    """iterations.jsonl's bytes, None where there is none; LogError, one line naming it, where it cannot be read (a
    folder of that name, no permission): what mends the records never ends in a traceback over it."""
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LogError(f"{p}: cannot be read ({e.strerror or type(e).__name__}); the run's records cannot be mended "
                       "until it is a file again") from None


def append_iteration(run_dir: Path, rec: IterationRecord) -> None:
    mend_tail(run_dir)   # never onto a torn line (resume_run says so where it finds one)
    p = run_dir / "iterations.jsonl"
    new = not p.exists()
    with open(p, "a") as f:
        f.write(rec.model_dump_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    if new:   # the file's own entry, the first time: a synced record in a file the folder lost is lost too
        fsync_dir(run_dir)


def _load(p: Path, what: str) -> dict:
    """A run file's JSON object, or one line naming the file (a kill or a disk fault can leave it damaged)."""
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LogError(f"{p}: the run's {what} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                       "the run cannot be read until it is restored") from None
    if not isinstance(data, dict):
        raise LogError(f"{p}: the run's {what} is damaged (not a JSON object); the run cannot be read until it is "
                       "restored")
    return data


def read_config(run_dir: Path) -> RunConfig:
    p = run_dir / "run.json"
    if not p.exists():
        raise LogError(f"{run_dir}: no run.json (not a run folder?)")
    data = _load(p, "configuration")
    check_version(data, str(p))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise LogError(f"{p}: does not match the run schema: {e.errors()[0]['msg']}") from None


def read_state(run_dir: Path) -> RunState:
    p = run_dir / "state.json"
    if not p.exists():
        return RunState(status="unknown")
    data = _load(p, "state")
    check_version(data, str(p))
    try:
        return RunState.model_validate(data)
    except ValidationError as e:
        raise LogError(f"{p}: the run's state is damaged (does not match the schema: {e.errors()[0]['msg']}); the "
                       "run cannot be read until it is restored") from None


def read_iterations(run_dir: Path, notes: list[str] | None = None) -> list[IterationRecord]:
    """The run's records in iteration order. A torn last line (a kill mid-write) is left out. Any other damaged line
    raises LogError, unless `notes` is given: then it is left out and said there, in one line (the review commands
    read what they can; `agent resume --repair` sets damaged lines aside and rebuilds a kept one from its commit)."""
    p = run_dir / "iterations.jsonl"
    if not p.exists():
        return []
    out = []
    try:
        lines = p.read_bytes().decode(errors="replace").splitlines()
    except OSError as e:
        if notes is None:
            raise LogError(f"{p}: cannot be read ({e.strerror})") from None
        notes.append(f"{p}: cannot be read ({e.strerror}): no iteration record shown")
        return []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:   # json.JSONDecodeError is one
            if i == len(lines):   # a torn last line from a kill mid-write
                if notes is not None:
                    notes.append(f"{p}:{i}: the last record is cut short ({len(line)} characters, no end): left out")
                break
            if notes is None:
                raise LogError(f"{p}:{i}: not valid JSON") from None
            notes.append(f"{p}:{i}: a damaged record ({type(e).__name__}): left out")
            continue
        check_version(data, f"{p}:{i}")
        try:
            out.append(IterationRecord.model_validate(data))
        except ValidationError as e:
            if notes is None:
                raise
            err = e.errors()[0]
            notes.append(f"{p}:{i}: a record that does not match the schema ({'.'.join(map(str, err['loc']))}: "
                         f"{err['msg']}): left out")
    return sorted(out, key=lambda r: r.iteration)


def runs_dir(repo: Path) -> Path:
    return repo / "runs"


def find_run(repo: Path, run_id: str) -> Path:
    d = runs_dir(repo) / run_id
    if (d / "run.json").exists():
        return d
    matches = [p for p in runs_dir(repo).glob(f"{run_id}*") if (p / "run.json").exists()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LogError(f"no run {run_id!r} under {runs_dir(repo)} (see `agent runs`)")
    raise LogError(f"run id {run_id!r} is ambiguous: {', '.join(sorted(p.name for p in matches))}")


_HELD: list = []    # the lock files of the runs this process drives; the kernel drops the locks when it dies


def hold_run(run_dir: Path) -> None:
    """Take runs/RUN/agent.lock for the life of this process. A second agent on the same run (`agent resume`
    while the run still goes) is refused, and the holder knows that a git lock file left in the run's own
    worktree is stale: no other agent process uses it. A SIGKILLed holder leaves the file, not the lock."""
    f = open(run_dir / "agent.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise LogError(f"run {run_dir.name} is in use by another agent process (pid {pid}); "
                       "wait for it to finish or stop it, then resume") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _HELD.append(f)
