"""compute-sanitizer memcheck on a CUDA candidate about to be kept (issue 40): an access outside every allocation
fails the candidate even when its output is right and the bytes it touched came back unchanged.

Parity sees what a kernel leaves in memory: its output, 64 KiB of poisoned guard around it, its inputs. It
cannot see a read past the end of an input (the max pass reads a whole vector at a ragged end, masks the lanes
it should not have read), nor a read-modify-write past the end of the output that puts the bytes back: the
output is right and the guard unchanged, but on a user's tensor the access lands in another allocation or in
unmapped memory (a fault, or another tensor's bytes racing with its owner).
tests/fixtures/cuda_cheats/softmax/ holds such kernels (README.md there, "Memcheck forms").

How: a second host (tools/judge/host.py) started under `compute-sanitizer --tool memcheck`, with PyTorch's caching
allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is then its own cudaMalloc of its exact size; with the
cache a tensor is a block rounded to 512 bytes inside a 2 MiB segment, and memcheck sees nothing past its end).
The candidate is called once per shape on inputs and an output of their exact sizes (no guard: an output inside
a guarded buffer has valid memory on both sides). The shapes: the listed and hidden ones, then the extremes of the
task's [dims] (tails, short rows) while they stay small, at most MAX_SHAPES. The sanitizer's report goes to a
file in the judge's directory (the fenced host cannot write there); its first error is quoted in the verdict.
Where the machine has no compute-sanitizer the check is skipped, and the record says so. AGENT_SANITIZER_LOGS=DIR
keeps each report there. The judge (tools/judge/judge.py evaluate) starts the checks' hosts before the candidate's
parity and joins them after it (Sanitizing): their start-up runs while parity does; a parity failure ends them.

racecheck (the same host, `--tool racecheck`): where the kernel uses shared memory (ptxas' static bytes or a launch's
dynamic bytes), after memcheck, on the small shapes alone (it instruments every shared-memory access): the smallest
listed shape, then the [dims] extremes with the fewest rows (its cost goes with the blocks: rows()), RACE_SHAPES in
all, none past RACE_ELEMENTS. A read and a write of the same shared-memory word by threads of one block with no barrier
between (a `__syncthreads()` dropped as "redundant", one buffer reused for two reductions) is right
whenever the scheduler happens to order them, which in a test it usually does: the race fails the candidate
(parity's `race`) with the sanitizer's first report quoted. Its warnings (hazards whose outcome cannot differ) do
not.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import shutil
import time
from pathlib import Path

from tools.judge.sanitize_report import WHAT, parse_log   # what a report says
from tools.judge.sanitize_shapes import RACE_ELEMENTS, RACE_SHAPES, shapes   # which shapes each check calls

TIMEOUT_S = 240.0          # the memcheck's share of the confirmation child's budget (tools/judge/candidate.py)
ERROR_EXIT = 86            # the sanitizer's exit code when it reported an error
# memcheck's padding after every allocation, as parity's guard: without it a read past the end of a tensor whose size is
# a multiple of the allocation granularity (attention's K at B=4,H=4,S=2048: 2 MiB) lands in the next tensor (V), and
# memcheck, which checks addresses and not owners, sees a valid access (long_rows_prefetch.cu passed it so on an H200)
PADDING = 1 << 16


# racecheck leaves PyTorch's own kernels alone (substrings of their mangled names: at::native, and the cub torch
# builds as at_cuda_detail): the host's copies, fills and comparisons around each call are not the candidate's, and
# under the tool every shared-memory access of theirs was tracked too. A candidate's library that names one of these
# (code copied from PyTorch keeps its namespace: names_torch_kernels) gets a racecheck of every kernel. memcheck checks
# every kernel: a torch kernel that an extension hands a bad pointer reads outside its tensors on the candidate's account.
TORCH_KERNELS = ("2at6native", "at_cuda_detail")

ALLOW_ENV = "AGENT_ALLOW_UNCHECKED"     # the checks a user lets a kept kernel go without: "memcheck,racecheck"


def allowed_unchecked() -> list[str]:
    """The sanitizer checks the user allows a keep without, where they cannot run (AGENT_ALLOW_UNCHECKED)."""
    return [w for w in os.environ.get(ALLOW_ENV, "").replace(",", " ").split() if w in ("memcheck", "racecheck")]


def find_sanitizer() -> str | None:
    """AGENT_SANITIZER where set (that tool, or None where it is not an executable); else compute-sanitizer on PATH,
    else under $CUDA_HOME or /usr/local/cuda; None where the machine has none."""
    if (named := os.environ.get("AGENT_SANITIZER")):
        return named if os.access(named, os.X_OK) and os.path.isfile(named) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(p := os.path.join(root, "bin", "compute-sanitizer"), os.X_OK):
            return p
    return None


def command(tool: str, log: Path, check: str = "memcheck", exclude_torch: bool = True) -> list[str]:
    """The wrapper for the host's command line: memcheck (or racecheck), its report in `log`, exit code ERROR_EXIT
    on an error; racecheck leaves PyTorch's own kernels out unless `exclude_torch` is False."""
    pad = ["--padding", str(PADDING)] if padded(tool) else []
    torch_own = [a for k in TORCH_KERNELS for a in ("--kernel-name-exclude", f"kns={k}")] \
        if exclude_torch and "--kernel-name-exclude" in help_text(tool) else []
    only = ["--leak-check", "no", *pad] if check == "memcheck" else ["--racecheck-report", "analysis", *torch_own]
    return [tool, "--tool", check, *only, "--report-api-errors", "no", "--print-limit", "20",
            "--error-exitcode", str(ERROR_EXIT), "--log-file", str(log)]


