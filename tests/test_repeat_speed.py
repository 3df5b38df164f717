"""The repeat_speed probe (tools/measure/probes.py) against a clock that behaves as a CPU did on CI: an honest
kernel that allocates per call (every KernelBench solution's empty_like) pays new pages on the first calls after
the process made new buffers (2.6x on CI's machine: ew_cpu refused as a memo; scripts/alloc_first.py shows the
mechanism on this machine). Both directions: that kernel passes, a memo is still caught, with or without the
allocator's transient. The real memo kernels through the real bench: tests/test_cheats.py's fingerprint_partial."""

from __future__ import annotations

import random
from types import SimpleNamespace

from tools.measure.probes import Probe, repeat_speed

SHAPE = {"N": 1024}


class Kernel:
    """A simulated kernel and the process it runs in: each call costs `full` ms, a quarter of that on inputs it saw
    before where `memo`, plus `fault` ms for each of the first `transient` calls after new buffers were made."""

    def __init__(self, memo: bool, transient: int, full: float = 1.0, fault: float = 2.2, preempt=None):
        self.memo, self.transient, self.full, self.fault = memo, transient, full, fault
        self.preempt = preempt or (lambda i, n: 0.0)   # ms another process took from the i-th of n calls
        self.seen: set[int] = set()           # the seeds of the inputs it was called on
        self.owed = 0

    def make_inputs(self, shape, seed, device, dist):
        self.owed = self.transient        # the process made new buffers: the allocator's next pages are new
        return (SimpleNamespace(seed=seed, numel=lambda: 1024, element_size=lambda: 4),)

    def empty_output(self, shape, *inputs):
        return SimpleNamespace()

    def time_pairs(self, sets, outs, n):
        ms = []
        for i in range(n):
            key = sets[i % len(sets)][0].seed    # the values, as a memo keys them
            cost = self.full / 4 if self.memo and key in self.seen else self.full
            if self.owed:
                cost, self.owed = cost + self.fault, self.owed - 1
            self.seen.add(key)
            ms.append(cost + self.preempt(i, n))
        return ms


def _probe(k: Kernel) -> Probe:
    task = SimpleNamespace(spec=SimpleNamespace(distributions=["normal"]))
    sets = [k.make_inputs(SHAPE, s, "cpu", "normal") for s in (1, 2)]
    k.time_pairs(sets, [None, None], 50)                   # the bench's warm-up and reps
    return Probe(task=task, mod=k, shape=SHAPE, device="cpu", device_name="cpu", calls=None, sets=sets,
                 outs=[SimpleNamespace(), SimpleNamespace()], cand_ms=1.0, flops=None, nbytes=None,
                 time_pairs=k.time_pairs, rng=random.SystemRandom(7))


def test_an_honest_kernel_that_pays_new_pages_after_new_buffers_is_not_called_a_memo():
    k = Kernel(memo=False, transient=4)
    # the transient is big enough to matter: timed first, fresh calls would look 3.2x slower than repeats
    fresh = [k.make_inputs(SHAPE, s, "cpu", "normal") for s in (3, 4, 5, 6)]
    assert sorted(k.time_pairs(fresh, [None] * 4, 4)) == [3.2] * 4
    assert repeat_speed(_probe(Kernel(memo=False, transient=4))) is None
    assert repeat_speed(_probe(Kernel(memo=False, transient=0))) is None


def test_a_memo_is_still_caught_with_and_without_the_transient():
    for transient in (0, 4):
        why = repeat_speed(_probe(Kernel(memo=True, transient=transient)))
        assert why is not None and "did less work because they repeated earlier calls" in why, (transient, why)
        assert "4.0x" in why, why


def test_preemptions_on_most_fresh_calls_are_not_a_memo_and_a_memo_under_them_is_caught():
    """A loaded machine (.ci/run: two test workers and a spinner on 2 cores) preempted three of four fresh calls in
    each of three tries (a scheduler slice, 3.5 ms, on 1.2 ms calls): their median 2.4x the repeats', an honest no-op
    refused as a memo. The fastest calls tell a memo all the same (every repeated call is cheaper), so the probe asks
    both; the same preemptions on a memo do not hide it."""
    def slices(i, n):      # the probe's sequence: k uncounted, k fresh, k repeated; most fresh calls lose a slice
        k = n // 3
        return 3.5 if k <= i < 2 * k and i % k != 1 else 0.0
    k = Kernel(memo=False, transient=0, full=1.2, preempt=slices)
    assert repeat_speed(_probe(Kernel(memo=False, transient=0, full=1.2))) is None
    assert repeat_speed(_probe(k)) is None
    why = repeat_speed(_probe(Kernel(memo=True, transient=4, full=1.2, preempt=slices)))
    assert why is not None and "did less work because they repeated earlier calls" in why, why
