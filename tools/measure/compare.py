"""Comparison of an output with the reference's (child side, shared by parity and the bench's probes):
tolerances per dtype, poisoned outputs (an element left unwritten is told apart from one computed as
NaN), and one-line descriptions of a mismatch."""

from __future__ import annotations

import math
from typing import Any

from tools.task import Task

# quiet NaNs with a payload no arithmetic produces (arithmetic NaNs carry an empty payload)
_POISON_BITS = {"float32": ("int32", 0x7FC0DEAD), "float64": ("int64", 0x7FF8DEADBEEFDEAD),
                "float16": ("int16", 0x7E6D), "bfloat16": ("int16", 0x7FCD)}


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def poison_(t) -> None:
    """Fill t with the poison of its dtype (NaN with payload; integers a sentinel)."""
    import torch
    name = dtype_name(t)
    if name in _POISON_BITS and t.is_contiguous():
        idt, bits = _POISON_BITS[name]
        t.view(getattr(torch, idt)).fill_(bits)
    elif t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(_int_sentinel(t.dtype))


def _int_sentinel(dtype) -> int:
    import torch
    info = torch.iinfo(dtype)
    return info.min + 0x5A if info.min < 0 else info.max - 0x5A


def poisoned_mask(t):
    """Elements that still hold the poison."""
    import torch
    name = dtype_name(t)
    if name in _POISON_BITS and t.is_contiguous():
        idt, bits = _POISON_BITS[name]
        return t.view(getattr(torch, idt)) == bits
    if t.is_floating_point():
        return torch.isnan(t)
    if t.dtype == torch.bool:
        return torch.zeros_like(t, dtype=torch.bool)   # no spare value: unwritten shows as a mismatch
    return t == _int_sentinel(t.dtype)


def poison_exact(t):
    """Elements holding the poison's own bits, or None where t's poison is not told apart from arithmetic's (a float
    dtype without a payload poison: a plain NaN). An element left unwritten where the reference is NaN is found by
    these bits, not by being NaN: a poisoned element is never a right answer, whatever the reference holds."""
    import torch
    name = dtype_name(t)
    if name in _POISON_BITS and t.is_contiguous():
        idt, bits = _POISON_BITS[name]
        return t.view(getattr(torch, idt)) == bits
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        return None
    return t == _int_sentinel(t.dtype)


def tolerance_for(task: Task, out) -> tuple[float, float]:
    name = dtype_name(out)
    tol = task.spec.tolerance.get(name)
    if tol is not None:
        return tol.atol, tol.rtol
    if not out.is_floating_point():
        return 0.0, 0.0
    raise ValueError(f"the output is {name} but task.toml has no [tolerance.{name}]")


CHUNK = 1 << 24   # elements compared at a time: the float64 copies of a 2^31-element output never exist at once


def _chunks(n: int, chunk: int):
    return ((s, min(n, s + chunk)) for s in range(0, n, max(1, chunk)))


def _passes(g, e, atol: float, rtol: float) -> tuple[float, float] | None:
    """A floating-point chunk's (max abs error, max rel error) where every element is within tolerance, both sides
    finite; None where any is not (compare's full account then runs on the chunk). A third of the full account's
    passes over the data: parity compares every output several times (seeds, probes), and a 2^20-element output cost
    90 ms a compare on one thread, half of a CPU task's `agent check`. The same answer: a NaN or an infinity on either
    side (the poison of an unwritten element is a NaN) makes the error NaN or infinite, never within the limit; the
    statistics are the full account's where everything is finite."""
    import torch
    g, e = g.to(torch.float64, copy=True), e.to(torch.float64, copy=True)     # copies: worked on in place below
    err = g.sub_(e).abs_()
    scale = e.abs_()
    ok, most = (err <= scale * rtol + atol).all(), err.max()
    rel = err.div_(scale.clamp_min_(max(atol, 1e-30))).max()
    # one read back for the three (on a GPU each read waits for the device: issue 66, a check's syncs)
    passed, most, rel = torch.stack([ok.to(torch.float64), most, rel]).tolist()
    return (most, rel) if passed else None


