"""Where a kept candidate's parity spends its time (issue 66: attention's before-a-keep parity was 10.4-11.7 s of a
kept iteration on an H200), on the GPU box:

    python scripts/device/parity_costs.py [TASK] [EXTENT] [KNOB=V ...] [--beside[=memcheck|racecheck]] [--ncu]
                                          [--seed=N]                     # default attention_fwd rest, seed 7

Builds the task's kernel with its tensor-core knobs where it has them (the candidate kept_walls.sh keeps) and runs
the judge's parity (`tools.judge.judge.main`, the child the loop runs, its host forked as there) at EXTENT (rest:
what a candidate about to be kept pays) with each part of a check timed: the draws, the reference and
timing_reference, the candidate's calls through the host, the comparisons, the changed-repeat call, the wide shape.
Each timer waits for the GPU before and after (cuda.synchronize), so a part's seconds are its own, exclusive of the
parts it calls. Prints, and writes to $OUT/parity_costs.txt, the seconds by kind of check (listed, hidden, range,
values, misaligned, wide) and part, and the ten slowest checks part by part. KNOB=V: the candidate's knobs instead
(attention_fwd SMEM_PAD=2: kept_walls.sh's kept move). --beside: as a confirmation's child runs it (`judge evaluate`,
its sanitizer hosts started early, the job 12 s later), memcheck and racecheck beside parity, their seconds printed;
--beside=memcheck or =racecheck: that one alone beside it (issue 66 slice 13: racecheck is the contention). --ncu: a
held Nsight Compute pass (tools/profile/warm.py) makes its CUDA context as the job comes, as a keep's does. --seed=N:
parity's seed (the hidden shapes, the draws) instead of 7. Each run's HOME is the caller's: the CUDA driver's JIT cache
under it is warm after the first run (HOME=$(mktemp -d) for a cold one, as every judge child of the loop had
before the shared cache, tools/backends/jitcache.py; AGENT_JIT_CACHE=0 turns it off).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent.sweep.build import write_knobs   # noqa: E402
from tools.build.build import build   # noqa: E402
from tools.task import load_task   # noqa: E402

KNOBS = {"attention_fwd": {"SMEM_PAD": 8, "USE_TENSOR_CORES": 1}, "softmax": {"VEC": 4}}
state = {"label": "(outside a check)", "stack": []}
costs: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def timed(part: str, fn, label_from=None):
    """fn, its seconds (the GPU waited for before and after) booked to `part` of the current check, exclusive of the
    timed parts it calls. Only parity's own thread is timed: with --beside the sanitizers' threads call the same
    functions (the task's make_inputs, the host's run) and pass through untimed. A check's label is put back after
    it (the bench after parity is booked outside a check)."""
    import threading

    import torch

    @functools.wraps(fn)
    def wrapper(*a, **k):
        if threading.current_thread() is not threading.main_thread():
            return fn(*a, **k)
        outer = state["label"]
        if label_from is not None:
            state["label"] = label_from(a, k)
        torch.cuda.synchronize()
        state["stack"].append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            inner = state["stack"].pop()
            costs[state["label"]][part] += dt - inner
            if state["stack"]:
                state["stack"][-1] += dt
            if label_from is not None:
                state["label"] = outer
    return wrapper


def patch() -> None:
    import tools.judge.hostclient as hc
    import tools.judge.wide as wide
    import tools.measure.buffers as buffers
    import tools.measure.parity as parity
    import tools.task as task_mod

    def label(a, k):
        return f"{a[4]} {a[5]} seed {a[6]}"
    parity.one_check = timed("check (own)", parity.one_check, label)
    parity.draw = timed("draw", parity.draw)
    buffers.draw = timed("draw", buffers.draw)
    for name in ("compare", "disagree", "all_bits_equal"):
        setattr(parity, name, timed("compare", getattr(parity, name)))
    parity.changed_repeat = timed("changed_repeat (own)", parity.changed_repeat)
    parity.error_budget = timed("error_budget (own)", parity.error_budget)
    hc.Remote.run = timed("candidate call", hc.Remote.run)
    hc.Remote.run_kept = timed("candidate call", hc.Remote.run_kept)
    for name in ("adopt", "out", "fill_state", "change_inputs"):
        setattr(buffers.Buffers, name, timed("buffers", getattr(buffers.Buffers, name)))
    wide.check_wide = timed("wide (own)", wide.check_wide, lambda a, k: "wide")
    loader = task_mod.load_module

    def load_module(path, name):
        mod = loader(path, name)
        for fn in ("reference", "timing_reference", "make_inputs"):
            if hasattr(mod, fn):
                setattr(mod, fn, timed(fn, getattr(mod, fn)))
        return mod
    task_mod.load_module = load_module


class LateJob:
    """The judge's stdin: the job, given `wait` seconds after the judge asks for it (a confirmation's child is started
    long before its job: its sanitizer hosts have started by then)."""

    def __init__(self, job: dict, wait: float, held=None):
        self.line, self.wait, self.held = json.dumps(job) + "\n", wait, held

    def readline(self) -> str:
        time.sleep(self.wait)
        if self.held is not None:      # a keep tells its held pass to make its context as the confirmation begins
            self.held.prepare()
        return self.line


def built(name: str, knobs: dict, work: Path):
    """kernels/NAME copied under `work` with `knobs` written (the sweep's own writer) and built: (its folder, the
    BuildResult); a failed build ends the script. racecheck_calls.py builds its candidate the same way."""
    d = work / name
    shutil.copytree(REPO / "kernels" / name, d, ignore=shutil.ignore_patterns("__pycache__"))
    task = load_task(d)
    write_knobs(d, task, {**task.read_knobs(), **knobs})
    b = build(load_task(d), work / "build")
    if b.status.value != "ok":
        raise SystemExit(f"build {b.status.value}: {b.message[:300]}")
    return d, b


def main() -> int:
    args = [a for a in sys.argv[1:] if "=" not in a and not a.startswith("--")]
    name = args[0] if args else "attention_fwd"
    extent = args[1] if len(args) > 1 else "rest"
    flags = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[1:] if a.startswith("--"))
    beside, seed = "--beside" in flags, int(flags.get("--seed") or 7)
    only = {"memcheck": "memcheck", "racecheck": "racecheck", "": None}[flags.get("--beside", "")]
    KNOBS.update({name: {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:] if "=" in a
                                                  and not a.startswith("--"))} or KNOBS.get(name, {})})
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="parity-costs-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="parity-costs-"))
    d, b = built(name, KNOBS.get(name, {}), work)
    task = load_task(d)
    patch()
    from tools.judge import judge
    held = None
    if only == "memcheck":      # the judge asks racecheck only where the kernel uses shared memory
        judge.uses_shared_memory = lambda ctx, plan: False
    elif only == "racecheck":
        import tools.judge.sanitize as sanitize
        full = sanitize.Sanitizing

        class RaceOnly(full):
            def __init__(self, task, mod, job, checks=("memcheck",), started=None):
                super().__init__(task, mod, job, ("racecheck",), started)
        sanitize.Sanitizing = RaceOnly
    if "--ncu" in flags:
        from tools.profile.warm import start_pass
        held = start_pass(task, 1)
    res_file = work / "result.json"
    os.environ["AGENT_SCRATCH"] = str(work)
    saved = os.dup(1)
    fd = os.open(res_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    t0 = time.perf_counter()
    try:
        if beside:   # the confirmation child's job: parity with memcheck and racecheck beside it, then the bench
            sys.stdin = LateJob({"lib": str(b.lib_path), "baseline_lib": str(b.lib_path), "memcheck": True,
                                 "no_reference": True, "parity_extent": extent, "seed": seed}, 12.0, held)
            judge.main(["evaluate", "--task", str(d), "--job-stdin", "--sanitize-early"])
        else:
            if held is not None:
                held.prepare()
            judge.main(["parity", "--task", str(d), "--lib", str(b.lib_path), "--extent", extent, "--seed", str(seed)])
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        if held is not None:
            held.close()
    wall = time.perf_counter() - t0
    text = res_file.read_text().strip().splitlines()
    res = json.loads(text[-1]) if text else {}
    par = res.get("parity") or res if isinstance(res, dict) else {}
    what = f" ({only or 'memcheck and racecheck'} beside)" * beside + " (a held ncu pass's context beside)" * ("--ncu" in flags)
    lines = [f"{name} {KNOBS.get(name)} parity --extent {extent} --seed {seed}{what}: {par.get('status')} "
             f"in {par.get('seconds') or 0:.2f} s, its checks {sum(c.get('seconds') or 0 for c in par.get('checks') or []):.2f} s "
             f"(wall {wall:.2f} s): {(par.get('message') or '')[-200:]}"]
    for tool in ("memcheck", "racecheck"):
        if par.get(tool):
            t = par[tool]
            lines.append(f"{tool}: {t.get('status')} {t.get('seconds') or 0:.2f} s, {t.get('shapes')} shapes, steps "
                         f"{t.get('steps')}, slowest {t.get('slowest_shape')}")
    kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    n = collections.Counter()
    for lab, c in costs.items():
        kind = lab.split(" ")[0] if lab.split(" ")[0] in ("range", "values", "misaligned", "hidden", "wide") \
            else "(outside a check)" if lab.startswith("(") else "listed"
        kinds[kind].update(c)
        n[kind] += 1
    for kind, c in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"{kind}: {n[kind]} checks, {sum(c.values()):.2f} s: " +
                     ", ".join(f"{p} {s:.2f}" for p, s in c.most_common()))
    lines.append("the ten slowest checks:")
    for lab, c in sorted(costs.items(), key=lambda kv: -sum(kv[1].values()))[:10]:
        lines.append(f"  {lab}: {sum(c.values()):.3f} s: " + ", ".join(f"{p} {s:.3f}" for p, s in c.most_common()))
    (out / "parity_costs.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
