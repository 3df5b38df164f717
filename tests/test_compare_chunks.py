"""Parity's comparisons in bounded memory (issue 40: an output past 2^31 elements must not need float64 copies of
itself): compare, disagree and error_ratio go chunk by chunk and give the answer they give at once, the counts,
the worst element (the first of equal scores) and the statistics, for every kind of failure."""

from __future__ import annotations

import pytest

from tools.measure.compare import compare, disagree, error_ratio, poison_


def _same(x: dict, y: dict) -> bool:
    return repr(sorted(x.items())) == repr(sorted(y.items()))   # NaN (an unwritten element's value) equals NaN


def _planted(dtype):
    import torch
    g = torch.Generator().manual_seed(5)
    exp = torch.randn(37, 29, generator=g).to(dtype)
    got = exp.clone()
    got[3, 4] += 0.5                      # a mismatch
    got[30, 1] -= 2.0                     # the worst mismatch
    got[11, 7] = float("inf")             # non-finite where the reference is finite
    return exp, got


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compare_in_chunks_is_compare_at_once(dtype):
    import torch
    dt = getattr(torch, dtype)
    exp, got = _planted(dt)
    cases = {"mismatch and nan_inf": got}
    unw = got.clone()
    poison_(unw[20:, :])                  # unwritten rows (the poison in a slice keeps its payload)
    cases["unwritten"] = unw
    special = exp.clone()
    special[5, 5] = float("nan")          # the reference's NaN: the candidate must agree
    cases["bad special"] = exp.clone().index_put_((torch.tensor([5]), torch.tensor([5])), torch.tensor(1.0, dtype=dt))
    tied = exp.clone()
    tied[2, 2] = tied[9, 2] = 0.25
    ties = tied.clone()
    ties[2, 2] += 1.0
    ties[9, 2] += 1.0                     # the same excess on the same value twice: the first is the worst
    cases["ties"] = ties
    refs = {"bad special": special, "ties": tied}
    for name, out in cases.items():
        ref = refs.get(name, exp)
        whole = compare(out, ref, 1e-3, 1e-3, chunk=out.numel())
        for chunk in (1, 7, 100, 512):
            assert _same(compare(out, ref, 1e-3, 1e-3, chunk=chunk), whole), (name, chunk)
        assert whole["status"] != "ok", name
    assert compare(exp, exp, 1e-3, 1e-3, chunk=7)["status"] == "ok"
    assert compare(cases["ties"], tied, 1e-3, 1e-3, chunk=7)["worst_index"] == [2, 2]
    assert compare(cases["mismatch and nan_inf"], exp, 1e-3, 1e-3, chunk=7)["status"] == "nan_inf"