def differs(a, b, atol: float, rtol: float, chunk: int = CHUNK) -> bool:
    """Whether compare(a, b, ...) would find anything wrong, without its account (one read back a chunk, where
    compare's failing path makes a dozen): an element beyond atol + rtol |b|, or not finite where b is or is not
    the same special value. For telling two references apart (tools/measure/buffers.py changed_repeat), not for a
    verdict: a NaN with the poison's bits is any NaN here."""
    import torch
    if tuple(a.shape) != tuple(b.shape):
        return True
    af, bf = a.detach().reshape(-1), b.detach().reshape(-1)
    for lo, hi in _chunks(af.numel(), chunk):
        if not bool(torch.isclose(af[lo:hi].double(), bf[lo:hi].double(), rtol=rtol, atol=atol, equal_nan=True).all()):
            return True
    return False


def compare(got, exp, atol: float, rtol: float, chunk: int = CHUNK) -> dict[str, Any]:
    """Every element of got against exp. Returns status (ParityStatus value), errors, worst element. Done
    `chunk` elements at a time (memory bounded whatever the output's size), the same answer as at once."""
    import torch
    if tuple(got.shape) != tuple(exp.shape):
        return {"status": "error", "message": f"output shape {tuple(got.shape)} but reference {tuple(exp.shape)}"}
    gf, ef = got.detach().reshape(-1), exp.detach().reshape(-1)
    # per status: [count, flat index of the worst (the first, without a score), its score]
    acc = {"unwritten": [0, None, 0.0], "nan_inf": [0, None, 0.0], "mismatch": [0, None, -math.inf]}
    max_abs = max_rel = 0.0
    quick = gf.is_floating_point() and not ef.is_complex()
    for lo, hi in _chunks(gf.numel(), chunk):
        passed = _passes(gf[lo:hi], ef[lo:hi], atol, rtol) if quick else None
        if passed is not None:
            max_abs, max_rel = max(max_abs, passed[0]), max(max_rel, passed[1])
            continue
        g, e = gf[lo:hi].double(), ef[lo:hi].double()
        efin = torch.isfinite(e)
        # the poison's own bits wherever the reference is (a NaN reference does not excuse an unwritten element);
        # a plain-NaN poison only where the reference is finite (elsewhere a computed NaN looks the same)
        exact = poison_exact(gf[lo:hi])
        unw = exact if exact is not None else poisoned_mask(gf[lo:hi]) & efin
        gfin = torch.isfinite(g)
        both = efin & gfin
        err = torch.where(both, (g - e).abs(), torch.zeros_like(e))
        max_abs = max(max_abs, float(err.max()))
        max_rel = max(max_rel, float((err / e.abs().clamp_min(max(atol, 1e-30))).max()))
        limit = atol + rtol * e.abs()
        nonfin = ~gfin & efin & ~unw
        # where the reference itself is not finite the candidate must agree (any NaN for NaN, same Inf)
        bad_special = ~efin & ~((torch.isnan(e) & torch.isnan(g)) | (g == e))
        over = (both & (err > limit)) | bad_special
        for status, mask, score in (("unwritten", unw, None), ("nan_inf", nonfin, None),
                                    ("mismatch", over, torch.where(both, err / limit.clamp_min(1e-300), 1.0))):
            n = int(mask.sum())
            if not n:
                continue
            a = acc[status]
            a[0] += n
            if score is None:
                if a[1] is None:
                    a[1] = lo + int(mask.nonzero()[0])
            else:
                sc = torch.where(mask, score, -1.0)
                j = int(sc.argmax())
                if float(sc[j]) > a[2]:   # strictly: the first of equal scores, as argmax over the whole
                    a[1], a[2] = lo + j, float(sc[j])
    res: dict[str, Any] = {"numel": got.numel(), "max_abs_err": max_abs, "max_rel_err": max_rel}
    for status, (n, i, _) in acc.items():
        if n:
            res.update(status=status, mismatches=n, worst_index=unravel(i, tuple(got.shape)),
                       expected=float(ef[i]), got=float(gf[i]))
            return res
    res.update(status="ok", mismatches=0)
    return res


