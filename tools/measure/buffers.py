"""Parity's buffers (tools/measure/parity.py): per shape, the inputs and two guarded outputs reused across
seeds, what an output holds before the output-state call, and the in-place change of a few input values
before the changed-repeat call; and the seed each check's inputs are made from."""

from __future__ import annotations

import random

from tools.measure.compare import compare, describe, differs, poison_, poisoned_mask, tolerance_for
from tools.measure.domains import draw
from tools.measure.views import misalignment

GUARD_BYTES = 64 * 1024


def check_seed(seed: int, shape: dict, dist: str) -> int:
    """make_inputs' seed for one check of parity's seed `seed`: a draw of its own for every shape and distribution.
    A task seeds one generator with it (torch.Generator().manual_seed), so one seed for every shape starts each
    shape's inputs with the same values: a kernel wrong only where a few input values meet a condition (a fast
    path chosen by the first values) met one draw per seed and distribution, not one per check (A[0] > A[1],
    true half the time, passed 1 parity run in 10 on the CPU task; tests/test_parity.py). Deterministic, so
    that a run's root seed still reproduces it, and "quick" + "rest" still check what "full" does."""
    return random.Random(f"{seed} {sorted(shape.items())} {dist}").getrandbits(31)


# what an output holds before the output-state call, in turn (tools/measure/parity.py one_check)
STATES = ("stale", "zeros", "random")


class Buffers:
    """Per-shape input and output buffers, reused across seeds (pointer-keyed caches go stale)."""

    def __init__(self, torch):
        self.torch = torch
        self.inputs: tuple | None = None
        self.outs: dict[int, tuple] = {}   # slot -> (guarded flat buffer, view, guard elems)
        self.last = 1                       # the slot the latest call wrote
        self.calls = 0                      # checks so far: the output state rotates with them
        self.stale = None                   # the previous check's expected output (another call's result)
        self.misalign = None                # a misaligned check's offsets (tools/measure/views.Offsets), or None

    def order(self) -> tuple[int, int]:
        """Slots for this seed's two calls: the first reuses the buffer the previous call wrote (with new
        inputs), so a cache keyed on the output pointer serves stale data."""
        first = self.last
        self.last = 1 - first
        return first, self.last

    def adopt(self, fresh: tuple) -> tuple:
        t = self.torch
        if self.misalign is not None:       # views at the check's offsets (tools/measure/views.py)
            fresh = self.misalign.inputs(t, fresh)
        if self.inputs is not None and len(fresh) == len(self.inputs) and all(
                isinstance(o, t.Tensor) and isinstance(n, t.Tensor) and o.shape == n.shape and o.dtype == n.dtype
                and o.stride() == n.stride() and o.device == n.device and misalignment(o) == misalignment(n)
                for o, n in zip(self.inputs, fresh)):
            for o, n in zip(self.inputs, fresh):
                o.copy_(n)
            return self.inputs
        self.inputs = fresh
        return fresh

    def out(self, slot: int, template):
        t = self.torch
        have = self.outs.get(slot)
        # a misaligned check's output starts `shift` elements past the allocator's alignment: a guard that much longer
        g = max(1, GUARD_BYTES // template.element_size()) + (
            self.misalign.output(template) if self.misalign is not None else 0) if template.is_contiguous() else 0
        if have is None or have[1].shape != template.shape or have[1].dtype != template.dtype or have[2] != g:
            if template.is_contiguous():
                flat = t.empty(template.numel() + 2 * g, dtype=template.dtype, device=template.device)
                view = flat[g:g + template.numel()].view(template.shape)
            else:
                flat, view, g = template, template, 0
            have = (flat, view, g)
            self.outs[slot] = have
        poison_(have[0])
        return have[1]

    def fill_state(self, view) -> str:
        """Put into `view` what an output may hold before a call (the guards stay poisoned): an earlier
        call's result on other inputs, zeros or random values, in turn. Returns what it put there."""
        t = self.torch
        state = STATES[self.calls % len(STATES)]
        self.calls += 1
        if state == "stale" and (self.stale is None or self.stale.shape != view.shape or self.stale.dtype != view.dtype):
            state = "random"
        if state == "stale":
            view.copy_(self.stale)
        elif state == "zeros":
            view.zero_()
        elif view.dtype.is_floating_point:
            view.copy_(t.rand(view.shape, device=view.device).mul_(2).sub_(1))
        else:
            view.copy_(t.randint(-100, 100, view.shape, device=view.device))
        return {"stale": "an earlier call's result on other inputs", "zeros": "zeros",
                "random": "random values"}[state]

    def guards(self, slot: int):
        """The output slot's guard elements that no longer hold the poison: (before, after) masks, or None where
        the output has no guards. Only the guards are read, not the output between them."""
        flat, view, g = self.outs[slot]
        if not g:
            return None
        n = view.numel()
        return ~poisoned_mask(flat[:g]), ~poisoned_mask(flat[g + n:])

    def guard_hit(self, slot: int) -> int | None:
        """Offset (in elements, negative = before the start) of a write into the guard, or None."""
        masks = self.guards(slot)
        if masks is None:
            return None
        before, after = masks
        if bool(before.any()):
            return int(before.nonzero()[0]) - self.outs[slot][2]
        if bool(after.any()):
            return self.outs[slot][1].numel() + int(after.nonzero()[0])
        return None

    def out_of_bounds(self, slots, label: str, dist: str, numel: int) -> dict | None:
        """parity's verdict on a write into the guards of these output slots, or None: one read back for all of
        them where none was hit (every check asks after each call; on a GPU each read waits for the device)."""
        masks = [m.any() for slot in slots if (ms := self.guards(slot)) is not None for m in ms if m.numel()]
        if not masks or not bool(self.torch.stack(masks).any()):
            return None
        for slot in slots:
            hit = self.guard_hit(slot)
            if hit is not None:
                return {"status": "out_of_bounds", "message": f"{label} dist={dist}: the kernel wrote outside its "
                        f"output tensor (element offset {hit}; the output has {numel} elements)"}
        return None

    def change_inputs(self, fresh: tuple, rng, count: int) -> int:
        """Change `count` values of each floating-point input in place, at random places, to the values
        `fresh` (another draw of the same distribution) holds there: a caller who updates part of an input
        between two calls. Returns how many values changed."""
        t = self.torch
        changed = []
        for x, y in zip(self.inputs or (), fresh):
            if not (isinstance(x, t.Tensor) and isinstance(y, t.Tensor) and x.is_floating_point()
                    and x.is_contiguous() and y.shape == x.shape and x.numel()):
                continue
            idx = t.tensor([rng.randrange(x.numel()) for _ in range(count)], device=x.device)
            flat, new = x.view(-1), y.reshape(-1)[idx]
            changed.append((flat[idx] != new).sum())    # counted before the write, read back once below
            flat[idx] = new
        return int(t.stack(changed).sum()) if changed else 0


