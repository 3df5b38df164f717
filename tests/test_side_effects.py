"""A kernel that writes files fails with the files named (issue 39), unless task.toml allows them by name;
through the judge (run_parity, run_bench) on the small CPU test task."""

from __future__ import annotations

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source


def _writer(tmp_path, name: str, after_calls: int = 0):
    """The task's kernel, plus a line appended to `name` on each call after the first `after_calls`."""
    src = source("correct").replace('extern "C" void matmul(', "static void matmul_impl(") + f'''
#include <cstdio>
static int calls = 0;
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {{
    matmul_impl(A, B, C, M, N, K);
    if (++calls > {after_calls})
        if (FILE* f = std::fopen("{name}", "a")) {{ std::fprintf(f, "%d %d %d\\n", M, N, K); std::fclose(f); }}
}}
'''
    return compile_lib(src, tmp_path / f"lib{name.replace('/', '_')}.so")


def test_a_kernel_that_writes_a_file_fails_parity_with_the_file_named(tmp_path):
    from tools.measure.parity import run_parity
    task, honest = make_task(tmp_path, "correct", hidden=0)
    assert run_parity(task, honest).status.value == "ok"
    for name in ("timing.log", "tmp/spill.bin"):
        res = run_parity(task, _writer(tmp_path, name))
        assert res.status.value == "side_effect", res.message
        assert f"the kernel wrote files in its working directory: {name} (" in res.message
        assert "allow_files" in res.message


def test_a_file_the_task_allows_by_name_is_not_a_failure_and_another_still_is(tmp_path):
    from tools.measure.parity import run_parity
    from tools.task import load_task
    task, _ = make_task(tmp_path, "correct", hidden=0)
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace("[parity]\n", '[parity]\nallow_files = { "tune-*.txt" = "the '
                                             'autotuner\'s cache, read back by the next process" }\n'))
    task = load_task(task.root)
    assert task.spec.parity.allow_files == {"tune-*.txt": "the autotuner's cache, read back by the next process"}
    assert run_parity(task, _writer(tmp_path, "tune-matmul.txt")).status.value == "ok"
    res = run_parity(task, _writer(tmp_path, "debug.log"))
    assert res.status.value == "side_effect" and "debug.log" in res.message, res.message


def test_a_kernel_that_writes_only_while_timed_fails_the_bench(tmp_path):
    from tools.measure.bench import run_bench
    task, _ = make_task(tmp_path, "correct", hidden=0, rounds=2)
    [res] = run_bench(task, _writer(tmp_path, "late.log", after_calls=200), with_reference=False)
    assert res.status.value == "side_effect", res.message
    assert "late.log" in res.message and res.timings, "the figures are still reported beside the reason"


def test_threads_a_call_leaves_running_are_named_and_not_refused(tmp_path):
    """An honest kernel with a pool of two worker threads kept between calls (as an OpenMP runtime keeps
    its own): parity passes and its line names the threads the calls left running."""
    from tests.fixtures.cheats.cheats import source as cheat_source
    from tools.measure.parity import run_parity
    task, honest = make_task(tmp_path, "correct", hidden=0)
    assert "left" not in run_parity(task, honest).message
    res = run_parity(task, compile_lib(cheat_source("thread_pool"), tmp_path / "libpool.so"))
    assert res.status.value == "ok", res.message
    assert "the kernel's calls left 2 threads running after they returned" in res.message, res.message


def test_a_batch_names_the_library_that_wrote_the_file_and_not_the_ones_after_it(tmp_path):
    """The sweep's and `agent check --knobs`'s batch child (tools/judge/batch.py): three libraries in one host, the
    middle one writing a file. Parity-only and with the bench: the writer fails as side_effect, the honest library
    after it, which finds the file already there, passes."""
    from tools.judge.batch import evaluate
    task, honest = make_task(tmp_path, "correct", hidden=0)
    libs = [honest, _writer(tmp_path, "timing.log"), honest]
    for parity_only in (True, False):
        got = dict(i_r for settled in evaluate(task, libs, honest, parity_only=parity_only) for i_r in settled)
        assert [got[i].status.value for i in range(3)] == ["ok", "parity_failed", "ok"], [got[i].message for i in got]
        assert "the kernel wrote files in its working directory: timing.log (" in got[1].message
        assert got[1].parity.status.value == "side_effect"
