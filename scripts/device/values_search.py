"""Issue 66 slice 17: what parity's values draws cost in a fresh judge process, and what the search made ahead saves.
On the lent GPU machine, from the repository root (the project's wheels on PYTHONPATH):

    python3 scripts/device/values_search.py [TASK]      # default kernels/attention_fwd

Part 1: each values:large draw on four shapes, twice, with the seconds of each call of the task's timing_reference
(a fresh process's first call of each kernel loads it). Part 2, in a second fresh process: search_ahead on seed 11,
then `rest` parities (the task's reference standing in for the kernel) on seeds 11, 11 and 12, each values check's
seconds and parts. Part 3, in a third fresh process: the same after the search and warm_checks (parity's checks once
a distribution on the smallest shape, the stand-in as the kernel): what a held child warmed while the model proposes
would save its keep's confirmation, against the first and the third rest parity of part 2."""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.getcwd())
TASK = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "ahead" else \
    "kernels/attention_fwd"


def first_calls() -> None:
    from tools.measure import domains
    from tools.task import load_task, shape_size
    task = load_task(TASK)
    mod, spec, dev = task.module(), task.spec, task.backend.torch_device
    calls, orig = [], getattr(mod, "timing_reference", None) or mod.reference

    def timed(shape, *a):
        task.backend.sync()
        t = time.monotonic()
        r = orig(shape, *a)
        task.backend.sync()
        calls.append(round(time.monotonic() - t, 4))
        return r
    mod.timing_reference = timed
    s0 = dict(min(spec.shapes, key=shape_size))
    mod.reference(s0, *mod.make_inputs(s0, 1, dev, spec.distributions[0]))      # parity's reference, warm by then
    task.backend.sync()
    shapes = [dict(s) for s in sorted(spec.shapes, key=shape_size)[:2]]
    shapes += [dict(s) for s in mod.hidden_shapes(__import__("random").Random(1))][:2]
    for rep in range(2):
        for sh in shapes:
            calls.clear()
            t = time.monotonic()
            domains.draw(spec, mod, sh, 5 + rep, dev, "values:large")
            task.backend.sync()
            print(f"pass {rep} {sh} values:large {time.monotonic() - t:.3f} s; timing_reference calls {calls}")


def ahead(warm: bool = False) -> None:
    from tools.measure.parity import check
    from tools.measure.warmup import search_ahead, stand_in
    from tools.task import load_task
    task = load_task(TASK)
    mod = task.module()
    task.backend.warm_up()
    t = time.monotonic()
    print(search_ahead(task, mod, 11, waiting=lambda: False), f"({time.monotonic() - t:.2f} s)")
    if warm:
        from tools.measure.warmup import warm_checks
        t = time.monotonic()
        print(warm_checks(task, mod, waiting=lambda: False), f"({time.monotonic() - t:.2f} s)")
    for seed in (11, 11, 12):
        t = time.monotonic()
        res = check(task, mod, None, seed=seed, extent="rest", run=stand_in(mod))
        print(f"rest parity on seed {seed}: {res.status.value} in {time.monotonic() - t:.2f} s")
        by_kind = {}
        for c in res.checks:
            k = c.label.split(" ")[0] if "=" not in c.label.split(" ")[0] else "listed"
            n, sec = by_kind.get(k, (0, 0.0))
            by_kind[k] = (n + 1, round(sec + c.seconds, 3))
        print("    by kind (checks, s):", by_kind, "; slowest:",
              [(c.label, c.dist, c.seconds) for c in sorted(res.checks, key=lambda c: -c.seconds)[:4]])
        for c in res.checks:
            if c.label.startswith("values"):
                print("   ", c.label, c.dist, c.seconds, c.parts)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("ahead", "warm"):
        ahead(sys.argv[1] == "warm")
    else:
        first_calls()
        sys.stdout.flush()
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "ahead", TASK], check=False)
        subprocess.run([sys.executable, __file__, "warm", TASK], check=False)
