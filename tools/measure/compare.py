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


def tolerance_for(task: Task, out) -> tuple[float, float]:
    name = dtype_name(out)
    tol = task.spec.tolerance.get(name)
    if tol is not None:
        return tol.atol, tol.rtol
    if not out.is_floating_point():
        return 0.0, 0.0
    raise ValueError(f"the output is {name} but task.toml has no [tolerance.{name}]")


def compare(got, exp, atol: float, rtol: float) -> dict[str, Any]:
    """Every element of got against exp. Returns status (ParityStatus value), errors, worst element."""
    import torch
    if tuple(got.shape) != tuple(exp.shape):
        return {"status": "error", "message": f"output shape {tuple(got.shape)} but reference {tuple(exp.shape)}"}
    unw = poisoned_mask(got)
    g, e = got.detach().double(), exp.detach().double()
    efin = torch.isfinite(e)
    unw = unw & efin
    gfin = torch.isfinite(g)
    both = efin & gfin
    err = torch.where(both, (g - e).abs(), torch.zeros_like(e))
    scale = e.abs().clamp_min(max(atol, 1e-30))
    rel = err / scale
    limit = atol + rtol * e.abs()
    res: dict[str, Any] = {"numel": got.numel(),
                           "max_abs_err": float(err.max()) if got.numel() else 0.0,
                           "max_rel_err": float(rel.max()) if got.numel() else 0.0}
    nonfin = ~gfin & efin & ~unw
    # where the reference itself is not finite the candidate must agree (any NaN for NaN, same Inf)
    bad_special = ~efin & ~((torch.isnan(e) & torch.isnan(g)) | (g == e))
    over = (both & (err > limit)) | bad_special
    for status, mask, score in (("unwritten", unw, None), ("nan_inf", nonfin, None),
                                ("mismatch", over, torch.where(both, err / limit.clamp_min(1e-300), 1.0))):
        n = int(mask.sum())
        if n:
            flat = mask.reshape(-1)
            i = int(flat.nonzero()[0]) if score is None else int(torch.where(flat, score.reshape(-1), -1.0).argmax())
            idx = unravel(i, tuple(got.shape))
            res.update(status=status, mismatches=n, worst_index=idx,
                       expected=float(e.reshape(-1)[i]), got=float(g.reshape(-1)[i]))
            return res
    res.update(status="ok", mismatches=0)
    return res


def disagree(a, b, exp, atol: float, rtol: float) -> dict[str, Any] | None:
    """Two candidate outputs that each passed: do they differ from each other beyond tolerance?"""
    import torch
    x, y, e = a.double(), b.double(), exp.double()
    d = (x - y).abs()
    over = (d > atol + rtol * e.abs()) & torch.isfinite(e)
    n = int(over.sum())
    if not n:
        return None
    i = int(torch.where(over.reshape(-1), d.reshape(-1), -1.0).argmax())
    idx = unravel(i, tuple(a.shape))
    return {"mismatches": n, "worst_index": idx, "first": float(x.reshape(-1)[i]), "second": float(y.reshape(-1)[i])}


def error_ratio(got, exp, wp, length: int = 1) -> dict[str, float] | None:
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
    g, e, w = got.detach().double().reshape(-1), exp.detach().double().reshape(-1), wp.detach().double().reshape(-1)
    if not (g.numel() == e.numel() == w.numel()):
        raise ValueError(f"timing_reference gave {w.numel()} elements, the reference {e.numel()}: they must agree "
                         "for the error budget (task.toml [parity] error_budget)")
    fin = torch.isfinite(e) & torch.isfinite(w)
    g, e, w = g[fin], e[fin], w[fin]
    scale = float(e.pow(2).mean().sqrt()) if e.numel() else 0.0
    if scale == 0.0:
        return None
    # the plain sum accumulates in the output's dtype or in fp32, whichever is wider (fp16 kernels sum in fp32)
    acc = torch.finfo(torch.promote_types(got.dtype, torch.float32)).eps / 2
    floor = scale * max(torch.finfo(got.dtype).eps / 2, acc * math.sqrt(length / 6))
    if not bool(torch.isfinite(g).all()):   # NaN or Inf (or the poison) where both references are finite
        return {"err": math.inf, "ref_err": float((w - e).pow(2).mean().sqrt()), "floor": floor, "ratio": math.inf}
    cand, ref = float((g - e).pow(2).mean().sqrt()), float((w - e).pow(2).mean().sqrt())
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


def bits_equal(a, b) -> bool:
    import torch
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


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
