"""Issue 62, state left behind: threads a kernel leaves on a CPU after its calls returned (tools/judge/threads.py). The
parity before a keep asks the kernel's host for its idle threads; a kernel whose threads spin between calls, or go on
computing after a call returned, fails `side_effect`; a pool whose workers wait on a condition variable passes, named
as today. Real kernels, real g++, the judge and its host; the loop's run of the same: tests/test_verification.py."""

from __future__ import annotations

import shutil
import threading

import pytest

from tools.judge import threads
from tests.userrepo import one_fast

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not threads.names(), reason="needs g++ and /proc")


def test_a_spinning_thread_is_seen_and_a_waiting_one_is_not():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass
    waiter = threading.Thread(target=stop.wait, daemon=True)
    waiter.start()
    assert threads.running(settle_s=0.0, window_s=0.1) == []
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        # a longer window and a lower share than the judge's: on a loaded 2-core machine (CI beside another test run)
        # the spinner got under a third of a core in 0.1 s and was missed
        busy = threads.running(settle_s=0.0, window_s=0.4, share=0.1)
    finally:
        stop.set()
        spinner.join()
    assert [b["tid"] for b in busy][:1] == [spinner.native_id], busy
    assert busy[0]["cpu_ms"] >= busy[0]["window_ms"] / 20
    line = threads.describe(busy)
    assert f"thread {spinner.native_id}" in line and "kept running after its calls returned" in line
    assert threads.describe([{"tid": "x"}]).startswith("a thread the kernel started")   # the host's word, read with care


@pytest.mark.parametrize("name", one_fast("spin_pool", "clock_keeper", "background_check"))
def test_a_kernel_whose_thread_keeps_running_fails_before_a_keep(tmp_path, name):
    from tests.fixtures.cheats.cheats import source
    from tests.fixtures.cpu_faults.faults import compile_lib, make_task
    from tools.measure.parity import run_parity
    task, _ = make_task(tmp_path, "correct", hidden=0)
    lib = compile_lib(source(name), tmp_path / f"lib{name}.so")
    quick = run_parity(task, lib, seed=3, extent="quick")
    assert quick.status.value == "ok", quick.message      # right, and the loop's first parity does not ask
    res = run_parity(task, lib, seed=3)
    assert res.status.value == "side_effect", res.message
    assert "kept running after its calls returned" in res.message and "while nothing called the kernel" in res.message


def test_a_pool_that_waits_between_calls_passes_named(tmp_path):
    from tests.fixtures.cheats.cheats import source
    from tests.fixtures.cpu_faults.faults import compile_lib, make_task
    from tools.measure.parity import run_parity
    task, _ = make_task(tmp_path, "correct", hidden=0)
    res = run_parity(task, compile_lib(source("thread_pool"), tmp_path / "libpool.so"), seed=3)
    assert res.status.value == "ok", res.message
    assert "left 2 threads running after they returned" in res.message
