"""The values callers pass that the sample never holds (issue 62): parity's `values` draws.

task.py's make_inputs draws the sample (normal, uniform, ...): values of a few units. Callers pass more: logits past
+90 (a softmax that skips its max overflows there), rows masked with -inf (a one-pass softmax returns NaN for a row
that begins with one), zeros of either sign and subnormals. Before a keep (parity's full and rest extents) parity adds
one check per draw on the smallest listed shape and on the first hidden one, labelled `values`:

- `values:large` - the sample scaled by a power of two to 1/16 of the edge where the call a user makes stays finite
  (timing_reference, the working-precision call, where the task has one; else the reference: an honest kernel
  handles what torch's own call handles, not what a float64 truth does), found by doubling, then halving; at most
  the input's [[inputs]] max, and its dtype's largest value / 2. Every other row of each input is moved below
  zero (all negative), its lowest value at that edge where the user's call stays finite there (below any finite
  sentinel a max may start at: fp16's -1e4 included), else by twice its magnitude;
- `values:tiny` - a quarter of each float input's elements replaced by +0, -0 and subnormals of either sign, and one
  row in seven scaled into the subnormal range;
- `values:specials` - where task.toml's [[inputs]] declares them (specials = ["-inf"]): scattered (1 in 16), whole
  rows, a leading and a trailing quarter of a row (a row: the last dimension), on rows of their own.

Each is compared as every check is (tools/measure/compare.py): NaN and inf where the reference has them, finite
where it is finite, so a reference that answers NaN for a fully masked row asks the kernel for NaN there (a task
whose convention is zeros says so in its reference); on values:large a few finite elements (one in 1024) may be past
tolerance, counted and said (excuse: an fp32 rounding decides them there). The error budget and the changed repeat
are not run on these draws: they are about precision and caches on the sample, these about the domain. An input
declared with `values = false` (an index or a mask held as floats) is left as make_inputs drew it.
"""

from __future__ import annotations

import math
from tools.task_messages import make_inputs
from tools.taskspec import InputSpec

PREFIX = "values:"
HEADROOM_LOG2 = 4            # 1/16 of the edge: an honest kernel's partial sums have room the reference's result has
LARGE = PREFIX + "large"
STRAY = 1024                 # the large draw lets one element in STRAY past tolerance: excuse()
_NONE = InputSpec()


def draws(spec) -> list[str]:
    """The value draws a task gets: large and tiny always (its float inputs), specials where it declares some."""
    return [LARGE, PREFIX + "tiny"] + ([PREFIX + "specials"] if any(i.specials for i in spec.inputs) else [])


def is_values(dist: str) -> bool:
    return dist.startswith(PREFIX)


def value_shapes(shapes: list[tuple[dict, str]]) -> list[dict]:
    """The shapes the draws run on: the smallest listed one (by its dimensions' product) and the first hidden one."""
    def size(s: dict) -> int:
        return math.prod(int(v) for v in s.values() if isinstance(v, int) and not isinstance(v, bool))
    listed = [s for s, kind in shapes if kind == ""]
    hidden = [s for s, kind in shapes if kind == "hidden "]
    out = [min(listed, key=size)] if listed else []
    return out + [s for s in hidden[:1] if s not in out]


