"""The bench's timed rounds (tools/measure/bench.py): the arms timed interleaved, on data new to each round,
and what the rounds themselves show about the candidate.

- **Fresh data per round.** Before each round the input sets are filled again with new values (the
  task's make_inputs, a new seed per set), in the same buffers, outside the timing; every arm of the
  round times the same values. So no timed call can repeat a call made before its round: a memo on
  the inputs (exact or sampled, whatever else it watches, however long it waits) can only serve calls
  that repeat one made earlier in the same burst. Before issue 39 the sets were made once per bench,
  and every timed rep after the warm-up repeated one before it: an exact memo that turned honest at
  the first buffers it had never seen (the probes') was timed lazy and checked honest.
- **The repeats within a round.** A burst of n reps over k sets (two at least) makes its first k calls on
  values new to it and the rest on repeats. The burst's very first call is also its cold one (the code,
  caches and branch state after the refill and the host's work between bursts), so the other first
  calls are the measure, less REPEAT_SLACK_MS for what is left of the warm-up after a refill (an honest
  2.2 us kernel's second call took 3.1 us, and the third 2.4 us). Where the repeats' median is over
  REPEAT_RATIO times faster than that, in the median round, the candidate did less work on a call it
  had seen before, and the bench is `suspicious`. Medians: a laziness that does not move the repeats'
  median does not move the reported one either. Both sides come from the same bursts, so load that
  comes and goes hits both. Honest kernels on the CPU task: BENCHMARKS.md.
- **Spot checks** (SpotCheck): the library arms' output buffers are poisoned before each of their
  bursts, and after the candidate's burst of a round the judge draws (about two rounds in all, at least
  one) whether to fetch them and compare each with the reference on that round's values.
"""

from __future__ import annotations

import statistics

from tools.measure.probes import wrong
from tools.measure.stats import speedup_ci
from tools.backends.clocks import estimate_and_warm, reps
from tools.results import SpeedupCI
from tools.task_messages import make_inputs

REPEAT_RATIO = 1.5      # a round's repeats this much faster than its first calls (median round): suspicious
REPEAT_SLACK_MS = 0.005  # taken off the first calls: the warm-up left after a refill (a few us on a CPU)


class SpotCheck:
    """The rounds' data and checks (see the module's docstring). `round(r)` fills the sets with new values
    before round r; `before(label)` poisons the library arms' output buffers before each of their bursts;
    `after(label, r, offset, ts)` decides, after the candidate's burst of round r, whether to fetch and
    compare them, and keeps the burst's times for `repeats_why()`. The first wrong output is kept in `why`
    (the bench is `suspicious` with it; the timing goes on, so that its figures are still reported, and
    nothing more is checked)."""

    def __init__(self, task, mod, runs, shape, sets, outs, rounds: int, rng):
        self.task, self.mod, self.runs, self.shape, self.sets, self.outs = task, mod, runs, shape, sets, outs
        self.rounds, self.rng = rounds, rng
        self.p = min(1.0, 2.0 / max(rounds, 1))
        self.checked = 0
        self.expected: dict[int, object] = {}
        self.why: str | None = None
        self.bursts: list[tuple[list[float], list[float]]] = []   # (first calls, repeats) of each candidate burst

    def round(self, r: int) -> None:
        """New values in every timed set, in place (the same buffers), here and where the runs are."""
        dist, device = self.task.spec.distributions[0], self.task.backend.torch_device
        seeds = [self.rng.getrandbits(31) for _ in self.sets]
        for s, seed in zip(self.sets, seeds):
            for x, y in zip(s, make_inputs(self.mod, self.shape, seed, device, dist)):
                x.copy_(y)
        self.runs.mirror(self.sets, seeds, dist)
        self.expected.clear()

    def before(self, label: str) -> None:
        if label != "reference":
            self.runs.poison_outs(self.outs)

    def after(self, label: str, r: int, offset: int, ts: list[float]) -> None:
        if label != "candidate":
            return
        k = len(self.sets)
        self.bursts.append((ts[1:k], ts[k:]))   # the first call of the burst is the cold one: not held against it
        if self.why is not None:
            return
        last = r == self.rounds - 1
        if not (self.rng.random() < self.p or (last and self.checked == 0)):
            return
        self.checked += 1
        self.runs.fetch_outs(self.outs)
        for j in sorted({(offset + i) % k for i in range(min(len(ts), k))}):
            if j not in self.expected:
                self.expected[j] = self.mod.reference(self.shape, *self.sets[j])
            why = wrong(self.task, self.shape, self.outs[j], self.expected[j], self.task.spec.distributions[0])
            if why is not None:
                self.why = (f"timed round {r + 1} of {self.rounds} (checked after it ran, drawn at random): the "
                            f"candidate's output on timed input set {j + 1} of {k} was wrong {why}")
                return

    def repeats_why(self, label: str) -> str | None:
        """Why the candidate's repeats within its bursts were too fast for its first calls, or None."""
        pairs = [(statistics.median(first), statistics.median(rest)) for first, rest in self.bursts if first and rest]
        if len(pairs) < 2:
            return None
        ratio = statistics.median(max(f - REPEAT_SLACK_MS, 0.0) / max(r, 1e-9) for f, r in pairs)
        if ratio <= REPEAT_RATIO:
            return None
        first = statistics.median(f for f, _ in pairs)
        rest = statistics.median(r for _, r in pairs)
        return (f"{label}: in the timed rounds, the first call on each input set (new values every round) took "
                f"{first * 1e3:.3g} us, a call repeating one of them {rest * 1e3:.3g} us ({ratio:.1f}x in "
                f"the median of {len(pairs)} rounds, {REPEAT_SLACK_MS * 1e3:g} us of warm-up taken off the first): the timed calls did less work because they repeated earlier calls")


def interleaved(clock, arms, b, spot: SpotCheck | None = None) -> tuple[dict[str, list[float]], dict[str, SpeedupCI]]:
    """Time each arm (label, fn) in `b.rounds` rounds, each timing every arm with the same rep count in an
    order rotated round by round, so that load which comes and goes falls on all of them alike (one arm
    alone: its reps spread over the rounds). Returns every arm's times and, per arm after the first, the
    speedup of the first over it (median of the per-round ratios, 95% CI). With `spot`, each round's data
    is new (spot.round) and its bursts are checked (spot.before, spot.after)."""
    ests = [estimate_and_warm(clock, fn, b.warmup_ms) for _, fn in arms]
    n = reps(max(ests), b.rep_ms)
    if len(arms) == 1:
        n = max(1, n // b.rounds)
    got: dict[str, list[float]] = {label: [] for label, _ in arms}
    ratios: dict[str, list[float]] = {label: [] for label, _ in arms[1:]}
    for r in range(b.rounds):
        if spot is not None:
            spot.round(r)
        k = r % len(arms)
        meds = {}
        for label, fn in arms[k:] + arms[:k]:
            if spot is not None:
                spot.before(label)
            ts = clock.run(fn, n, offset=r * n)
            if spot is not None:
                spot.after(label, r, r * n, ts)
            got[label] += ts
            meds[label] = statistics.median(ts)
        first = meds[arms[0][0]]
        for label in ratios:
            ratios[label].append(meds[label] / max(first, 1e-9))
    return got, {label: speedup_ci(rs) for label, rs in ratios.items()}
