"""The bench's timed rounds (tools/measure/bench.py): the arms timed interleaved, every timed call on values it
has never seen, and the rounds' outputs checked at random.

- **New values per round.** Before each round the input sets are filled again with new values (the task's
  make_inputs, a new seed per set), in the same buffers, outside the timing.
- **New values per rep.** Before each timed rep of every arm (the reference's too, so that each arm's
  bursts carry the same untimed work for the judge's outside clock), outside the rep's timing, one value
  of each floating-point input of the rep's set is overwritten with another of its values (Refresh; which,
  from the burst's seed and the rep's index, so the judge replays them exactly; the values stay the
  task's distribution). No timed call repeats an earlier one: a memo on the inputs, exact or sampled,
  whatever else it watches, however long it waits, has nothing to serve. An exact memo (right on every
  call) is then timed at its honest speed; a sampled one serves stale values, which the spot check sees.
  Before issue 39 the sets were made once per bench, and every timed rep after the warm-up repeated one
  before it: an exact memo that turned honest at the first buffers it had never seen (the probes') was
  timed lazy (32x over the initial kernel against its honest 10x) and checked honest. Not a swap of two
  values: a memo keyed on a sum or an xor of the inputs does not see a permutation. Cost: one element
  copy per tensor per rep (numpy on the CPU, an index copy on the GPU).
- **Spot checks** (SpotCheck): the library arms' output buffers are poisoned before each of their
  bursts, and after the candidate's burst of a round the judge draws (about two rounds in all, at least
  one) whether to fetch them and compare each with the reference on the values the call saw.
"""

from __future__ import annotations

import statistics
import time

from tools.measure.probes import wrong
from tools.measure.stats import speedup_ci
from tools.backends.clocks import estimate_and_warm, reps
from tools.results import SpeedupCI
from tools.task_messages import make_inputs

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: the copy's positions from (seed, rep, tensor), the same in the judge and host."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def refresh_positions(seed: int, i: int, j: int, numel: int) -> tuple[int, int]:
    """Two different positions (numel > 1) for rep i's copy in its set's j-th input (b's value over a's)."""
    h = _mix(seed * 1_000_003 + i * 131 + j)
    a = h % numel
    return a, (a + 1 + _mix(h) % (numel - 1)) % numel


def _refreshable(t) -> bool:
    return hasattr(t, "is_floating_point") and t.is_floating_point() and t.is_contiguous() and t.numel() > 1


class Refresh:
    """`before(i)` of an arm's timed burst (tools.backends.clocks): in rep i's set, sets[i % k], one value of
    each floating input is overwritten with another of its values, in place, outside the rep's timing. Not
    a swap: a permutation leaves a sum or an xor of the values unchanged, and a memo keyed on one (an
    "exact" memo of memo_exact_window.cpp's kind, 2026-11-27 on .ci/run) served stale answers."""

    def __init__(self, seed: int, sets: list):
        self.seed, self.sets = seed, sets
        self.views = [[_flat(t) if _refreshable(t) else None for t in s] for s in sets]

    def __call__(self, i: int) -> None:
        for j, v in enumerate(self.views[i % len(self.views)]):
            if v is not None:
                a, b = refresh_positions(self.seed, i, j, len(v))
                v[a] = v[b]


def _flat(t):
    """A one-dimensional view to copy a value in: numpy's on the CPU (a microsecond), the tensor's own
    on a GPU (an index_put)."""
    if t.device.type == "cpu" and str(t.dtype) in ("torch.float32", "torch.float64", "torch.float16"):
        return t.view(-1).numpy()
    return _TorchView(t.view(-1))


class _TorchView:
    def __init__(self, v):
        self.v = v

    def __len__(self) -> int:
        return self.v.numel()

    def __getitem__(self, a: int):
        return self.v[a].clone()

    def __setitem__(self, a: int, x) -> None:
        self.v[a] = x


