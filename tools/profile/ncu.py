"""Capture: run ncu on the task's kernel only, then read the report.

    ncu --target-processes all -k regex:<task.kernel_regex> --launch-skip <W*launches_per_call>
        --launch-count <launches_per_call> --clock-control none --section ... --metrics ...
        -o <rep> -f python -m tools.profile.target --task DIR --lib PATH --shape-index I --warmup W --iters 1

Clock control is `none`: the card's clocks as found (we never lock or change them), stated in the
JSON. Tier 1 (default) collects SpeedOfLight, LaunchStats, Occupancy, WarpStateStats (the stall reasons) and a few
cache/tensor metrics; tier 2 adds Compute/MemoryWorkloadAnalysis and SchedulerStats. Never `--set full`.

`--launch-skip` counts only launches that match `-k`, so skipping W*launches_per_call skips the
warm-up calls. If a call launches more matching kernels than `launches_per_call` says, the
profiled launch still comes after at least W matching launches: warm, never the cold first one.

`whole_call`: every launch of one warm call instead, whatever its kernel's name and however many a call makes: the
target runs that call inside an NVTX push/pop range (--nvtx --nvtx-include RANGE/), no -k, no launch skip. Its
LaunchStats are then the call's real geometry, one launch a kernel in launch order: the loop's launch check of a
candidate about to be kept reads them (tools/measure/launch.py from_profile), so one Nsight Compute pass serves as
the launch trace and as the profile the next proposal reads (issue 66: they were two processes, 8.7 s and 7.6 s of
a kept attention iteration on an H200).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tools.profile.classify import HINTS, classify_failure, missing_metric
from tools.profile.model import ProfileEnv, ProfileReport, ProfileStatus
from tools.backends.toolchain import find_ncu
from tools.profile.reader import read_report_isolated as read_report
from tools.profile.target import shape_index, target_argv, target_env
from tools.isolation.sandbox import ProcResult, run_isolated
from tools.isolation.scratch import Scratch
from tools.task import Task

# tier 1 has WarpStateStats since issue 63: the model is asked to reason from stall reasons, and tier 1 is what the
# loop profiles each new best with
TIER_SECTIONS = {
    1: ["SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats"],
    2: ["SpeedOfLight", "LaunchStats", "Occupancy", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis",
        "SchedulerStats", "WarpStateStats"],
}
# a few memory/tensor metrics beyond the tier-1 sections (tier 2's sections carry their own)
EXTRA_METRICS = ["l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct",
                 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"]
CLOCK_CONTROL = "none"
_PASSES = re.compile(r"-\s*(\d+)\s+pass(?:es)?")
NVTX_RANGE = "agent_call"       # the whole call's NVTX range (tools/profile/target.py --nvtx)
CALL_LAUNCHES_MAX = 64          # launches of one call profiled at most (each is replayed for its sections)
LACKING: set[str] = set()       # EXTRA_METRICS this machine's ncu or GPU said it lacks (a pass failed on it)


@functools.lru_cache(maxsize=None)
def ncu_version(ncu: str) -> str | None:
    """The version `ncu --version` prints, once a process a path (a subprocess each pass before: issue 66)."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Version\s+(\S+)", out)
    return m.group(1) if m else None


def driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    return _driver(smi) if smi else None


@functools.lru_cache(maxsize=None)
def _driver(smi: str) -> str | None:
    """The driver's version, once a process (nvidia-smi was a subprocess each pass; no driver changes under a run)."""
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0].strip() if out else None


def ncu_argv(ncu: str, tier: int, kernel_regex: str | None, launch_skip: int, launch_count: int, report_stem: Path,
             metrics: list[str], nvtx: str | None = None) -> list[str]:
    """ncu's command line: the launches matching `kernel_regex` after `launch_skip` of them, `launch_count` in all; or,
    with `nvtx`, every launch inside that NVTX push/pop range (`launch_count` at most)."""
    if tier not in TIER_SECTIONS:
        raise ValueError(f"tier must be 1 or 2, not {tier}")
    argv = [ncu, "--target-processes", "all"]
    if nvtx:
        argv += ["--nvtx", "--nvtx-include", f"{nvtx}/", "--launch-count", str(launch_count)]
    else:
        if kernel_regex:
            argv += ["-k", f"regex:{kernel_regex}"]
        argv += ["--launch-skip", str(launch_skip), "--launch-count", str(launch_count)]
    argv += ["--clock-control", CLOCK_CONTROL]
    for s in TIER_SECTIONS[tier]:
        argv += ["--section", s]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    return argv + ["-o", str(report_stem), "-f"]