def test_disagree_and_the_error_ratio_in_chunks():
    import torch
    g = torch.Generator().manual_seed(6)
    exp = torch.randn(1000, generator=g)
    a = exp + 1e-6 * torch.randn(1000, generator=g)
    b = a.clone()
    b[[17, 400, 999]] += torch.tensor([0.5, 3.0, 2.0])
    whole = disagree(a, b, exp, 1e-3, 1e-3, chunk=1000)
    assert whole["mismatches"] == 3 and whole["worst_index"] == [400]
    for chunk in (1, 7, 333):
        assert disagree(a, b, exp, 1e-3, 1e-3, chunk=chunk) == whole
    assert disagree(a, a, exp, 1e-3, 1e-3, chunk=7) is None
    truth = exp.double()
    wp = (truth + 1e-6 * torch.randn(1000, generator=g, dtype=torch.float64)).float()
    r = error_ratio(a, exp, wp, length=64, chunk=1000)
    for chunk in (1, 7, 333):
        assert error_ratio(a, exp, wp, length=64, chunk=chunk) == pytest.approx(r)
    nan = a.clone()
    nan[500] = float("nan")
    assert error_ratio(nan, exp, wp, chunk=7)["ratio"] == float("inf")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_the_quick_pass_answers_as_the_full_account_and_leaves_both_sides_alone(dtype, monkeypatch):
    """compare's quick pass (a chunk all within tolerance and finite: a third of the full account's passes) gives the
    full account's answer, statistics to the bit; anything else (a mismatch, a NaN, an infinity, the poison) falls
    through to the full account, chunk by chunk; and neither side's tensor is changed (the quick pass works in place
    on copies: a float64 output's .double() would be itself)."""
    import torch

    from tools.measure import compare as cmp
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(300, 70, generator=g, dtype=torch.float64) * 50
    ref[0, 0], ref[1, 1] = 0.0, 1e-12
    exp = ref.to(dt).double() if dtype != "float64" else ref
    out = (exp * (1 + 1e-4 * torch.rand(exp.shape, generator=g, dtype=torch.float64))).to(dt)
    bad = out.clone()
    bad[7, 3] = float("inf")
    refs = {"ok": (out, exp), "ok, f32 ref": (out, exp.float()), "nan_inf": (bad, exp), "ok, both inf": (bad, bad.double())}
    before = {k: (o.clone(), e.clone()) for k, (o, e) in refs.items()}
    quick = {k: [compare(o, e, 1e-2, 1e-2, chunk=c) for c in (97, o.numel())] for k, (o, e) in refs.items()}
    for k, (o, e) in refs.items():
        assert torch.equal(o, before[k][0]) and torch.equal(e, before[k][1]), k
    monkeypatch.setattr(cmp, "_passes", lambda *a: None)         # the full account alone
    for k, (o, e) in refs.items():
        full = [compare(o, e, 1e-2, 1e-2, chunk=c) for c in (97, o.numel())]
        assert all(_same(q, f) for q, f in zip(quick[k], full)), (k, quick[k], full)
    assert [quick[k][0]["status"] for k in refs] == ["ok", "ok", "nan_inf", "ok"]


def test_differs_and_all_bits_equal_give_compare_and_bits_equal_verdicts_with_one_read_back():
    """Issue 66: on a GPU every value parity reads back waits for the device, and a check made dozens of reads.
    `differs` (changed_repeat's "does the change show") is compare's ok / not ok; `all_bits_equal` is bits_equal
    over every input; each reads back once a chunk, where compare's failing path and a read per input read many."""
    import torch
    from torch.overrides import TorchFunctionMode

    from tools.measure.compare import all_bits_equal, bits_equal, differs

    class Reads(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.tolist, torch.equal):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    exp, got = _planted(torch.float32)
    nan_ref = exp.clone()
    nan_ref[1, 1], nan_ref[2, 2] = float("nan"), float("-inf")
    close = exp + 1e-5
    cases = [(got, exp), (exp, exp), (close, exp), (nan_ref, nan_ref), (nan_ref.clone().fill_(1), nan_ref),
             (exp[:5], exp), (torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]))]
    for a, b in cases:
        want = compare(a, b, 1e-3, 1e-3)["status"] != "ok"
        for chunk in (7, a.numel() or 1):
            assert differs(a, b, 1e-3, 1e-3, chunk=chunk) == want, (a.flatten()[:3], chunk)
    Reads.n = 0
    with Reads():
        assert differs(got, exp, 1e-3, 1e-3)
    assert Reads.n == 1
    zero = torch.zeros(4)
    pairs = [(exp, exp.clone()), (torch.tensor([0.0]), torch.tensor([-0.0])), (3, 3), (zero, zero.clone())]
    for k in range(len(pairs) + 1):
        some = pairs[:k]
        assert all_bits_equal(some) == all(bits_equal(a, b) for a, b in some), k
    Reads.n = 0
    with Reads():
        assert all_bits_equal([pairs[0], pairs[3], (got, got.clone())])
    assert Reads.n == 1
    assert not all_bits_equal([(exp, exp.clone()), (exp, exp.to(torch.float64))])   # a dtype's bits differ
