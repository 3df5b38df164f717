"""A candidate about to be kept (decide()'s "confirm"): its real launch geometry, then its confirmation (issue 66).

The confirmation's child, and on a GPU its compute-sanitizer hosts with it (tools/judge/sanitize.py start_hosts), is
the one the loop's Evaluator started before this keep began (agent/evaluation/spares.py), else one started first: its
start-up, a torch and a CUDA context each under the tool (two thirds of each check's seconds on an H200:
BENCHMARKS.md), then runs during the launch check's Nsight Compute pass. They run no kernel until the job comes, so the
pass's counters are the candidate's alone. A launch rejected ends the iteration before any of them does work. As it
ends, the next keep's pass and child are started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from agent.evaluation.attempt import Attempt
from agent.evaluation.evaluate import Evaluator


def launch_and_confirm(ev: Evaluator, lib: Path, baseline: Path | None, a: Attempt, reparity: bool, save,
                       profile: tuple[Path, int], stage: Callable[[str], None]) -> None:
    """The launch check (Evaluator.verify_launch: a.launch, LaunchRejected where it fails; on a GPU with ncu its pass
    is also the profile a keep records), then Evaluator.confirm in the child started before it. `stage(name)` is
    called as each begins (the loop's progress)."""
    warm = ev.prestart(confirmation=True)
    try:
        stage("launch")
        a.launch = ev.verify_launch(lib, a.launch, a.times, profile=profile)
        stage("confirm")
        ev.confirm(lib, baseline, a, reparity, save, warm)
    finally:
        if warm is not None:
            warm.close()
        ev.spare.ensure(ev)     # the next keep's pass and child, their start-up while the next candidate is proposed