def replay(sets: list, seed: int, offset: int, n: int) -> None:
    """What Refresh(seed, ...) did over reps offset..offset+n-1, done to these sets at once (the judge's copy
    of the host's): the copies composed into one gather per tensor (each position to the original position
    its value came from)."""
    k = len(sets)
    for s_idx, s in enumerate(sets):
        for j, t in enumerate(s):
            if not _refreshable(t):
                continue
            perm: dict[int, int] = {}
            for i in range(offset, offset + n):
                if i % k == s_idx:
                    a, b = refresh_positions(seed, i, j, t.numel())
                    perm[a] = perm.get(b, b)
            if perm:
                import torch
                v = t.view(-1)
                dst = torch.tensor(list(perm), device=t.device)
                v[dst] = v[torch.tensor(list(perm.values()), device=t.device)].clone()


class SpotCheck:
    """The rounds' data and checks (see the module's docstring). `round(r)` fills the sets with new values
    before round r; `before(label)` poisons the library arms' output buffers before each of their bursts;
    `refresh(label, r)` is an arm's per-rep Refresh for round r; `after(label, r, offset, ts)`, after a
    burst, brings the runs' values here (HostRuns replays the copies) and, after the candidate's, decides
    whether to fetch and compare its outputs. The first wrong output is kept in `why` (the bench is
    `suspicious` with it; the timing goes on, so that its figures are still reported, and nothing more
    is checked)."""

    def __init__(self, task, mod, runs, shape, sets, outs, rounds: int, rng):
        self.task, self.mod, self.runs, self.shape, self.sets, self.outs = task, mod, runs, shape, sets, outs
        self.rounds, self.rng = rounds, rng
        self.p = min(1.0, 2.0 / max(rounds, 1))
        self.checked = 0
        self.look: int | None = None    # the round after which the timing may stop (interleaved): checked by then
        self.expected: dict[int, object] = {}
        self.why: str | None = None
        self.seeds: dict[tuple[str, int], int] = {}

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

    def refresh(self, label: str, r: int) -> Refresh:
        """Every arm's reps are preceded by a refresh, the reference's too: the judge's outside clock holds each
        arm's unreported time to the others' (tools.measure.stats.outside_check), so all pay the same."""
        seed = self.seeds[(label, r)] = self.rng.getrandbits(31)
        return Refresh(seed, self.sets)

    def after(self, label: str, r: int, offset: int, ts: list[float]) -> None:
        self.runs.refreshed(self.sets, self.seeds[(label, r)], offset, len(ts))
        self.expected.clear()
        if label != "candidate" or self.why is not None:
            return
        last = r == self.rounds - 1 or (self.look is not None and r + 1 == self.look)
        if not (self.rng.random() < self.p or (last and self.checked == 0)):
            return
        self.checked += 1
        self.runs.fetch_outs(self.outs)
        k = len(self.sets)
        for j in sorted({(offset + i) % k for i in range(min(len(ts), k))}):
            if j not in self.expected:
                self.expected[j] = self.mod.reference(self.shape, *self.sets[j])
            why = wrong(self.task, self.shape, self.outs[j], self.expected[j], self.task.spec.distributions[0])
            if why is not None:
                self.why = (f"timed round {r + 1} of {self.rounds} (checked after it ran, drawn at random): the "
                            f"candidate's output on timed input set {j + 1} of {k} was wrong {why}")
                return


