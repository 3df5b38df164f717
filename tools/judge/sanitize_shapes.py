"""Which shapes compute-sanitizer's checks call a candidate on (tools/judge/sanitize.py): memcheck the listed and hidden
shapes (a large one shrunk to its rows: shrunk()) and the [dims] extremes; racecheck the smallest listed shape and
the extremes with the fewest rows (rows()). Each check's cost on an H200 (issue 66, BENCHMARKS.md): memcheck's goes
with the work a call does, racecheck's with the blocks it runs."""

from __future__ import annotations

import random

MAX_SHAPES = 24            # the candidate's calls under the sanitizer (each one instrumented, its buffers cudaMalloc'ed)
MAX_ELEMENTS = 1 << 21     # the largest shape checked (the product of its dimensions); larger listed ones shrunk
RACE_SHAPES = 4            # racecheck's calls (8 took attention's scalar path 25 s under it on an H200)
RACE_ELEMENTS = 1 << 20    # racecheck's largest shape


def shapes(spec, mod, rng: random.Random, most: int = MAX_SHAPES, largest: int = MAX_ELEMENTS) -> list[tuple[dict, str]]:
    """(shape, label) checked under memcheck: the listed and hidden shapes, each past `largest` elements shrunk to
    fit (shrunk(): its reductions as they are), then the [dims] extremes under it (short rows and tails first: where an
    access runs past an end), at most `most`. racecheck (`most` < MAX_SHAPES): the smallest listed shape, then the
    extremes with the fewest rows (rows())."""
    from tools.measure.ranges import range_shapes
    from tools.task import shape_label, shape_size
    out: list[tuple[dict, str]] = [(dict(s), "") for s in spec.shapes]
    if spec.parity.hidden_shapes and hasattr(mod, "hidden_shapes"):
        out += [(dict(s), "hidden ") for s in list(mod.hidden_shapes(random.Random(rng.getrandbits(32))))
                [:spec.parity.hidden_shapes]]
    out = [(s, kind) if shape_size(s) <= largest else (shrunk(spec, s, largest), "shrunk " + kind) for s, kind in out]
    extremes = [s for s, _ in range_shapes(spec, mod, random.Random(rng.getrandbits(32)))]
    out += [(s, "range ") for s in sorted(extremes, key=shape_size)]
    seen, keep = set(), []
    for s, kind in out:
        if s is None:
            continue
        key = tuple(sorted(s.items()))
        if key in seen or shape_size(s) > largest:
            continue
        seen.add(key)
        keep.append((s, kind + shape_label(s)))
    if most < MAX_SHAPES:   # racecheck: the smallest listed shape (several tiles, several warps), then the extremes
        listed = sorted((k for k in keep if not k[1].startswith("range ")), key=lambda k: shape_size(k[0]))
        ranged = sorted((k for k in keep if k[1].startswith("range ")), key=lambda k: (rows(spec, k[0]),
                                                                                      shape_size(k[0])))
        keep = listed[:1] + ranged
    return keep[:most]


def shrunk(spec, shape: dict, largest: int) -> dict | None:
    """`shape` within `largest` elements for memcheck, or None where it cannot be: its reduction dimensions as they
    are (the length an access runs along, its tail, the path a long row takes), the others of the task's [dims] halved
    (rounded up), the largest first, until it fits. memcheck's cost goes with the work a call does, O(S^2) on
    attention's B=8,H=16,S=2048 (4 s of its 6-7 s on an H200), while what it looks for is an access past an end of
    an allocation, which the last row (the last head) of a smaller batch of the same rows reaches the same way. What
    a grid of that size alone takes is left to the listed shapes that fit (attention: B=4,H=16,S=512, 512 CTAs)."""
    from tools.task import shape_size
    out = dict(shape)
    batch = [d for d, r in spec.dims.items() if not r.reduction and d in out]
    while shape_size(out) > largest:
        d = max((d for d in batch if out[d] > 1), key=lambda d: out[d], default=None)
        if d is None:
            return None
        out[d] = (out[d] + 1) // 2
    return out


def rows(spec, shape: dict) -> int:
    """The product of `shape`'s dimensions that are not reductions ([dims]): its rows (attention's heads, softmax's
    rows). racecheck's cost goes with the blocks a call runs (each block's shared memory is shadowed), and these
    count them: B=33,H=31,S=1 (1023 CTAs of one row each) took 5.4 s under it on an H200, B=1,H=1,S=1 next to
    nothing. A race between threads of one block needs one block that takes the path; its extremes (short rows, a
    reduction's tail) are in the shapes with few rows as much as in those with many."""
    from tools.task import shape_size
    batch = [d for d, r in spec.dims.items() if not r.reduction and d in shape]
    if not batch:
        return shape_size(shape)
    n = 1
    for d in batch:
        n *= shape[d]
    return n
