"""The bench's rounds on new values (issue 39, tools/measure/rounds.py): the rule on a round's repeats against
its first calls, in both directions, and the refill mirrored in the kernel's host."""

from __future__ import annotations

import random

from tests.fixtures.cpu_faults.faults import make_task
from tools.measure.rounds import REPEAT_RATIO, REPEAT_SLACK_MS, SpotCheck


def _spot(bursts: list[tuple[list[float], list[float]]]) -> SpotCheck:
    s = SpotCheck(None, None, None, {}, [(), ()], [], 6, random.Random(0))
    s.bursts = bursts
    return s


def test_a_rounds_repeats_much_faster_than_its_first_calls_are_suspicious_and_an_honest_spread_is_not():
    honest = [([0.70, 0.72], [0.69, 0.71, 0.70, 0.74, 0.70]) for _ in range(6)]
    # a load spike on the first calls of one round and a fast outlier in another: the median round decides
    honest[1] = ([1.9, 2.1], honest[1][1])
    honest[4] = (honest[4][0], [0.69, 0.30, 0.71])
    assert _spot(honest).repeats_why("M=1") is None
    # a memo lazy on most repeats, every round
    lazy = [([0.70, 0.72], [0.20, 0.21, 0.70, 0.20, 0.22]) for _ in range(6)]
    why = _spot(lazy).repeats_why("M=256")
    assert why is not None and why.startswith("M=256: in the timed rounds")
    assert "took 710 us, a call repeating one of them 210 us (3.4x in the median of 6 rounds" in why
    assert "did less work because they repeated earlier calls" in why
    # lazy on one repeat in five: the repeats' median, and so the reported one, is the honest kernel's
    assert _spot([([0.70, 0.72], [0.70, 0.71, 0.20, 0.70, 0.72])] * 6).repeats_why("x") is None
    # a tiny kernel's warm-up after a refill (2.2 us, its first call 3.1 us) is not laziness
    assert _spot([([0.0031], [0.0024, 0.0022, 0.0022, 0.0023])] * 6).repeats_why("x") is None
    # at the rule's edge: just under REPEAT_RATIO (after the slack) is not suspicious, just over is
    edge = REPEAT_RATIO * 0.25 + REPEAT_SLACK_MS
    assert _spot([([edge * 0.99], [0.2, 0.3])] * 4).repeats_why("x") is None
    assert _spot([([edge * 1.01], [0.2, 0.3])] * 4).repeats_why("x") is not None
    # no repeats (a burst no longer than its sets) or a single round: nothing to compare
    assert _spot([([0.7, 0.7], [])] * 6).repeats_why("x") is None
    assert _spot([([0.9], [0.1])]).repeats_why("x") is None


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


def test_an_exact_memo_lazy_on_repeats_is_suspicious_in_the_bench_and_the_honest_kernel_is_not(tmp_path):
    """Straight through run_bench (the judge and its host) on the small test task: an exact memo (right on
    every call) that recomputes a quarter of the rows on a repeat of the same buffers and values."""
    from tools.measure.bench import run_bench
    from tests.fixtures.cpu_faults.faults import compile_lib, source
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
    seen.push_back({A, B, C, std::vector<float>(A, A + mk), std::vector<float>(B, B + kn), std::vector<float>(C, C + mn)});
}
'''
    lazy = compile_lib(memo, tmp_path / "libmemo.so")
    shape = [{"M": 96, "N": 96, "K": 96}]
    [res] = run_bench(task, lazy, with_reference=False, shapes=shape)
    assert res.status.value == "suspicious" and "repeated earlier calls" in res.message, res.message
    [res] = run_bench(task, honest, with_reference=False, shapes=shape)
    assert res.status.value == "ok", res.message
