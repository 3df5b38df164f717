"""`agent check --knobs each|all`: the knob values a task allows, each built and run through the
static launch check and parity, so that a kernel wrong at one allowed value is reported as a task
defect before `agent optimize` spends its iterations finding it out one parity failure at a time
(docs/TASKS.md 3.3: the kernel must build and be right for every value the knob allows).

Two sets: `each` moves one knob at a time through its values, the others at their committed values
(sum of the value counts: cheap, and it finds a value that is wrong on its own); `all` is every
configuration the restrictions allow (the product: what `agent sweep` and an LLM may reach). No
timing: a configuration's speed is `agent sweep`'s question. The machinery is the sweep's (a copy
per configuration, builds `jobs` at a time, parity in batches in throwaway children, the verdict
outside the library's process), so a crash or a hang costs one configuration.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from agent.sweep.build import build_configurations
from agent.sweep.points import SweepPoint
from tools.judge import batch as batch_eval
from tools.backends.device import task_limits
from tools.results import KnobCheck, KnobFailure
from tools.results import KnobWhich as Which
from tools.task import Task

def configurations(task: Task, which: Which) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The committed knob values and the configurations to check besides them, in a stable order."""
    committed = {k: v for k, v in task.read_knobs().items() if v is not None}
    if which == "all":
        space = task.spec.knob_space()
    else:
        space = []
        for k in task.spec.knobs:
            for v in k.values:
                cfg = {**committed, k.name: v}
                if cfg not in space and task.spec.restriction_ok(cfg):
                    space.append(cfg)
    return committed, [c for c in space if c != committed]


def check_knobs(task: Task, which: Which, baseline_lib: Path, build_dir: Path, out_dir: Path,
                say: Callable[[str], None] = lambda _: None, jobs: int | None = None) -> KnobCheck:
    """Build and parity-check every configuration of `which` (see the module doc). `baseline_lib`
    is the committed build's library (the batch child loads one; parity does not use it);
    `build_dir` its build folder, whose objects (the binding, say) the copies reuse. `out_dir` is
    removed at the end: the verdicts are in the result."""
    committed, space = configurations(task, which)
    res = KnobCheck(which=which, committed=committed, configurations=len(space), passed=0)
    if not space:
        return res
    jobs = max(1, jobs or os.cpu_count() or 1)
    failed: list[SweepPoint] = []
    try:
        if out_dir.exists():
            shutil.rmtree(out_dir)
        say(f"knobs: building {len(space)} configurations ({_describe(which)}), {jobs} at a time")
        built = build_configurations(task, space, out_dir, task_limits(task), jobs, failed.append, say, [build_dir])
        say(f"knobs: parity of the {len(built)} that built")
        for settled in batch_eval.evaluate(task, [b.lib for b in built], baseline_lib, parity_only=True,
                                           contexts=[b.launch_context for b in built],
                                           limit_s=task.spec.parity.timeout_s):
            for k, r in settled:
                if r.status.value == "ok":
                    res.passed += 1
                else:
                    failed.append(SweepPoint(knobs=built[k].knobs, index=built[k].index, ok=False,
                                             outcome=r.status.value, reason=" ".join(r.message.split())))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    for p in sorted(failed, key=lambda p: p.index or 0):
        moved = {n: v for n, v in p.knobs.items() if committed.get(n) != v}
        res.failures.append(KnobFailure(knobs=p.knobs, moved=moved, outcome=p.outcome, reason=p.reason))
    return res


def _describe(which: Which) -> str:
    return ("each allowed value, one knob at a time" if which == "each"
            else "every configuration the restrictions allow")


def summary_line(res: KnobCheck) -> str:
    if not res.configurations:
        return f"no configurations besides the committed one ({_describe(res.which)})"
    head = f"{res.configurations} configurations besides the committed one ({_describe(res.which)})"
    if not res.failures:
        return f"{head}: every one builds and passes parity"
    return (f"{head}: {len(res.failures)} fail, a task defect: make the kernel right at these values, or drop them "
            "from the knob's values (or add a restriction) in task.toml")
