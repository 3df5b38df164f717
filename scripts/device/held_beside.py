"""What the processes the loop holds between keeps cost the work beside them, and what a fresh judge's first bench
pays for its probes (issue 66). From the repository root, LIB as for scripts/device/first_use.py:

    python3 scripts/device/held_beside.py kernels/TASK LIB   # PARTS=B: (B) alone; PREPARE=1: below; SETTLE=S: the
                                                             # seconds a held process starts up before (15)

(A) a fixed GPU workload in this process (the task's reference on its main shape, timed with CUDA events, and the SM
clock nvidia-smi reports while it runs): alone; beside a held Nsight Compute pass waiting for its library
(tools/profile/warm.py start_pass, the loop's tier 1: its program waits with torch imported and no CUDA
context; PREPARE=1 has it make its context, as a keep does and as every held pass did before issue 66 slice 9);
beside compute-sanitizer's memcheck and racecheck hosts
waiting for their candidate (tools/judge/sanitize.py start_hosts); beside a judge child waiting for its job as the
held confirmation child does (--job-stdin --sanitize-early); alone again.
(B) the bench of LIB against itself as the baseline (tools/judge/judge.py bench, through a real host), twice in one
host: alone, beside a held ncu pass, beside held sanitizer hosts, alone again. Each probe's seconds, and where the
whole bench's went (the two-thread calls in the host, the inputs made, the reference, the comparisons).
"""
import os, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa
from tools.judge.hostclient import HostClient, Remote
from tools.judge.judge import bench
from tools.judge.sanitize import start_hosts
from tools.profile.warm import start_pass
from tools.task import load_task
from tools.task_messages import make_inputs

task = load_task(sys.argv[1]); mod = task.module(); task.backend.warm_up(); lib = str(Path(sys.argv[2]).resolve())
root = Path(tempfile.mkdtemp(prefix="held-"))
shape = dict(task.spec.main)
x = make_inputs(mod, shape, 1, task.backend.torch_device, task.spec.distributions[0])


def clock() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,clocks_throttle_reasons.active",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()


def held_pass():
    """The loop's held pass, its context made where PREPARE=1."""
    held = start_pass(task, 1)
    if held is not None and os.environ.get("PREPARE") == "1":
        held.prepare()
    return held


def workload(label: str) -> None:
    for _ in range(3):
        mod.reference(shape, *x)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(5):
        a.record()
        for _ in range(40):
            mod.reference(shape, *x)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / 40)
    during = clock()
    print(f"A {label:<34} reference {min(ms):.4f} / median {sorted(ms)[2]:.4f} ms a call; clocks {during}", flush=True)


SETTLE = float(os.environ.get("SETTLE", "15"))


class HeldJudge:
    """A judge child waiting for its job as the held confirmation child does (--job-stdin --sanitize-early)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.judge.judge", "evaluate", "--task", str(task.root),
                                      "--job-stdin", "--sanitize-early"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


HELD = {"beside a held ncu pass": lambda: [h for h in [held_pass()] if h is not None],
        "beside memcheck+racecheck hosts": lambda: list(start_hosts(task.root, root).values()),
        "beside a held confirmation child": lambda: [HeldJudge()]}


def beside_each(measure, labels) -> None:
    """`measure(label)` alone, beside each held process of `labels` (started SETTLE s before), and alone again."""
    measure("alone")
    for label in labels:
        held = HELD[label]()
        time.sleep(SETTLE)
        measure(label)
        for h in held:
            h.close()
        time.sleep(2)
    measure("alone again")


if "A" in os.environ.get("PARTS", "AB"):
    beside_each(workload, list(HELD))

import tools.measure.probes as probes_mod  # noqa: E402
from tools.judge.hostruns import HostRuns  # noqa: E402
split: dict[str, float] = {}


def timed(owner, name: str, key: str) -> None:
    """`owner.name` wrapped so that its seconds add up in split[key] (where the reentrant probe's seconds go)."""
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            split[key] = split.get(key, 0.0) + time.monotonic() - t0
    setattr(owner, name, wrapper)


timed(HostRuns, "together", "two threads in the host")
timed(probes_mod, "make_inputs", "inputs")
timed(probes_mod, "wrong", "compare")
timed(mod, "reference", "reference")


def benches(label: str, n: int = 2) -> None:
    host = HostClient(task.root, root)
    try:
        host.ask({"op": "load", "id": "candidate", "path": lib})
        host.ask({"op": "load", "id": "baseline", "path": lib})
        remote = Remote(host)
        for k in range(n):
            t0 = time.monotonic()
            split.clear()
            r = bench(task, mod, remote, {"baseline_lib": lib}, [shape])[0]
            print(f"B {label:<34} bench {k + 1}: {time.monotonic() - t0:.2f} s, {r['status']}, probes",
                  {p: round(v, 3) for p, v in (r.get("probe_seconds") or {}).items()},
                  "| the whole bench's seconds in:", {p: round(v, 3) for p, v in split.items()}, flush=True)
    finally:
        host.close()


beside_each(benches, ["beside a held ncu pass", "beside memcheck+racecheck hosts"])
