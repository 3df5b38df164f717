"""The judge: `python -m tools.judge.judge`, the candidate checks whose verdict the kernel cannot reach.

    python -m tools.judge.judge evaluate --task DIR --job-stdin      (the options come as one JSON line on stdin)
    python -m tools.judge.judge parity   --task DIR --lib PATH [--seed N] [--no-hidden]
    python -m tools.judge.judge bench    --task DIR --lib PATH [--baseline-lib PATH] [--shapes JSON] [--no-reference]
                                         [--rounds N] [--confidence C]
    python -m tools.judge.judge sanitize --task DIR --job-stdin      ({lib, seed, checks}: tools/judge/later.py)

`evaluate` is the loop's candidate check (launch plan, parity, bench, each only if the one before
passed; pre-started while the candidate builds); `parity` and `bench` are tools.measure.parity's run_parity
and tools.measure.bench's run_bench (the initial kernel, fresh-seed parity, the confirmation bench, the CLIs).

The judge never loads candidate code. It starts a host (tools/judge/host.py: fenced to a scratch directory
of its own inside the judge's, its own process, no setsid so that it dies with the judge's tree), and
asks it to load the candidate and its baseline. Then, in this process:
- the static launch check: the host answers the library's plan as data, tools.measure.launch judges it;
- parity (tools.measure.parity.check, unchanged): the inputs are made here, shipped to the host as files, the
  host's output buffer (poisoned here, guards included) and inputs come back as files, and the
  reference, the comparison, the guard and input checks and the verdict are computed here;
- the bench (tools.measure.bench.measure over HostRuns): the input sets are made here and sent; the host runs
  the arms' bursts and answers per-rep times; this process times each burst request itself and holds
  the host's times to what it saw (tools.measure.stats.outside_check); the probes' outputs come back here.

A host that crashes, exits or answers garbage fails the stage it was in with that reason; what the
host says about correctness counts for nothing. The answer to the agent is one JSON line, on a
private copy of stdout the host never holds: {launch, parity, bench} for evaluate, a ParityResult, or
{results: [BenchResult]}; each with `scratch_files`, what the host left in its scratch directory.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from tools.judge.hostclient import HostClient, HostFailed, Remote
from tools.judge.hostruns import HostRuns
from tools.judge.runner import private_stdout
from tools.judge.sanitize import SANITIZERS
from tools.isolation.sandbox import STAGE_MARK

def mark(stage: str) -> None:
    """Say on stderr which stage starts: the agent charges a crash or timeout of this child to it."""
    sys.stderr.write(f"\n{STAGE_MARK}{stage}\n")
    sys.stderr.flush()


def failed(mode: str, msg: str, status: str, shapes: list[dict]) -> dict:
    """The answer of a check that could not run (or whose host died outside a stage). A bench that
    failed before it knew its shapes (the task did not load) still answers one result with the reason."""
    if mode == "parity":
        return {"status": status, "message": msg}
    if mode == "bench":
        return {"results": [{"status": status, "message": msg, "shape": s} for s in shapes or [{}]]}
    if mode == "sanitize":
        return {"error": msg, "status": status}
    return {"launch": None, "parity": {"status": status, "message": msg}, "bench": None}


# files any kernel's host may leave: glob (relative to the host's directory, its HOME) -> why
ALWAYS_ALLOWED = {".nv/ComputeCache/*": "the CUDA driver's JIT cache (PTX compiled for this GPU)"}


def wrote_files(host: HostClient, task, before: frozenset = frozenset()) -> str | None:
    """Why the kernel's writes so far fail it (issue 39: a library that does file I/O is a defect the user
    hears about before it is merged), or None. Files task.toml's [parity] allow_files names are allowed, and
    those in `before` as they were (path, size): what earlier libraries of a batch left in the same host."""
    from fnmatch import fnmatch
    allow = [*ALWAYS_ALLOWED, *task.spec.parity.allow_files]
    bad = [(p, n) for p, n in host.written() if (p, n) not in before and not any(fnmatch(p, g) for g in allow)]
    if not bad:
        return None
    listed = ", ".join(f"{p} ({n} B)" for p, n in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    # Python ignores SIGXFSZ, so a write past the host's file-size limit fails (EFBIG) and the file stops there
    cap = (host.info.get("limits") or {}).get("fsize_bytes")
    at_cap = f"; stopped at the host's file-size limit (RLIMIT_FSIZE, {cap} bytes)" if any(n == cap for _, n in bad) else ""
    return (f"the kernel wrote files in its working directory: {listed}{at_cap}: a kernel must not do file I/O (task.toml "
            "[parity] allow_files = {\"NAME\" = \"why\"} allows one by name)")


def state_left(host: HostClient, since: int = 0) -> str | None:
    """Why the state the kernel left changed fails it (the floating-point state, tools/judge/fpstate.py; a GPU's
    device-wide settings, tools/judge/devstate.py), or None: its own outputs may be right, its caller's next
    operations are not. `since`: the changes an earlier library of a
    batch left are not this one's."""
    left = host.state_left[since:]
    return left[0] if left else None


