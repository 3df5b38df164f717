"""When a bench's figure against the reference is one (tools/measure/bench.py's last word on it).

The reference is torch, and torch on a CPU is the arm a busy machine hurts most: its intra-op
threads wait for each other, and one thread descheduled by another process holds up the rest. Two
rules, each refusing a figure rather than printing a wrong one (the kernel's own timings and its
figure against the baseline stand):

- **Rounds that disagree.** A figure whose rounds' ratios span more than REF_SPREAD (the interval's
  ends) is timed once more; if it spans that again, no figure. A newcomer's run printed
  0.087x [0.085, 8.565] (torch's threads stalling on some rounds of a loaded 2-core machine).
- **Threads that wait.** With torch on more than one CPU thread, the reference is also timed for one
  round's reps on a single thread; where its threads are more than STALL times slower than one, they
  wait on cores something else holds (or the size is slower threaded: not a bar either), and no
  figure (1.5: a figure kept is then within 2x of the idle machine's, tests/test_bench.py). Stalls
  on every round are stable: a 96x160x72 matmul on 2 threads beside one busy process printed
  38.7x [35.6, 39] against the reference, every round alike, 370 times off; on one thread, 0.061x,
  as on an idle machine.
"""

from __future__ import annotations

import os
import statistics

from tools.measure.stats import REF_SPREAD, ci_text, spread

STALL = 1.5


def settle(runs, arms, b, spot, again, got: dict, cis: dict, clock_why: str | None, gpu: bool
           ) -> tuple[dict, dict, str, str]:
    """The bench's times and intervals after the rules above (`again()` times the whole bench once
    more: tools.measure.bench._again), the text that says why there is no figure ("" where there is one) and
    the one that says it was timed twice."""
    if "reference" not in cis or clock_why is not None or spot.why is not None:
        return got, cis, "", ""
    retimed = ""
    if spread(cis["reference"]) > REF_SPREAD:
        first = cis["reference"]
        got2, cis2, clocks2 = again()
        if clocks2 is not None or spot.why is not None or spread(cis2.get("reference")) > REF_SPREAD:
            return got, cis, retimed, (f", vs reference unstable: its rounds' ratios spanned {ci_text(first)} and "
                              f"{ci_text(cis2.get('reference'))} in two benches (more than {REF_SPREAD:g}x apart): "
                              "no figure")
        got, cis = got2, cis2
        retimed = f"; timed twice, the first bench's figure against the reference was unstable ({ci_text(first)})"
    why = None if gpu else _threads_wait(runs, dict(arms)["reference"], got["reference"], b.rounds)
    return got, cis, retimed, (f", vs reference unstable: {why}: no figure" if why else "")


def _threads_wait(runs, ref_arm, ref_times: list[float], rounds: int) -> str | None:
    threads = runs.threads()
    if not threads or threads <= 1:
        return None
    one = runs.one_thread(ref_arm, max(3, len(ref_times) // max(rounds, 1)))
    many, single = statistics.median(ref_times), statistics.median(one)
    if many <= STALL * single:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    where = (f"more threads than the {cores} cores here" if threads > cores
             else "cores something else holds (a busy machine), or this size is slower threaded")
    return (f"torch took {many:.3g} ms a call on {threads} CPU threads and {single:.3g} ms on one: its threads "
            f"wait on {where} (cpu_threads in task.toml)")