def disagree(a, b, exp, atol: float, rtol: float, chunk: int = CHUNK) -> dict[str, Any] | None:
    """Two candidate outputs that each passed: do they differ from each other beyond tolerance? (In chunks.)"""
    import torch
    af, bf, ef = a.reshape(-1), b.reshape(-1), exp.reshape(-1)
    n, best, at = 0, -1.0, None
    for lo, hi in _chunks(af.numel(), chunk):
        x, y, e = af[lo:hi].double(), bf[lo:hi].double(), ef[lo:hi].double()
        d = (x - y).abs()
        over = (d > atol + rtol * e.abs()) & torch.isfinite(e)
        k = int(over.sum())
        if not k:
            continue
        n += k
        sc = torch.where(over, d, -1.0)
        j = int(sc.argmax())
        if float(sc[j]) > best:
            best, at = float(sc[j]), lo + j
    if not n:
        return None
    return {"mismatches": n, "worst_index": unravel(at, tuple(a.shape)), "first": float(af[at]),
            "second": float(bf[at])}


def error_ratio(got, exp, wp, length: int = 1, chunk: int = CHUNK) -> dict[str, float] | None:
    """The candidate's error against the truth (exp, computed in a higher precision) as a multiple of the
    reference implementation's own (wp: the same computation in the working precision, e.g. fp32 torch.matmul
    against the fp64 truth). Root-mean-square over the elements finite in all three, so that one cancelling
    element does not decide it. The yardstick is never below `floor`, the error of the plainest honest order: a
    sequential sum of `length` terms (the shape's reduction) rounding each partial sum at random, u * RMS(truth)
    * sqrt(length / 6) (Higham's statistical estimate; u is half an ulp of the output's dtype or of fp32, the
    wider), and at least one rounding of the output. A BLAS's own error is 1 to 4 of those roundings at K = 1024,
    depending on the machine it dispatches for (.ci/run's CPU: 1; this one: 4), so the reference alone is no
    yardstick for a plain sum.
    A non-finite candidate element where both references are finite makes the ratio infinite. None where the
    truth is all zeros."""
    import torch
    gf, ef, wf = got.detach().reshape(-1), exp.detach().reshape(-1), wp.detach().reshape(-1)
    if not (gf.numel() == ef.numel() == wf.numel()):
        raise ValueError(f"timing_reference gave {wf.numel()} elements, the reference {ef.numel()}: they must agree "
                         "for the error budget (task.toml [parity] error_budget)")
    count, e2, g2, w2, nonfinite = 0, 0.0, 0.0, 0.0, False   # sums of squares, chunk by chunk (compare's CHUNK)
    for lo, hi in _chunks(gf.numel(), chunk):
        g, e, w = gf[lo:hi].double(), ef[lo:hi].double(), wf[lo:hi].double()
        fin = torch.isfinite(e) & torch.isfinite(w)
        gfin = torch.isfinite(g)
        e, w = torch.where(fin, e, 0.0), torch.where(fin, w, 0.0)    # the elements left out count zero
        # the chunk's five figures read back at once (a boolean index and four reads each waited for a GPU: issue 66)
        n, se, sw, bad, sg = torch.stack([fin.sum().double(), e.pow(2).sum(), (w - e).pow(2).sum(),
                                          (fin & ~gfin).any().double(),
                                          torch.where(fin & gfin, g - e, 0.0).pow(2).sum()]).tolist()
        count += int(n)
        e2, w2, g2 = e2 + se, w2 + sw, g2 + sg
        nonfinite = nonfinite or bool(bad)
    scale = math.sqrt(e2 / count) if count else 0.0
    if scale == 0.0:
        return None
    # the plain sum accumulates in the output's dtype or in fp32, whichever is wider (fp16 kernels sum in fp32)
    acc = torch.finfo(torch.promote_types(got.dtype, torch.float32)).eps / 2
    floor = scale * max(torch.finfo(got.dtype).eps / 2, acc * math.sqrt(length / 6))
    ref = math.sqrt(w2 / count)
    if nonfinite:   # NaN or Inf (or the poison) where both references are finite
        return {"err": math.inf, "ref_err": ref, "floor": floor, "ratio": math.inf}
    cand = math.sqrt(g2 / count)
    return {"err": cand, "ref_err": ref, "floor": floor, "ratio": cand / max(ref, floor)}


