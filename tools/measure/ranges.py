"""Parity's shapes from the task's declared ranges (task.toml [dims], issue 39): the inputs a kernel must handle
that the listed and hidden shapes never reach, drawn anew on every parity run.

A model rewriting a kernel freely makes the same accidental mistakes over and over: an index kept in 16
bits (or a block count in 8) that wraps past the tested sizes, a vector strip or a register block with
no tail that is wrong (or out of bounds) for a dimension under its width, a precision that holds at the
tested reduction length and not at the longest. So, for each dimension with a range:
- every dimension at its minimum, and twice every dimension at a small tail value (1, 2, 3, 5, 7, 9, 15,
  17: under and over the vector widths 4, 8, 16);
- one dimension at a time at its largest, the others small (a long row, a long column, the longest
  reduction: the cost of one row, not of the whole largest shape), or at their minimum where small ones would
  take the shape past INDEX_CAP elements;
- one dimension at a time at every value 1..17, the others past 30: every tail of a 4-, 8- or 16-wide vector,
  at every alignment of a row's start (two random tail shapes let a fast path wrong at N = 11, 13-15 through:
  tests/fixtures/cuda_cheats/softmax/short_window.cu), and the shortest reductions, the error budget's sharpest
  point (an operand rounded to fewer bits shows in full where the sum's own rounding is small);
- every dimension past 256 (a prime or an odd number just past it), so that each tensor indexed by two of
  them holds more than 2^16 elements, within INDEX_CAP elements for all the dimensions together.
2^31 (a 32-bit index) is not reached here: the judge and the host each hold the tensors. On a GPU, `wide_shape`
is the one shape whose largest tensor passes 2^31 elements (tools/judge/wide.py checks a candidate on it once).
A task's `valid_shape(shape)` in task.py, where it has one, drops a shape it cannot take.
"""

from __future__ import annotations

import random

from tools.task import shape_size

TAILS = (1, 2, 3, 5, 7, 9, 15, 17)
PAST_16 = (257, 259, 263, 269)      # any two of them multiply past 2^16
WIDE = (31, 33, 47)                 # beside a swept dimension: enough outputs for the error budget's RMS
SWEEP = 17                          # each dimension takes every value 1..SWEEP once
INDEX_CAP = 1 << 27                 # the product of the shape's dimensions at most (an upper bound on a tensor)
INT32_PAST = (1 << 31) + 1          # elements in the wide shape's largest tensor at least: a 32-bit index wraps


def range_shapes(spec, mod, rng: random.Random) -> list[tuple[dict, str]]:
    """(shape, why) for each extreme shape of the task's [dims] (none without it), duplicates dropped."""
    dims = spec.dims
    if not dims:
        return []
    main = dict(spec.main)

    def fit(d: str, v: int) -> int:
        return max(dims[d].min, min(dims[d].max, v))

    out = [({**main, **{d: r.min for d, r in dims.items()}}, "every dimension at its minimum")]
    for _ in range(2):
        out.append(({**main, **{d: fit(d, rng.choice(TAILS)) for d in dims}}, "small dimensions (tails)"))
    for d, r in dims.items():
        what = "the longest reduction" if r.reduction else f"{d} at its largest"
        # the others small; beside the longest reduction 15 or 17, so that the output holds enough elements for
        # the error budget's RMS (tools/measure/compare.py MIN_ELEMENTS)
        small = TAILS[6:] if r.reduction else TAILS[2:6]
        shape = {**main, **{e: fit(e, rng.choice(small)) for e in dims if e != d}, d: r.max}
        if shape_size(shape) > INDEX_CAP:   # the others at their minimum: attention's longest S beside B = H = 1
            shape.update({e: dims[e].min for e in dims if e != d})
        out.append((shape, what))
    for d in dims:   # every value 1..17 of one dimension, the others past 30 (so rows start at every alignment):
        for v in range(max(1, dims[d].min), min(SWEEP, dims[d].max) + 1):   # each tail of a 4-, 8- or 16-wide vector
            out.append(({**main, **{e: fit(e, rng.choice(WIDE)) for e in dims if e != d}, d: v}, f"{d} = {v}"))
    big = {**main, **{d: fit(d, rng.choice(PAST_16)) for d in dims}}
    for d in reversed(list(dims)):   # within the cap: dimensions back to their minimum, the last first
        if shape_size(big) <= INDEX_CAP:
            break
        big[d] = dims[d].min
    if shape_size(big) <= INDEX_CAP:
        out.append((big, "index products past 2^16"))
    valid = getattr(mod, "valid_shape", None)
    seen, keep = set(), []
    for shape, why in out:
        key = tuple(sorted(shape.items()))
        if key in seen or (valid is not None and not valid(shape)):
            continue
        seen.add(key)
        keep.append((shape, why))
    return keep


