"""A candidate about to be kept (decide()'s "confirm"): its confirmation, then its real launch geometry (issue 66).

The confirmation's child, and on a GPU its compute-sanitizer hosts with it (tools/judge/sanitize.py start_hosts), is
the one the loop's Evaluator started before this keep began (agent/evaluation/spares.py), else one started first.
The launch check's Nsight Compute pass is the one the Evaluator holds, its program waiting with torch imported: told
as the keep begins, it makes its CUDA context beside the confirmation (0.8-1.4 s under ncu on an H200), and the pass
runs after the confirmation, when nothing else is on the card (its counters are the candidate's alone). A launch
rejected after a confirmation that passed ends the iteration as before: a kernel whose real launch is wrong has then
paid for its confirmation (a launch the static check passed and ncu refuses is rare). As the keep ends, the next
keep's pass and child are started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from agent.evaluation.attempt import Attempt
from agent.evaluation.evaluate import Evaluator


def launch_and_confirm(ev: Evaluator, lib: Path, baseline: Path | None, a: Attempt, reparity: bool, save,
                       profile: tuple[Path, int], stage: Callable[[str], None],
                       worth: Callable[[Attempt], bool] | None = None) -> bool:
    """Evaluator.confirm in the child held for it, then the launch check (Evaluator.verify_launch: a.launch,
    LaunchRejected where it fails; on a GPU with ncu its pass is also the profile a keep records), only where the
    confirmation came out whole (no a.confirm_error) and `worth(a)` (the loop's: decide() does not reject it on the
    confirmation's figure; a candidate that will not be kept is not profiled for a keep, and ends as not faster, not as
    a launch rejected). Whether the launch was checked. `stage(name)` is called as each begins (the loop's progress)."""
    warm = None
    try:
        ev.spare.prepare_pass()
        warm = ev.prestart(confirmation=True)
        stage("confirm")
        ev.confirm(lib, baseline, a, reparity, save, warm)
        if a.confirm_error is None and (worth is None or worth(a)):
            stage("launch")
            a.launch = ev.verify_launch(lib, a.launch, a.times, profile=profile)
            return True
        return False
    finally:
        if warm is not None:
            warm.close()
        ev.spare.drop_pass()    # one prepared and not used (the confirmation failed or refused it): its context made
        ev.spare.ensure(ev)     # the next keep's pass and child, their start-up while the next candidate is proposed