def draw(spec, mod, shape: dict, seed: int, device: str, dist: str) -> tuple:
    """make_inputs' answer for a distribution of the task's; for a values draw, the sample (the task's first
    distribution) moved to that draw's values."""
    if not is_values(dist):   # a misaligned check (tools/measure/views.py) draws the sample: its views are the point
        return make_inputs(mod, shape, seed, device, spec.distributions[0] if dist.startswith("offset:") else dist)
    import torch
    base = make_inputs(mod, shape, seed, device, spec.distributions[0])
    decl = [spec.inputs[i] if i < len(spec.inputs) else _NONE for i in range(len(base))]
    floats = [i for i, x in enumerate(base) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()
              and decl[i].values]
    # drawn where the inputs are: on an H200 a draw's CPU ops on torch's 16 threads took 0.25 s beside a busy process
    # (the memcheck host beside parity), 0.03 s alone; on the card 1-2 ms (scripts/device/draw_cost.py, issue 66)
    on = base[floats[0]].device if floats else torch.device("cpu")
    gen = torch.Generator(device=on).manual_seed(seed)
    kind = dist[len(PREFIX):]
    if kind == "large":
        return _large(mod, shape, base, floats, decl, (id(mod), tuple(sorted(shape.items())), seed))
    if kind == "tiny":
        return tuple(_tiny(x, gen) if i in floats else x for i, x in enumerate(base))
    if kind == "specials":
        return tuple(_specials(x, decl[i].specials, gen) if i in floats and decl[i].specials else x
                     for i, x in enumerate(base))
    raise ValueError(f"unknown value draw {dist!r}")


def scaled_atol(exp, atol: float, rtol: float) -> float:
    """A value draw's absolute tolerance: the task's, or rtol times the reference's RMS over its finite elements where
    that is larger. At 1e30 an atol of 1e-4 is no tolerance: an element where an honest fp32 sum cancels by chance
    (a result far under its terms) then fails, where at the sample's scale the atol covers it. Precision is judged on
    the sample; these draws judge the domain (non-finite values, overflow, the masked rows)."""
    import torch
    e = exp.detach().double() if isinstance(exp, torch.Tensor) else None
    if e is None or not e.numel():
        return atol
    fin = e[torch.isfinite(e)]
    return max(atol, rtol * float(fin.pow(2).mean().sqrt())) if fin.numel() else atol


def judged(dist: str, out, exp, atol: float, rtol: float) -> dict:
    """compare's account of an output on draw `dist`, the large draw's excused (excuse)."""
    from tools.measure.compare import compare
    c = compare(out, exp, atol, rtol)
    return excuse(c, out, exp, atol, rtol) if dist == LARGE else c


def excuse(c: dict, out, exp, atol: float, rtol: float) -> dict:
    """The large draw's account of a kernel's output, given compare's (c): a mismatch on at most one element in
    STRAY, each finite where the reference is and within twice the reference's largest magnitude, is excused, the
    account then ok with the number in `excused`. Far past the sample fp32 cannot resolve every element: attention's
    logits reach 1e9 there (q and k at fp16's edge), a rounding of 64 decides which of two near-tied keys wins a row,
    and the honest kernel, the fp32 reference and fp16 SDPA each differ from the other two on one row in about one
    draw in a hundred (41-53 elements of a 262144-element output; scripts/device/values_large.py, on an H200, issue
    66). The domain's failures these draws are for (an overflow, a sentinel, a NaN) are never excused, nor an element
    of a reference that is not finite, nor more than a few: those of the adversaries reach whole rows."""
    import torch
    if c["status"] != "mismatch" or c["mismatches"] > out.numel() // STRAY:
        return c
    g, e = out.detach().double().reshape(-1), exp.detach().double().reshape(-1)
    efin = torch.isfinite(e)
    top = float(e[efin].abs().max()) if bool(efin.any()) else 0.0
    met = (efin & ((g - e).abs() <= atol + rtol * e.abs())) | (torch.isnan(e) & torch.isnan(g)) | (g == e)
    if not bool((met | (efin & torch.isfinite(g) & (g.abs() <= 2 * top + atol))).all()):
        return c
    left = ("worst_index", "expected", "got", "message")
    return {**{k: v for k, v in c.items() if k not in left}, "status": "ok", "mismatches": 0,
            "excused": int((~met).sum())}