def still_running(host: HostClient) -> str | None:
    """Before a keep: why a thread the kernel left on a CPU while nothing calls it fails it (tools/judge/threads.py),
    or None. 0.2 s of the host's time."""
    from tools.judge.threads import describe
    busy = host.ask({"op": "idle"}).get("running")
    return describe(busy) if isinstance(busy, list) and busy and isinstance(busy[0], dict) else None


def checked_parity(task, mod, remote: Remote, job: dict):
    """Parity in the host, then what the kernel wrote by then."""
    from tools.measure.parity import check
    from tools.results import ParityStatus
    par = check(task, mod, "candidate", seed=int(job.get("seed") or 0), hidden=not job.get("no_hidden"),
                run=remote.run, run_kept=remote.run_kept, extent=job.get("parity_extent") or "full")
    extent = job.get("parity_extent") or "full"
    if par.status == ParityStatus.ok and task.backend.gpu and extent != "quick" and not job.get("no_hidden"):
        par = wide(task, mod, remote, job, par)
    if par.status == ParityStatus.ok and (why := wrote_files(remote.host, task) or state_left(remote.host)
                                          or (still_running(remote.host) if extent != "quick" else None)) is not None:
        par = par.model_copy(update={"status": ParityStatus.side_effect, "message": why})
    elif par.status == ParityStatus.ok and remote.threads_left:   # named, not refused: a pool may be by design
        n = len(remote.threads_left)
        par = par.model_copy(update={"message": f"{par.message}; the kernel's calls left {n} thread{'s' * (n != 1)} "
                                                f"running after they returned ({', '.join(remote.threads_left)})"})
    return par


def wide(task, mod, remote: Remote, job: dict, par):
    """Parity's result with the wide shape's (tools/judge/wide.py): its check appended, its failure parity's, its
    skip said in the message."""
    from tools.judge.wide import check_wide
    sc, line = check_wide(task, mod, remote, int(job.get("seed") or 0))
    if sc is None:
        return par.model_copy(update={"message": f"{par.message}; {line}"})
    update = {"checks": [*par.checks, sc], "seconds": par.seconds + (sc.seconds or 0.0)}
    if sc.ok:
        return par.model_copy(update={**update, "message": f"{par.message}; {line}"})
    return par.model_copy(update={**update, "status": sc.status, "message": sc.message})


def bench(task, mod, remote: Remote, job: dict, shapes: list[dict]) -> list[dict]:
    """The bench of the job's library; the probes that look at the library alone (BEFORE_KEEP: two threads calling it)
    and that an earlier bench ran clean on it (job["probes_done"]: a confirmation's first bench, issue 66: the
    reentrant probe was 0.8-1.7 s of each of a keep's two benches on an H200) are not run again, and the message says
    so. The others look at this bench's own timing, and run."""
    from tools.measure.bench import measure
    from tools.measure.probes import BEFORE_KEEP
    from tools.results import BenchStatus
    gain = job.get("keep_gain")
    done = tuple(c for c in BEFORE_KEEP if c.__name__ in (job.get("probes_done") or ()))
    res = measure(task, mod, None, shapes=shapes, with_reference=not job.get("no_reference"),
                  runs_for=lambda shape: HostRuns(remote, shape, bool(job.get("baseline_lib"))),
                  keep_gain=float(gain) if isinstance(gain, (int, float)) else None,
                  left=(done, "it ran clean on this library in its first bench") if done else ((), ""))
    if (why := wrote_files(remote.host, task) or state_left(remote.host)) is not None:
        res = [r.model_copy(update={"status": BenchStatus.side_effect, "message": why}) if r.status == BenchStatus.ok
               else r for r in res]
    return [r.model_dump(mode="json") for r in res]


