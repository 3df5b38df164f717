"""Which shapes compute-sanitizer's checks call a candidate on (tools/judge/sanitize.py): memcheck the listed and hidden
shapes (a large one shrunk to its rows: shrunk()) and the [dims] extremes; racecheck the smallest listed shape and
the extremes with the fewest rows (rows()). Each check's cost on an H200 (issue 66, BENCHMARKS.md): memcheck's goes
with the work a call does, racecheck's with the blocks it runs."""

from __future__ import annotations

import math
import random

MAX_SHAPES = 24            # the candidate's calls under the sanitizer (each one instrumented, its buffers cudaMalloc'ed)
MAX_ELEMENTS = 1 << 21     # the largest shape checked (the product of its dimensions); larger listed ones shrunk
WHOLE_ELEMENTS = 1 << 24   # a listed shape that cannot be shrunk (no reduction marked in [dims]) is checked whole to here
RACE_SHAPES = 4            # racecheck's calls (8 took attention's scalar path 25 s under it on an H200)
RACE_ELEMENTS = 1 << 20    # racecheck's largest shape
RACE_ROWS = 64             # racecheck's extremes with more rows than this come last (its cost goes with the blocks)


def shapes(spec, mod, rng: random.Random, most: int = MAX_SHAPES, largest: int = MAX_ELEMENTS,
           whole: int = WHOLE_ELEMENTS) -> list[tuple[dict, str]]:
    """(shape, label) checked under memcheck: the listed and hidden shapes, each past `largest` elements shrunk to
    fit (shrunk(): its reductions as they are) or, where the task does not say which dimensions are reductions, whole
    up to `whole` elements (memcheck's budget before shapes were shrunk: an imported or `agent init` task), then the
    [dims] extremes under `largest` (short rows and tails first: where an access runs past an end), at most `most`.
    racecheck (`most` < MAX_SHAPES): the smallest listed shape (a hidden one only where no listed one fits), then the
    extremes with the fewest rows (rows())."""
    from tools.measure.ranges import range_shapes
    from tools.task import shape_label, shape_size
    out: list[tuple[dict, str]] = [(dict(s), "") for s in spec.shapes]
    if spec.parity.hidden_shapes and hasattr(mod, "hidden_shapes"):
        out += [(dict(s), "hidden ") for s in list(mod.hidden_shapes(random.Random(rng.getrandbits(32))))
                [:spec.parity.hidden_shapes]]
    out = [fit(spec, mod, s, kind, largest, whole) for s, kind in out]
    extremes = [s for s, _ in range_shapes(spec, mod, random.Random(rng.getrandbits(32)))]
    out += [(s, "range ") for s in sorted(extremes, key=shape_size) if shape_size(s) <= largest]
    seen, keep = set(), []
    for s, kind in out:
        if s is None:
            continue
        key = tuple(sorted(s.items()))
        if key in seen:
            continue
        seen.add(key)
        keep.append((s, kind + shape_label(s)))
    if most < MAX_SHAPES:   # racecheck: the smallest listed shape (several tiles, several warps), then the extremes
        # not a hidden one: its cost goes with the reduction a block walks, which a random draw sets (attention on an
        # H200: 1.2 s on hidden S=145, 7.6 s on hidden S=585 against 2.3-3.0 s on the listed S=333; BENCHMARKS.md
        # issue 66 slice 14), and parity and memcheck check the hidden shapes
        # (a hidden one only where no listed shape fits: an imported task's large shapes with no [dims] to shrink by)
        listed = sorted((k for k in keep if not k[1].startswith("range ")),
                        key=lambda k: ("hidden " in k[1], k[1].startswith("shrunk "), shape_size(k[0])))
        ranged = sorted((k for k in keep if k[1].startswith("range ")),
                        key=lambda k: (rows(spec, k[0]) > RACE_ROWS, shape_size(k[0])))
        keep = listed[:1] + ranged
    return keep[:most]


def fit(spec, mod, shape: dict, kind: str, largest: int, whole: int) -> tuple[dict | None, str]:
    """A listed or hidden shape as a check calls it: as listed within `largest` elements, else shrunk (where the task's
    valid_shape(), if it has one, takes the shrunk shape), else whole within `whole`; (None, kind) where none holds."""
    from tools.task import shape_size
    if shape_size(shape) <= largest:
        return shape, kind
    small = shrunk(spec, shape, largest)
    valid = getattr(mod, "valid_shape", None)
    if small is not None and (valid is None or valid(small)):
        return small, "shrunk " + kind
    return (shape if shape_size(shape) <= whole else None), kind


def shrunk(spec, shape: dict, largest: int) -> dict | None:
    """`shape` within `largest` elements for memcheck, or None where it cannot be: its reduction dimensions as they
    are (the length an access runs along, its tail, the path a long row takes), the others of the task's [dims] halved
    (rounded up, never under their `min`), the largest first, until it fits. Halving may change those dimensions'
    tails (B=6 becomes 3): the listed shapes that fit and the [dims] extremes keep theirs. memcheck's cost goes with
    the work a call does, O(S^2) on attention's B=8,H=16,S=2048 (4 s of its 6-7 s on an H200), while what it looks for
    is an access past an end of an allocation, which the last row (the last head) of a smaller batch of the same rows
    reaches the same way. What a grid of that size alone takes is left to the listed shapes that fit (attention:
    B=4,H=16,S=512, 512 CTAs; softmax's have 333 rows at most: its M=65536 and M=4096 rows are checked as 16384 and
    2048).
    None too where [dims] marks no reduction: which lengths an access runs along is then not known."""
    from tools.task import shape_size
    if not any(r.reduction for d, r in spec.dims.items() if d in shape):
        return None
    out, batch = dict(shape), _batch(spec, shape)
    while shape_size(out) > largest:
        d = max((d for d in batch if (out[d] + 1) // 2 >= max(1, spec.dims[d].min) and out[d] > 1),
                key=lambda d: out[d], default=None)
        if d is None:
            return None
        out[d] = (out[d] + 1) // 2
    return out


def rows(spec, shape: dict) -> int:
    """The product of `shape`'s dimensions that are not reductions ([dims]): its rows (attention's heads, softmax's
    rows). racecheck's cost goes with the blocks a call runs (each block's shared memory is shadowed), and these
    count them: B=33,H=31,S=1 (1023 CTAs of one row each) took 5.4 s under it on an H200, B=1,H=1,S=1 next to
    nothing. A race between threads of one block needs one block that takes the path; its extremes (short rows, a
    reduction's tail) are in the shapes with few rows as much as in those with many. shapes() orders racecheck's
    extremes by size among those of at most RACE_ROWS rows (softmax's M=9 or 17 rows: a block of several rows keeps its
    tail), those with more after."""
    from tools.task import shape_size
    batch = _batch(spec, shape)
    return math.prod(shape[d] for d in batch) if batch else shape_size(shape)


def _batch(spec, shape: dict) -> list[str]:
    """`shape`'s dimensions that [dims] declares and does not mark as reductions."""
    return [d for d, r in spec.dims.items() if not r.reduction and d in shape]