def _scaled(base: tuple, floats: list[int], k: int, edges: dict[int, float] | None = None) -> tuple:
    """The sample times 2^k, and every other row of each float input (its last dimension) moved below zero by twice
    its largest magnitude: rows of large logits all negative (below any finite sentinel: flashinfer-ai/flashinfer
    #4267) beside rows of both signs (an exp without its max overflows). Shifted one way only: rows moved up and down
    both would make a reduction across rows cancel (a matmul's honest fp32 sum then differs from the truth by more
    than its tolerance, as torch's own would). `edges` (input -> the edge _large's k stays under): those rows moved
    down to it instead, their lowest value at -edge, so that their max is at most -edge/3 whatever the draw."""
    # in two powers of two: a float64 input's 2^k can pass a Python float's range (2^1023) where each half does not
    return tuple(_shift(x * 2.0 ** (k // 2) * 2.0 ** (k - k // 2), (edges or {}).get(i)) if i in floats else x
                 for i, x in enumerate(base))


def _shift(x, edge: float | None = None):
    import torch
    rows = _rows(x)
    top = rows.abs().amax(dim=-1, keepdim=True)
    odd = (torch.arange(rows.shape[0], device=x.device) % 2 == 1)[:, None]
    down = 2 * top if edge is None else torch.maximum(edge - top, 2 * top)   # the lowest value at -edge
    return (rows - odd * down).view(x.shape)


def _finite_where(ref_new, ref_base) -> bool:
    import torch
    outs = [(a, b) for a, b in zip(_tensors(ref_new), _tensors(ref_base)) if a.is_floating_point()]
    return all(bool((torch.isfinite(a) | ~torch.isfinite(b)).all()) for a, b in outs)


def _tensors(x) -> list:
    import torch
    return [x] if isinstance(x, torch.Tensor) else [t for t in x if isinstance(t, torch.Tensor)]


# what _large found, by (module, shape, seed): the judge child held for a keep's confirmation searches while it waits
# (tools/measure/warmup.py search_ahead), and its job's draws on the same seed find the answer here. A fresh process's
# first calls of the user's call load its kernels: fp16 SDPA's 0.56-0.80 s a shape on an H200 (issue 66, slice 17),
# the later ones 0.1 ms. Kept with the module and call it was made with (an id can be reused once a module is gone)
# and the sample's fingerprint: a make_inputs whose draw differs is searched again
_SEARCHED: dict[tuple, tuple] = {}


def _fingerprint(base: tuple, floats: list[int]) -> tuple:
    return tuple((float(base[i].abs().max()), float(base[i].double().sum())) for i in floats)


def _large(mod, shape: dict, base: tuple, floats: list[int], decl: list[InputSpec], key: tuple = ()) -> tuple:
    """The sample scaled by 2^k (rows shifted: _scaled), k at the edge where the user's call stays finite less
    HEADROOM_LOG2."""
    if not floats:
        return base
    call = getattr(mod, "timing_reference", None) or mod.reference
    seen = _SEARCHED.get(key) if key else None
    if seen is not None and seen[0] is mod and seen[1] == call and seen[2] == _fingerprint(base, floats):
        return _edged(base, floats, decl, seen[3], seen[4])
    edges, room, kmax = _room(base, floats, decl)
    if kmax < 0:        # the declared max is under 3x the sample's: nothing to draw past it
        return base
    ref = call(shape, *base)
    ok, k = 0, 1
    while k <= kmax and _finite_where(call(shape, *_scaled(base, floats, k)), ref):
        ok, k = k, k * 2
    hi = min(k, kmax + 1)               # the first k known (or assumed, past kmax) to be out
    while hi - ok > 1:
        mid = (ok + hi) // 2
        if _finite_where(call(shape, *_scaled(base, floats, mid)), ref):
            ok = mid
        else:
            hi = mid
    low_ok = ok == kmax and _finite_where(call(shape, *_edged(base, floats, decl, ok, True)), ref)
    if key:
        _SEARCHED[key] = (mod, call, _fingerprint(base, floats), ok, low_ok)
    return _edged(base, floats, decl, ok, low_ok)


def _room(base: tuple, floats: list[int], decl: list[InputSpec]) -> tuple[dict, dict, int]:
    """Each float input's edge (its [[inputs]] max, at most its dtype's largest / 2), the powers of two its sample
    can be scaled by under it, and the least of those."""
    import torch
    # a shifted row reaches 3x the sample's largest magnitude; the logs subtracted, not the magnitudes divided: a
    # float64 sample's largest under 1/6 gave finfo.max/2 over it an infinity (OverflowError in floor)
    edges = {i: min(float(decl[i].max or math.inf), torch.finfo(base[i].dtype).max / 2) for i in floats}
    room = {i: math.floor(math.log2(edges[i]) - math.log2(max(3 * float(base[i].abs().max()), 1e-30))) for i in floats}
    return edges, room, min(room.values())


def _edged(base: tuple, floats: list[int], decl: list[InputSpec], ok: int, low: bool) -> tuple:
    """_large's draw once its search has found `ok` (and whether the rows moved to the edge keep the call finite)."""
    edges, room, kmax = _room(base, floats, decl)
    if ok < kmax:       # the user's call overflows before the edge: headroom, and the rows moved as far as their size
        return _scaled(base, floats, max(0, ok - HEADROOM_LOG2))
    # finite up to the edge: the negative rows of the inputs the edge bounds moved as low as it allows, where the
    # user's call stays finite there. Moved by twice their magnitude, fp16's rows had their max at -8800..-12000, and
    # a max that starts at a finite sentinel of -1e4 went unseen where no row was below it
    # (scripts/device/verify_gpu.py values_sentinel, kept on an H200, issue 66 slice 14); at the edge (32752) every
    # such row's max is under -10917. An input another one's edge holds back keeps its rows' size (a row moved far
    # past it would round to one value in fp16)
    return _scaled(base, floats, ok, {i: e for i, e in edges.items() if room[i] == kmax}) if low else \
        _scaled(base, floats, ok)


def _rows(x):
    return x.view(-1, x.shape[-1]) if x.dim() >= 1 else x.view(1, 1)


def _tiny(x, gen):
    import torch
    fi = torch.finfo(x.dtype)
    n, on = x.numel(), gen.device
    pick = torch.rand(n, generator=gen, device=on) < 0.25
    kind = torch.randint(0, 4, (n,), generator=gen, device=on)
    sub = torch.rand(n, generator=gen, dtype=torch.float64, device=on) * fi.tiny
    vals = torch.where(kind == 0, 0.0, torch.where(kind == 1, -0.0, torch.where(kind == 2, sub, -sub)))
    y = torch.where(pick.view(x.shape).to(x.device), vals.view(x.shape).to(x.dtype).to(x.device), x)
    rows = _rows(y)
    some = rows[3 % max(1, rows.shape[0])::7]                    # one row in seven: subnormal, every element
    top = some.abs().amax(dim=-1, keepdim=True).double().clamp_min(1e-300)
    rows[3 % max(1, rows.shape[0])::7] = (some.double() * (fi.tiny / 4 / top)).to(x.dtype)
    return y


def _specials(x, specials: list[str], gen):
    """Specials on rows of their own: whole rows (r % 5 == 1), a leading quarter (2), a trailing quarter (3), and
    scattered 1 in 16 (0 and 4); a one-row input takes the leading quarter."""
    import torch
    on = gen.device
    vals = torch.tensor([float(v) for v in specials], dtype=torch.float64, device=on)
    rows = _rows(x)
    n_rows, width = rows.shape
    q = max(1, width // 4)
    r = torch.arange(n_rows, device=on)
    pattern = torch.full((n_rows,), 2, device=on) if n_rows == 1 else r % 5
    col = torch.arange(width, device=on)
    mask = ((pattern == 1)[:, None] | ((pattern == 2)[:, None] & (col < q)[None, :])
            | ((pattern == 3)[:, None] & (col >= width - q)[None, :])
            | (((pattern == 0) | (pattern == 4))[:, None]
               & (torch.rand(n_rows, width, generator=gen, device=on) < 1 / 16)))
    which = torch.randint(0, len(vals), (n_rows, width), generator=gen, device=on)
    which = torch.where(((pattern == 0) | (pattern == 4))[:, None], which, ((r // 5) % len(vals))[:, None])
    y = torch.where(mask.to(x.device), vals[which].to(x.dtype).to(x.device), rows)
    return y.view(x.shape)
