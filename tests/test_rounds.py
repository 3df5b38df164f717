"""The bench's rounds on values no call has seen (issue 39, tools/measure/rounds.py): the per-rep refresh and
their replay in the judge, the refill mirrored in the kernel's host, and an exact memo timed honest."""

from __future__ import annotations

import torch

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tools.measure.rounds import Refresh, replay, refresh_positions


def test_the_judges_replay_of_a_bursts_copies_is_what_the_host_did_rep_by_rep():
    """The host overwrites one value of each floating input with another before each rep; the judge
    replays a burst's at once on its copy. Bit for bit the same (the numpy path for float32, the tensor
    path for bfloat16), integer inputs untouched, each rep's set really changed, and changed so that its
    sum changes too (a permutation would not: a memo keyed on a sum or an xor would not see it)."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        host = [(torch.randn(7, 5, generator=g).to(dtype), torch.arange(6), torch.randn(40, generator=g).to(dtype))
                for _ in range(3)]
        judge = [tuple(t.clone() for t in s) for s in host]
        refresh = Refresh(1234, host)
        for i in range(17, 17 + 50):
            before = [t.clone() for t in host[i % 3]]
            refresh(i)
            assert torch.equal(before[1], host[i % 3][1])
            a, b = refresh_positions(1234, i, 2, 40)
            after = host[i % 3][2]
            assert after[a] == before[2][b] and sum(int(x != y) for x, y in zip(before[2], after)) <= 1
            if before[2][a] != before[2][b]:   # one value changed to another of its own: the sum moves
                assert float(before[2].double().sum()) != float(after.double().sum())
        replay(judge, 1234, 17, 50)
        for hs, js in zip(host, judge):
            for h, j in zip(hs, js):
                assert torch.equal(h.view(torch.uint8) if h.is_floating_point() else h,
                                   j.view(torch.uint8) if j.is_floating_point() else j)
    assert refresh_positions(5, 3, 0, 1000) == refresh_positions(5, 3, 0, 1000) != refresh_positions(5, 4, 0, 1000)


def test_the_rounds_new_values_reach_the_host_even_where_make_inputs_differs_by_process(tmp_path):
    """The host makes each round's values from the judge's seeds; a task whose make_inputs is not the
    same in two processes (here it mixes in the process id) gets different digests from the host, and
    the judge's values go as files: the honest kernel's bench is `ok`. Without that, the spot check
    would compare the host's outputs with the reference on other values and refuse an honest kernel."""
    from tools.measure.bench import run_bench
    task, lib = make_task(tmp_path, "correct", rounds=4)
    py = task.root / "task.py"
    py.write_text(py.read_text() + "\n\n_make_inputs = make_inputs\n\n\n"
                  "def make_inputs(shape, seed, device, dist):   # not the same in two processes\n"
                  "    import os\n"
                  "    return _make_inputs(shape, (seed ^ os.getpid()) & 0x7FFFFFFF, device, dist)\n")
    from tools.task import load_task
    task = load_task(task.root)
    for _ in range(2):
        [res] = run_bench(task, lib, with_reference=False, shapes=[{"M": 48, "N": 40, "K": 32}])
        assert res.status.value == "ok", res.message


def test_an_exact_memo_lazy_on_repeats_is_timed_at_its_honest_speed(tmp_path):
    """Straight through run_bench (the judge and its host) on the small test task: an exact memo (right on
    every call) that recomputes a quarter of the rows on a repeat of the same buffers and values, timed
    against the same kernel without the memo. No timed call repeats another, so its figure is its honest
    kernel's (memo_exact_window.cpp, timed so before the per-rep refresh: 3.3-3.4x, VERIFICATION.md 7g)."""
    from tools.measure.bench import run_bench
    task, honest = make_task(tmp_path, "correct", rounds=6)
    memo = source("correct").replace('extern "C" void matmul(', "static void matmul_full(") + r'''
#include <cstring>
#include <vector>
struct Entry { const void *a, *b, *c; std::vector<float> av, bv, saved; };
static std::vector<Entry> seen;
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    const size_t mk = (size_t)M * K, kn = (size_t)K * N, mn = (size_t)M * N;
    for (Entry& e : seen)
        if (e.a == A && e.b == B && e.c == C && e.av.size() == mk && e.bv.size() == kn && e.saved.size() == mn
            && !std::memcmp(e.av.data(), A, mk * 4) && !std::memcmp(e.bv.data(), B, kn * 4)) {
            const int top = (M + 3) / 4;   // a repeat: a quarter recomputed, the rest from the saved result
            matmul_full(A, B, C, top, N, K);
            std::memcpy(C + (size_t)top * N, e.saved.data() + (size_t)top * N, (mn - (size_t)top * N) * 4);
            return;
        }
    matmul_full(A, B, C, M, N, K);
    if (seen.size() > 64) seen.clear();
    seen.push_back({A, B, C, std::vector<float>(A, A + mk), std::vector<float>(B, B + kn), std::vector<float>(C, C + mn)});
}
'''
    lazy = compile_lib(memo, tmp_path / "libmemo.so")
    [res] = run_bench(task, lazy, baseline_lib=honest, with_reference=False, shapes=[{"M": 96, "N": 96, "K": 96}])
    assert res.speedup_vs_baseline.median < 1.5, res.message
    # after the timing, the repeat_speed probe may still find the memo (it repeats the timed inputs, where
    # the memo still holds them); nothing else may refuse it
    assert res.status.value == "ok" or "repeated earlier calls" in res.message, res.message