class EarlyStop:
    """interleaved()'s `stop` for the loop's candidate (given its minimum gain): after half the rounds, a candidate
    whose interval over its baseline lies wholly below 1 + gain is timed no further. With 5 rounds the interval is
    their whole range (tools/measure/stats.py), so every round so far found it short of the gain: a candidate whose
    true median is at the gain does that 1 time in 32, and the full bench would refuse it by its median 1 time in
    2. The keep rule's own verdict (never_kept) is unchanged: the stop is taken only where it would say so.

    The other way too (issue 66): an interval wholly above 1 + gain (every round so far found the gain) is timed no
    further. This bench only sends a candidate on; its keep is the confirmation's, a bench of its own in a fresh child
    (agent/evaluation/keep.py), sized to the noise this one measured (agent/evaluation/attempt.py confirm_rounds: from
    its 5 rounds, 6 at least). A candidate whose true median is at the gain is sent on so 1 time in 32, where the full
    bench would have sent it 1 time in 2; a clear gain saves the second half of its rounds (0.8 s of attention_fwd's
    kept iteration on an H200). The probes that follow the rounds run as they did."""

    def __init__(self, keep_gain: float, rounds: int):
        self.keep_gain, self.rounds, self.why = keep_gain, rounds, ""

    def __call__(self, cis: dict) -> bool:
        ci = cis.get("baseline")
        if ci is None:
            return False
        if ci.high < 1.0 + self.keep_gain:
            self.why = (f"; timed {ci.rounds} of {self.rounds} rounds: every interval so far below the "
                        f"{self.keep_gain:.0%} minimum gain (never kept)")
            return True
        if ci.low > 1.0 + self.keep_gain:
            self.why = (f"; timed {ci.rounds} of {self.rounds} rounds: every round so far above the "
                        f"{self.keep_gain:.0%} minimum gain (the confirmation decides)")
            return True
        return False


def look_round(rounds: int) -> int | None:
    """After which round an early stop (interleaved's `stop`) is asked: half of them, three at least; None where
    there are too few rounds to stop before the last."""
    look = max(3, rounds // 2)
    return look if look < rounds else None


def interleaved(clock, arms, b, spot: SpotCheck | None = None, stop=None, phases: dict | None = None
                ) -> tuple[dict[str, list[float]], dict[str, SpeedupCI]]:
    """Time each arm (label, fn) in `b.rounds` rounds, each timing every arm with the same rep count in an
    order rotated round by round, so that load which comes and goes falls on all of them alike (one arm
    alone: its reps spread over the rounds). Returns every arm's times and, per arm after the first, the
    speedup of the first over it (median of the per-round ratios, with an interval of `b.confidence`: 95% unless
    the loop re-benches a doubtful candidate). With `spot`, each round's data
    is new (spot.round), each arm's rep too (spot.refresh), and its bursts are checked (spot.before,
    spot.after). `stop(cis)`, where given, is asked once, after look_round()'s round, with the intervals
    so far: True ends the timing there (a candidate the keep rule can no longer keep, or one every round sent on to
    its confirmation: EarlyStop); the spot check has drawn its one check by then. `phases`: the warm-up's and the rounds' seconds
    added to it ("warm", "rounds")."""
    t0 = time.monotonic()
    ests = [estimate_and_warm(clock, fn, b.warmup_ms) for _, fn in arms]
    t1 = time.monotonic()
    n = reps(max(ests), b.rep_ms)
    if len(arms) == 1:
        n = max(1, n // b.rounds)
    look = look_round(b.rounds) if stop is not None and len(arms) > 1 else None
    if spot is not None:
        spot.look = look
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
                ts = clock.run(fn, n, offset=r * n, before=spot.refresh(label, r))
                spot.after(label, r, r * n, ts)
            else:
                ts = clock.run(fn, n, offset=r * n)
            got[label] += ts
            meds[label] = statistics.median(ts)
        first = meds[arms[0][0]]
        for label in ratios:
            ratios[label].append(meds[label] / max(first, 1e-9))
        if r + 1 == look and stop({label: speedup_ci(rs, b.confidence) for label, rs in ratios.items()}):
            break
    if phases is not None:
        phases["warm"] = phases.get("warm", 0.0) + t1 - t0
        phases["rounds"] = phases.get("rounds", 0.0) + time.monotonic() - t1
    return got, {label: speedup_ci(rs, b.confidence) for label, rs in ratios.items()}