@functools.cache
def help_text(tool: str) -> str:
    """This compute-sanitizer's `--help` ("" where it does not answer): which options it takes."""
    import subprocess
    try:
        return subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def padded(tool: str) -> bool:
    """Whether this compute-sanitizer takes `--padding` (2025.3.1 on the H200 does): one that does not would refuse
    to start with it, so memcheck runs unpadded there, and its result says so."""
    return "--padding" in help_text(tool)


def environment() -> dict[str, str]:
    """The host's environment under the sanitizer: every tensor its own allocation of its exact size."""
    return {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def _ender(halt, host):
    """A thread that ends `host` (the sanitizer, then the host under it) once `halt` is set or the host has ended:
    a host still starting (a torch and a CUDA context under the sanitizer) is not waited for."""
    import threading

    def watch() -> None:
        while host.proc.poll() is None:
            if halt.wait(0.1):
                host.kill()
                return
    t = threading.Thread(target=watch, daemon=True, name=f"sanitizer-halt-{host.proc.pid}")
    t.start()
    return t


class Steps:
    """The seconds between marks, from `t0`: each mark names what ran since the one before (a result's steps)."""

    def __init__(self, t0: float):
        self.last, self.seen = t0, {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.seen[name] = round(now - self.last, 3)
        self.last = now


_SERIAL = itertools.count()     # each host's report file its own name in this process


class Started:
    """A host started under compute-sanitizer `check` before its candidate is known (start_hosts): its start-up (a
    torch and a CUDA context under the tool: two thirds of the check's seconds on an H200, BENCHMARKS.md) runs while
    the agent does other work; memcheck() then loads the candidate into it."""

    def __init__(self, task_root: Path, root: Path, tool: str, check: str, exclude_torch: bool = True):
        from tools.judge.hostclient import HostClient
        self.check, self.padded = check, padded(tool)
        self.log = Path(root) / f"{check}-{os.getpid()}-{next(_SERIAL)}.log"
        wrap = command(tool, self.log, check, exclude_torch)
        self.excludes = "--kernel-name-exclude" in wrap      # PyTorch's own kernels left out (TORCH_KERNELS)
        self.host = HostClient(Path(task_root), Path(root), wrap=wrap, env=environment())

    def close(self) -> None:
        """End a host no check used (its report, if any, is not wanted)."""
        self.host.close()
        self.log.unlink(missing_ok=True)


def names_torch_kernels(lib: str | Path) -> bool:
    """Whether the candidate's library names a kernel (or anything) in PyTorch's namespaces that racecheck leaves out
    (TORCH_KERNELS): code copied from PyTorch keeps `namespace at::native`. A kernel registered by the CUDA runtime
    has its mangled name in the library's host data, uncompressed. True where the file cannot be read."""
    try:
        data = Path(lib).read_bytes()
    except OSError:
        return True
    return any(k.encode() in data for k in TORCH_KERNELS)


SANITIZERS = ("memcheck", "racecheck")     # the tools a keep runs, in start_hosts' order


def start_hosts(task_root: Path, root: Path, checks: tuple[str, ...] = SANITIZERS) -> dict:
    """{check: Started} for each of `checks`, started now; {} where the machine has no compute-sanitizer (memcheck()
    then says the check was skipped)."""
    tool = find_sanitizer()
    return {c: Started(task_root, root, tool, c) for c in checks} if tool is not None else {}


def memcheck(task, mod, job: dict, root: Path, seed: int, check: str = "memcheck", halt=None,
             started: Started | None = None) -> dict:
    """The candidate (job["lib"]) under compute-sanitizer `check` (memcheck or racecheck), in a host of its own
    (`started`: one start_hosts() began, else one started now). Returns a SanitizerResult's fields. `halt` (a
    threading.Event): once set, the host is ended where it is (starting, or between shapes) and the result says the
    check was stopped (the judge no longer needs it: parity failed)."""
    import torch

    from tools.judge.hostclient import HostFailed, Remote
    from tools.task_messages import make_inputs
    t0 = time.monotonic()     # from when the check was asked: a host started earlier has its start-up hidden
    in_torch = check == "racecheck" and names_torch_kernels(job["lib"])
    # one that would leave the candidate's own kernel out, or that ended while it waited (killed, out of memory): a
    # host of its own, as where none was started early (a dead one would fail a keep its candidate did not fail)
    if started is not None and ((started.excludes and in_torch) or started.host.proc.poll() is not None):
        started.close()
        started = None
    if started is None:
        tool = find_sanitizer()
        if tool is None:
            return {"tool": check, "status": "skipped", "seconds": 0.0,
                    "message": f"{check} skipped: compute-sanitizer is not on this machine (AGENT_SANITIZER, PATH, "
                               "$CUDA_HOME/bin)"}
        started = Started(task.root, Path(root), tool, check, exclude_torch=not in_torch)
    log, host = started.log, started.host
    todo = shapes(task.spec, mod, random.Random(seed)) if check == "memcheck" else \
        shapes(task.spec, mod, random.Random(seed), RACE_SHAPES, RACE_ELEMENTS, RACE_ELEMENTS)
    done, failure, loaded = [], None, False
    deadline = t0 + TIMEOUT_S * 0.8
    ender = _ender(halt, host) if halt is not None else None
    steps, slowest = Steps(t0), ("", 0.0)
    try:
        host.ready()
        steps.mark("wait")
        host.ask({"op": "load", "id": "candidate", "path": job["lib"]})
        steps.mark("load")
        loaded = True
        remote = Remote(host)
        dist = task.spec.distributions[0]
        for shape, label in todo:
            if time.monotonic() > deadline or (halt is not None and halt.is_set()):
                break
            c0 = time.monotonic()
            inputs = make_inputs(mod, shape, seed, task.backend.torch_device, dist)
            template = mod.empty_output(shape, *inputs)
            out = torch.empty(template.shape, dtype=template.dtype, device=template.device)   # its own allocation
            remote.run("candidate", shape, out, *inputs)
            done.append(label)
            slowest = max(slowest, (label, time.monotonic() - c0), key=lambda x: x[1])
        steps.mark("calls")
    except (HostFailed, RuntimeError) as e:
        failure = " ".join(str(e).split())[:300]
    finally:
        rc = host.finish(timeout=60.0) if halt is None or not halt.is_set() else None
        host.close()
        if ender is not None:
            ender.join()

    def went() -> dict:
        """Its steps, "finish" up to now (the tool's end, its report read): they add up to its seconds."""
        steps.mark("finish")
        return {"steps": {**steps.seen, **({"slowest": round(slowest[1], 3)} if slowest[0] else {})},
                "slowest_shape": slowest[0], "seconds": steps.last - t0}
    if halt is not None and halt.is_set():
        log.unlink(missing_ok=True)
        return {**went(), "tool": check, "status": "error", "shapes": len(done),
                "message": f"{check} stopped: its answer was not needed (parity had failed)"}
    text = log.read_text(errors="replace") if log.exists() else ""
    if os.environ.get("AGENT_SANITIZER_LOGS") and log.exists():   # kept for the user (or a device script's evidence)
        keep = Path(os.environ["AGENT_SANITIZER_LOGS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, keep / f"{sum(1 for _ in keep.iterdir()):03d}-{log.name}")
    log.unlink(missing_ok=True)
    errors, first = parse_log(text)
    where_went = went()
    secs = where_went["seconds"]       # where_went carries it into each result below
    where = f" (at {todo[len(done)][1]})" if failure is not None and len(done) < len(todo) else ""
    one, many, why = WHAT[check]
    if errors or rc == ERROR_EXIT:
        return {**where_went, "tool": check, "status": "failed", "errors": max(errors, 1),
                "shapes": len(done),
                "message": f"compute-sanitizer {check}: "
                           f"{f'{errors} {one if errors == 1 else many}' if errors else 'an error'}{where}: "
                           f"{first or failure or 'see the sanitizer'}: {why}"}
    if failure is not None and loaded:   # the kernel failed under the sanitizer, and only there
        return {**where_went, "tool": check, "status": "failed", "shapes": len(done),
                "message": f"under compute-sanitizer {check} the kernel's call failed{where}: {failure}"}
    if failure is not None:   # the sanitizer or the host did not start: the machine's, not the candidate's
        return {**where_went, "tool": check, "status": "error", "shapes": 0,
                "message": f"{check} could not start: {failure}; report: {' '.join(text.split())[-300:]}"}
    left = f", {len(todo) - len(done)} left out past its time" if len(done) < len(todo) else ""
    unpadded = ("; allocations unpadded (this compute-sanitizer has no --padding: a read just past a tensor that "
                "fills its allocation lands in the next one, unseen)" if check == "memcheck" and not started.padded
                else "")
    return {**where_went, "tool": check, "status": "ok", "shapes": len(done),
            "message": f"{check} clean on {len(done)} shapes{left} ({secs:.1f} s){unpadded}"}


# --- the judge's side: the checks started beside parity, their answer joined to its result ------------------------
class Sanitizing:
    """compute-sanitizer's `checks` on the candidate (tools/judge/sanitize.py), each in a host of its own, all started
    now and at the same time (memcheck and racecheck: the slower one's seconds, not their sum). result(par): parity's
    result with theirs; stop(): ends what still runs (parity failed: their answer is not needed)."""

    def __init__(self, task, mod, job: dict, checks: tuple[str, ...] = ("memcheck",), started: dict | None = None):
        """`started`: {check: Started} from start_hosts(), used where a check is asked for; the others are ended."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        root, seed = Path(os.environ.get("AGENT_SCRATCH") or os.getcwd()), int(job.get("seed") or 0)
        self.t0, self.job = time.monotonic(), job
        self.halt = threading.Event()
        self.pool = ThreadPoolExecutor(len(checks))
        early = started if started is not None else {}     # taken: emptied here, each host used or ended
        self.futures = [self.pool.submit(memcheck, task, mod, job, root, seed, check, self.halt, early.pop(check, None))
                        for check in checks]
        while early:
            early.popitem()[1].close()

    def result(self, par):
        """Parity's result with the checks' (each waited for): a failure is parity's `invalid_access` (memcheck) or
        `race` (racecheck), memcheck's first; a machine without the sanitizer says so. Their seconds count from parity's
        end (what they added to it)."""
        from tools.results import ParityStatus, SanitizerResult
        ended = time.monotonic()
        results = [SanitizerResult(**f.result()) for f in self.futures]
        took = time.monotonic() - ended
        update = {r.tool: r for r in results}
        for r in results:
            if r.status == "failed":
                status = ParityStatus.invalid_access if r.tool == "memcheck" else ParityStatus.race
                return par.model_copy(update={**update, "status": status, "message": r.message,
                                              "seconds": par.seconds + took})
        return unchecked(par.model_copy(update={**update, "seconds": par.seconds + took}), results,
                         self.job.get("allow_unchecked") or [])

    def stop(self) -> None:
        self.halt.set()
        self.pool.shutdown(wait=True)


def sanitized(task, mod, job: dict, par, checks: tuple[str, ...] = ("memcheck",)):
    """Parity's result with compute-sanitizer's `checks` run now (Sanitizing, started and joined at once)."""
    beside = Sanitizing(task, mod, job, checks)
    try:
        return beside.result(par)
    finally:
        beside.stop()


def unchecked(par, results: list, allowed: list[str]):
    """A check that did not run is not a pass (issue 62): a sanitizer missing ("skipped") or that could not start
    ("error") fails parity `unchecked`, unless the user allowed a keep without it by name (AGENT_ALLOW_UNCHECKED), and
    then its message says so (the record keeps it; the kept commit's trailer names it: agent/optimize/gitops.py)."""
    from tools.results import ParityStatus
    missing = [r for r in results if r.status in ("skipped", "error")]
    for r in missing:
        r.message += (f" (kept without it: {ALLOW_ENV} allows {r.tool})" if r.tool in allowed else "")
    refused = [r for r in missing if r.tool not in allowed]
    if refused:
        names = ",".join(r.tool for r in refused)
        return par.model_copy(update={"status": ParityStatus.unchecked, "message": "; ".join(r.message for r in refused)
                                      + f": a kernel is kept only after {names} ran clean on it ({ALLOW_ENV}={names} "
                                      "keeps it without, and the record and the commit say so)"})
    return par.model_copy(update={"message": "; ".join([par.message, *(r.message for r in results)])})