def pass_argv(ncu: str, task: Task, lib_path: str | Path | None, idx: int, tier: int, stem: Path, whole_call: bool,
              warmup: int = 3, launches_per_call: int = 1, metrics: list[str] | None = None) -> list[str]:
    """ncu and its target: one pass of profile_task over the shape `idx` (`lib_path` None: a target that waits for
    its library, tools/profile/warm.py)."""
    metrics = [m for m in EXTRA_METRICS if m not in LACKING] if metrics is None else metrics
    target = target_argv(task, lib_path, idx, warmup, 1, nvtx=NVTX_RANGE if whole_call else None)
    return (ncu_argv(ncu, tier, None, 0, CALL_LAUNCHES_MAX, stem, metrics, nvtx=NVTX_RANGE) if whole_call else
            ncu_argv(ncu, tier, task.spec.kernel_regex, warmup * launches_per_call, launches_per_call, stem, metrics)) \
        + target


def _failure(status: ProfileStatus, message: str, task: Task, shape: dict, env: ProfileEnv) -> ProfileReport:
    return ProfileReport(status=status, message=message, hint=HINTS.get(status, ""), task=task.name, shape=shape, env=env)


def profile_task(task: Task, lib_path: str | Path, *, tier: int = 1, shape: int | dict | None = None,
                 timeout_s: float = 300, out_dir: str | Path | None = None, warmup: int = 3,
                 launches_per_call: int = 1, fallback: bool = True, measure_bare: bool = False,
                 whole_call: bool = False, warm=None) -> ProfileReport:
    """Profile the task's kernel(s) on one shape (default: the main shape); `whole_call`: every launch of one warm call
    (module docstring); `warm`: a pass started earlier (tools/profile/warm.py WarmPass), used where it is this pass,
    its held report reader in any case (the caller closes it in any case). Never raises for a failure of ncu or of
    the program: every failure is a status with a hint."""
    spec = task.spec
    idx = spec.main_shape if shape is None else shape_index(task, shape)
    shp = dict(spec.shapes[idx])
    env = ProfileEnv(clock_control=CLOCK_CONTROL, tier=tier)
    if not task.backend.gpu:
        return _failure(ProfileStatus.error, f"task {spec.name} runs on the {spec.device}: Nsight Compute profiles CUDA kernels",
                        task, shp, env).model_copy(update={"hint": "profile a CUDA task (device = \"cuda\")"})
    ncu = find_ncu()
    if not ncu:
        return _maybe_fallback(_failure(ProfileStatus.ncu_not_found, "ncu is not on PATH", task, shp, env),
                               fallback, task, lib_path, idx, timeout_s)
    env.ncu_version, env.driver = ncu_version(ncu), driver_version()
    own = out_dir is None      # a folder of our own: kept only where the report it holds is named
    out = Path(tempfile.mkdtemp(prefix="agent-profile-")) if own else Path(out_dir).resolve()   # ncu runs elsewhere
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"profile-t{tier}-s{idx}"
    rep = stem.with_name(stem.name + ".ncu-rep")
    metrics = [m for m in EXTRA_METRICS if m not in LACKING]
    dropped: list[str] = []
    held = warm     # its report reader reads this pass's report: not an alias, the loop below drops `warm` once run
    t_end = time.monotonic() + timeout_s
    while True:
        rep.unlink(missing_ok=True)
        argv = pass_argv(ncu, task, lib_path, idx, tier, stem, whole_call, warmup, launches_per_call, metrics)
        if warm is not None and warm.serves(pass_argv(ncu, task, None, idx, tier, stem, whole_call, warmup,
                                                      launches_per_call, metrics), stem):
            argv = warm.argv      # the same pass, started before the candidate was known (tools/profile/warm.py)
            proc = warm.run(Path(lib_path), rep, max(1.0, t_end - time.monotonic()))
            failure = classify_failure(proc, rep.is_file())
            if failure and failure[0] == ProfileStatus.no_kernel_matched and '"ok": true' not in proc.stdout:
                warm = None       # its target never had the job (an ncu that does not hand its stdin on): cold
                continue
        else:
            proc = fenced(argv, max(1.0, t_end - time.monotonic()), out, ncu=True)
        warm = None
        failure = classify_failure(proc, rep.is_file())
        gone = missing_metric(proc.stdout + proc.stderr) if failure else None
        if gone in metrics:          # this ncu/GPU lacks one of our extra metrics: drop it, try once more
            metrics.remove(gone)
            dropped.append(gone)
            LACKING.add(gone)        # and leave it out of this process's later passes (a warm one's too)
            continue
        break
    env.wall_seconds = round(proc.seconds, 3)
    (out / "ncu.log").write_text(f"$ {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    if failure:
        status, message = failure
        if status == ProfileStatus.target_failed:
            message += " | program: " + _target_tail(proc)
        if own:   # no report to keep, and the log's tail is in the message
            shutil.rmtree(out, ignore_errors=True)
        return _maybe_fallback(_failure(status, message, task, shp, env), fallback, task, lib_path, idx, timeout_s)
    report = read_report(rep, source="ncu", held=held.take_reader() if held is not None else None)
    m = _PASSES.findall(proc.stdout + proc.stderr)
    env.replay_passes = int(m[-1]) if m else None
    env.gpu, env.sm_count = report.env.gpu, report.env.sm_count
    if measure_bare:
        target = target_argv(task, lib_path, idx, warmup, 1, nvtx=NVTX_RANGE if whole_call else None)
        bare = fenced(target, timeout_s, out, ncu=False)
        env.bare_seconds = round(bare.seconds, 3) if bare.status.value == "ok" else None
    notes = [f"report: {rep}"] + ([f"dropped metrics this ncu/GPU lacks: {', '.join(dropped)}"] if dropped else [])
    return report.model_copy(update={"env": env, "task": task.name, "shape": shp,
                                     "message": "; ".join(filter(None, [report.message, *notes]))})


def fenced(argv: list[str], timeout_s: float, where: Path, ncu: bool) -> ProcResult:
    """ncu and its target (`ncu`; else the target alone) in a scratch directory of its own under `where` (the pass's folder),
    which the target fences itself to (tools/profile/target.py): what the candidate's code leaves there is listed for
    the record, then removed."""
    with Scratch(where, "profile") as s:
        return run_isolated(argv, timeout_s, cwd=s.dir, env=target_env(s, ncu=ncu))


def _target_tail(proc: ProcResult) -> str:
    lines = [l for l in (proc.stderr + "\n" + proc.stdout).splitlines() if l.strip() and not l.startswith("==")]
    return " / ".join(lines[-2:]) or "(no output)"


def _maybe_fallback(fail: ProfileReport, fallback: bool, task: Task, lib_path, idx: int, timeout_s: float) -> ProfileReport:
    if not fallback or fail.status not in (ProfileStatus.ncu_not_found, ProfileStatus.counters_not_permitted,
                                            ProfileStatus.driver_incompatible):
        return fail
    from tools.profile.fallback import profile_fallback
    fb = profile_fallback(task, lib_path, shape=idx, timeout_s=timeout_s)
    if fb.status != ProfileStatus.fallback:
        return fail.model_copy(update={"message": f"{fail.message}; fallback (torch profiler) also failed: {fb.message}"})
    return fb.model_copy(update={"message": f"{fail.status.value}: {fail.message}; no counters, geometry from the torch profiler trace",
                                 "hint": fail.hint, "env": fb.env.model_copy(update={"ncu_version": fail.env.ncu_version,
                                                                                     "driver": fail.env.driver})})


def report_json(report: ProfileReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2)