def changed_repeat(task, mod, lib, where: tuple, bufs: Buffers, slot_out: tuple, exp, run_kept, sync) -> dict | None:
    """The changed-repeat call (issue 39): the same buffers as the call before, a few input values changed in
    place, into the output that holds the previous call's result. A cache keyed on part of the inputs (their
    pointers, their ends, a sample of their values: a memo, a packed copy of a weight) serves the old answer
    here. Where the reference itself does not tell the change apart (within tolerance), a larger one is tried."""
    shape, label, dist, seed, device = where
    slot, out = slot_out
    rng = random.Random(seed ^ 0x5EED)
    fresh = draw(task.spec, mod, shape, rng.getrandbits(31), device, dist)
    atol, rtol = tolerance_for(task, out)
    for count in (1, 16):
        n = bufs.change_inputs(fresh, rng, count)
        new = mod.reference(shape, *bufs.inputs)
        if n and differs(new, exp, atol, rtol):
            break
    else:
        return None   # no change of a few values shows in this output: nothing to tell a stale answer by
    run_kept(lib, shape, out, *bufs.inputs)
    sync()
    if (oob := bufs.out_of_bounds((slot,), label, dist, out.numel())) is not None:
        return oob
    c = compare(out, new, atol, rtol)
    if c["status"] == "ok":
        return None
    line = describe(label, dist, c, atol, rtol)
    return {**c, "status": "stale_input", "message": f"called again on the same buffers with {n} input value"
            f"{'s' * (n != 1)} changed in place, into the output of the call before, the result was wrong "
            f"({c['status']}): {line}: it answered for the inputs before the change (a cache keyed on part "
            "of the inputs: their pointers or a sample of their values)"}