PROBE_PRIMES = ((11, 13, 17, 19, 23, 29, 31, 37), (41, 43, 47, 53, 59, 61, 67, 71))


def _factors(mod, shape: dict, dims, primes) -> list[tuple[int, dict]] | None:
    """Each tensor (inputs, output) of the shape with its [dims] at distinct small primes, as (the factor the
    other keys give, {dim: its power}): a tensor's elements as a product of the dimensions it is indexed by."""
    from tools.task_messages import make_inputs
    probe = {**shape, **{d: p for d, p in zip(dims, primes)}}
    ins = make_inputs(mod, probe, 0, "cpu", "normal")
    out = []
    for t in (*ins, mod.empty_output(probe, *ins)):
        if not hasattr(t, "numel"):
            continue
        n, powers = int(t.numel()), {}
        for d, p in zip(dims, primes):
            while n and n % p == 0:
                n //= p
                powers[d] = powers.get(d, 0) + 1
        out.append((n, powers))
    return out


def element_counter(mod, shape: dict, dims=()):
    """shape -> the element count of its largest tensor (inputs and output), for shapes that differ from `shape` in
    the [dims] `dims` only. From two calls of make_inputs and empty_output on tiny CPU shapes (the dims at distinct
    primes: which dimensions each tensor is indexed by, the same answer from two sets of primes); the product of
    the shape's dimensions where that does not hold (a task whose sizes are not products of its dimensions, or
    whose functions refuse such shapes)."""
    import math
    dims = [d for d in dims if d in shape][:len(PROBE_PRIMES[0])]
    try:
        a, b = (_factors(mod, shape, dims, primes) for primes in PROBE_PRIMES)
    except Exception:  # the task's functions refuse the probe's shapes: the bound
        return shape_size
    if not a or a != b:
        return shape_size
    return lambda s: max(n * math.prod(int(s[d]) ** e for d, e in powers.items()) for n, powers in a)


def tensor_elements(mod, shape: dict, dims=()) -> int:
    """The element count of the shape's largest tensor (element_counter)."""
    return element_counter(mod, shape, dims)(shape)


def wide_shape(spec, mod, past: int = INT32_PAST) -> dict | None:
    """The main shape with its dimensions grown, one at a time (the reduction's last), each within its declared
    maximum, until the largest tensor holds `past` elements (2^31 + 1: the first where a 32-bit element offset,
    `int row * N` or `(b * H + h) * S * D`, wraps). None where the declared maxima do not reach it."""
    dims = spec.dims
    if not dims:
        return None
    shape = dict(spec.main)
    count = element_counter(mod, shape, list(dims))
    order = [d for d, r in dims.items() if not r.reduction] + [d for d, r in dims.items() if r.reduction]
    for d in order:
        for _ in range(3):   # a tensor indexed by d grows with it; one the size bound misjudges is measured again
            n = count(shape)
            if n >= past:
                break
            grow = -(-past * max(1, int(shape[d])) // n)
            if grow <= shape[d] or shape[d] >= dims[d].max:
                break
            shape[d] = min(dims[d].max, grow)
    if count(shape) < past:
        return None
    valid = getattr(mod, "valid_shape", None)
    return shape if valid is None or valid(shape) else None


def reduction_extreme(spec, shape: dict) -> bool:
    """Is a reduction dimension at its largest or at its shortest (5 or under) in this shape?"""
    return any(r.reduction and d in shape and (shape[d] == r.max or shape[d] <= 5) for d, r in spec.dims.items())