MIN_ELEMENTS = 64   # the error budget's RMS over fewer elements is luck (one cancelling sum decides it)


def error_budget(task, mod, shape, inputs, out, exp) -> dict | None:
    """The error budget (issue 39; task.toml [parity] error_budget): the candidate's RMS error against the
    reference (the truth, computed in a higher precision) at most `error_budget` times the RMS error of
    `timing_reference` (the same computation in the working precision, the call a user would make) against
    it. A kernel that rounds its operands or its sums to fewer bits stays inside a fixed atol/rtol at short
    reductions, and is caught here at any length. None where the task sets no budget or the output is small."""
    factor = task.spec.parity.error_budget
    wp_fn = getattr(mod, "timing_reference", None)
    if factor is None or wp_fn is None or out.numel() < MIN_ELEMENTS or not out.is_floating_point():
        return None
    length = math.prod(int(shape[d]) for d, r in task.spec.dims.items() if r.reduction and d in shape)
    r = error_ratio(out, exp, wp_fn(shape, *inputs), length)
    if r is None:
        return None
    if r["ratio"] <= factor:
        return {"status": "ok", "err_ratio": r["ratio"]}
    return {"status": "imprecise", "err_ratio": r["ratio"],
            "message": f"RMS error {r['err']:.3g} against the reference, {r['ratio']:.1f}x the yardstick "
                       f"{max(r['ref_err'], r['floor']):.3g} (the larger of timing_reference's error, the working-"
                       "precision call's, and a plain sequential sum's); the budget is "
                       f"{factor:g}x (task.toml [parity] error_budget): the kernel computes with fewer bits than "
                       "its dtype holds (operands or sums rounded to a narrower type)"}


def bits_differ(pairs) -> list[bool]:
    """For each (a, b) pair of tensors of one shape and dtype on one device, whether any bit differs: read back from
    the device at once (parity's inputs after each call, the host's after each call: on a GPU each read waits)."""
    import torch

    def bits(t):
        return t.contiguous().reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)
    flags = [bits(a).ne(bits(b)).any() for a, b in pairs]
    return [bool(f) for f in torch.stack(flags).tolist()] if flags else []


def all_bits_equal(pairs) -> bool:
    """Every (a, b) pair the same: tensors of one shape and dtype bit for bit (their verdicts read back at once:
    bits_differ), anything else by ==."""
    import torch
    same = []
    for a, b in pairs:
        if not isinstance(a, torch.Tensor):
            if a != b:
                return False
        elif a.shape != b.shape or a.dtype != b.dtype:
            return False
        else:
            same.append((a, b))
    return not any(bits_differ(same))


def bits_equal(a, b) -> bool:
    return all_bits_equal([(a, b)])


def describe(label: str, dist: str, c: dict[str, Any], atol: float, rtol: float) -> str:
    """One line naming a failure: where, expected vs got, how many."""
    where = f"{label} dist={dist}"
    st = c["status"]
    if st == "unwritten":
        return (f"{where}: {c['mismatches']} of {c['numel']} output elements never written (poison still there), "
                f"first at {c['worst_index']}: expected {c['expected']:.6g}")
    if st == "nan_inf":
        return (f"{where}: {c['mismatches']} NaN/Inf outputs where the reference is finite, first at "
                f"{c['worst_index']}: expected {c['expected']:.6g} got {c['got']}")
    return (f"{where}: {c['mismatches']} of {c['numel']} elements outside atol={atol:g} rtol={rtol:g}; worst at "
            f"{c['worst_index']}: expected {c['expected']:.6g} got {c['got']:.6g} "
            f"(max abs err {c['max_abs_err']:.3g}, max rel err {c['max_rel_err']:.3g})")


# --- child side: the check --------------------------------------------------------------------


def unravel(i: int, shape: tuple[int, ...]) -> list[int]:
    """A flat index's position in `shape` (row-major), in Python: torch.unravel_index imports sympy (through
    torch.fx) on its first call, 0.5 s of every parity child that found a mismatch."""
    idx = []
    for n in reversed(shape):
        i, r = divmod(i, n)
        idx.append(r)
    return idx[::-1]