def evaluate(task, mod, remote: Remote, job: dict, shapes: list[dict], early: dict | None = None) -> dict:
    """The launch check, parity, then the bench, each only if the one before passed. `early`: the sanitizer hosts
    main() started before the job came (tools/judge/sanitize.py start_hosts), taken by the checks that run."""
    import time

    from tools.measure.launch import from_context
    from tools.results import ParityStatus
    launch, plan = None, None
    ctx = job.get("launch_context")
    if ctx:
        mark("launch")
        t0 = time.monotonic()
        try:
            plan = remote.host.ask({"op": "plan", "lib": "candidate"})["plan"]
        except (HostFailed, RuntimeError) as e:
            plan = {"ok": False, "error": f"the host could not answer the launch plan: {e}"}
        res = from_context(task, plan, ctx)
        res.seconds = time.monotonic() - t0
        launch = res.model_dump(mode="json")
        if res.status.value != "ok":
            return {"launch": launch, "parity": None, "bench": None}
    # compute-sanitizer's hosts run beside parity in this one (their start-up, a torch and a CUDA context under the
    # sanitizer, is paid while parity runs, or was paid before the job came: `early`, issue 66); joined after it,
    # before the bench times anything
    # (`later`: the checks the agent runs after the keep, tools/judge/later.py; those that apply are named in
    # the answer)
    from tools.judge.sanitize import Sanitizing
    wanted = ("memcheck", "racecheck") if uses_shared_memory(ctx, plan) else ("memcheck",)
    later = [c for c in wanted if c in (job.get("later") or ())] if job.get("memcheck") and task.backend.gpu else []
    now = tuple(c for c in wanted if c not in later)
    beside = Sanitizing(task, mod, job, now, early) if job.get("memcheck") and task.backend.gpu and now else None
    try:
        mark("parity")
        par = checked_parity(task, mod, remote, job)
        if par.status != ParityStatus.ok:
            return {"launch": launch, "parity": par.model_dump(mode="json"), "bench": None}
        if beside is not None:
            mark("memcheck")
            par = beside.result(par)
            if par.status != ParityStatus.ok:
                return {"launch": launch, "parity": par.model_dump(mode="json"), "bench": None}
    finally:
        if beside is not None:
            beside.stop()
    mark("bench")
    if later:
        par = par.model_copy(update={"message": f"{par.message}; {', '.join(later)} after the keep", "later": later})
    return {"launch": launch, "parity": par.model_dump(mode="json"),
            "bench": {"results": bench(task, mod, remote, job, shapes)}}


def uses_shared_memory(ctx: dict | None, plan: dict | None) -> bool:
    """Does the candidate use shared memory (ptxas' static bytes, or a launch's dynamic bytes)? True where it is not
    known (no launch context: racecheck runs)."""
    if not ctx:
        return True
    static = any(int(k.get("smem_static_bytes") or 0) > 0 for k in ctx.get("kernels") or [])
    launches = plan.get("launches") or [] if isinstance(plan, dict) else []
    return static or any(int(x.get("smem_dynamic_bytes") or 0) > 0 for x in launches if isinstance(x, dict))


def run(mode: str, task, mod, host: HostClient | None, job: dict, shapes: list[dict],
        early: dict | None = None) -> dict:
    if not job.get("lib"):
        raise ValueError("no library given")
    if mode == "sanitize":     # no host here: each check has its own under the tool (`early`'s, or started now)
        from tools.judge.later import sanitize_job
        return sanitize_job(task, mod, job, early)
    host.ask({"op": "load", "id": "candidate", "path": job["lib"]})
    if job.get("baseline_lib"):
        host.ask({"op": "load", "id": "baseline", "path": job["baseline_lib"]})
    remote = Remote(host)
    if mode == "parity":
        return checked_parity(task, mod, remote, job).model_dump(mode="json")
    if mode == "bench":
        return {"results": bench(task, mod, remote, job, shapes)}
    return evaluate(task, mod, remote, job, shapes, early)


CONTEXT_WAIT_S = 3.0     # how long a killed host's CUDA context may stay on the GPU before it is named


def outlived(host: HostClient, mode: str, result: dict) -> None:
    """A GPU host that ran without the no-fork filter (AGENT_HOST_NOFORK=0, or a machine without seccomp) could leave
    a process holding its CUDA context, and the kernels it queued, after its kill: the next candidate would be timed
    beside them (an honest softmax's events said 48 us a call, back-to-back calls took 104 us:
    scripts/device/gpu_outlives.py). Where nvidia-smi still lists the host's pid after the host was reaped, the
    answer's verdict fails with `side_effect` and the reason; a verdict already failed keeps its own."""
    pid = host.info.get("pid")
    if not pid or (host.info.get("limits") or {}).get("nofork") or not host.info.get("gpu"):
        return
    from tools.backends.device import context_outlived
    took = context_outlived(int(pid), CONTEXT_WAIT_S)
    if took is None:
        return
    why = (f"the kernel's host was ended, but its CUDA context (pid {pid}) was still on the GPU {took:.1f} s later: a "
           "process it started holds it, with whatever it queued (a kernel must not start processes)")
    parts = [result] if mode == "parity" else (result.get("results") or []) if mode == "bench" else \
        [p for p in (result.get("parity"),) if p] + list(((result.get("bench") or {}).get("results")) or [])
    for part in parts:
        if part.get("status") == "ok":
            part.update(status="side_effect", message=why)


def bench_overrides(spec, job: dict):
    """The spec with the job's bench rounds and interval coverage in place of task.toml's, validated as task.toml's
    would be (the loop's re-bench of a doubtful candidate: more rounds, a stricter interval)."""
    over = {k: job[k] for k in ("rounds", "confidence") if job.get(k) is not None}
    if not over:
        return spec
    from tools.taskspec import BenchSpec
    return spec.model_copy(update={"bench": BenchSpec.model_validate({**spec.bench.model_dump(), **over})})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.judge.judge")
    ap.add_argument("mode", choices=["evaluate", "parity", "bench", "sanitize"])
    ap.add_argument("--task", required=True)
    ap.add_argument("--job-stdin", action="store_true", help="wait for the job (the options below, as one "
                    "JSON object) on stdin: the judge and its host start up while the candidate builds")
    ap.add_argument("--lib")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hidden", action="store_true")
    ap.add_argument("--extent", choices=["full", "quick", "rest", "range"], default="full",
                    help="parity's shapes and seeds (tools.measure.parity.check): all; the listed and hidden shapes on "
                         "the first seed; what that left out; or the [dims] extremes alone")
    ap.add_argument("--sanitize-early", nargs="?", const=",".join(SANITIZERS), help="start compute-sanitizer's hosts "
                    "(these, default memcheck,racecheck) now, before the job: a confirmation's checks, or those "
                    "after a keep (sanitize), then find them started (GPU tasks)")
    ap.add_argument("--baseline-lib")
    ap.add_argument("--shapes", help="JSON list of shape dicts (default: the main shape)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--rounds", type=int, help="the bench's rounds instead of task.toml's (a re-bench: agent/evaluation/attempt.py)")
    ap.add_argument("--confidence", type=float, help="the bench interval's coverage instead of task.toml's")
    a = ap.parse_args(argv)
    out = private_stdout()
    job = {"lib": a.lib, "seed": a.seed, "no_hidden": a.no_hidden, "parity_extent": a.extent, "baseline_lib": a.baseline_lib,
           "shapes": json.loads(a.shapes) if a.shapes else None, "no_reference": a.no_reference,
           "rounds": a.rounds, "confidence": a.confidence}
    host, result, shapes, early = None, None, job["shapes"] or [], {}
    try:
        if a.sanitize_early:     # first: their start-up overlaps this child's own and whatever the agent does meanwhile
            from tools.judge.sanitize import start_hosts
            early = start_hosts(Path(a.task), Path(os.environ.get("AGENT_SCRATCH") or os.getcwd()),
                                tuple(a.sanitize_early.split(",")))
        import torch  # noqa: F401  (here first: the host is forked from this process with it, HostClient)
        host = HostClient(Path(a.task), Path(os.environ.get("AGENT_SCRATCH") or os.getcwd())) \
            if a.mode != "sanitize" else None
        from tools.task import load_task
        task = load_task(a.task)
        mod = task.module()
        task.backend.warm_up()
        from tools.measure.warmup import LOST, wanted, warm_checks, while_idle
        own = secrets.randbits(31)   # the root seed of a job that names none (run_candidate's)
        warmed = ""
        if a.job_stdin and a.mode in ("evaluate", "parity") and wanted(task, bool(a.sanitize_early)):   # its first kernels
            print(f"[judge] {(warmed := warm_checks(task, mod))}", file=sys.stderr)
        if LOST in warmed:
            return 0      # ended before its job: the agent starts a cold child (WarmChild.serves)
        if a.job_stdin:
            line, done = sys.stdin.readline(), set()
            while line.strip() and set(step := json.loads(line)) <= {"idle"}:   # the agent's word on its card
                if step["idle"]:    # agent/evaluation/spares.py: a keep's values draws' search
                    print(f"[judge] {(warmed := while_idle(task, mod, own, done, host=host))}", file=sys.stderr)
                    if LOST in warmed:
                        return 0
                line = sys.stdin.readline()
            if not line.strip():
                return 0      # never given a job (the agent moved on, or died)
            job.update(json.loads(line))
            job["seed"] = own if job.get("seed") is None else job["seed"]
        task.spec = bench_overrides(task.spec, job)
        shapes = job.get("shapes") or [dict(task.spec.main)]
        result = run(a.mode, task, mod, host, job, shapes, early)
    except HostFailed as e:
        result = failed(a.mode, f"{a.mode}: {e}", e.status, shapes)
    except Exception as e:  # a bad task, a library that does not load, a missing symbol: one line
        msg = " ".join(str(e).split())[:500]
        result = failed(a.mode, f"{a.mode} could not run: {type(e).__name__}: {msg}", "error", shapes)
    finally:
        while early:     # started, and not taken by a check (no job, a failure before parity, no memcheck asked)
            early.popitem()[1].close()
        if host is not None:
            files = host.close()
            if result is not None:
                result["scratch_files"] = [f.model_dump(mode="json") for f in files]
                outlived(host, a.mode, result)
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 0

if __name__ == "__main__":
    sys.exit(main())
