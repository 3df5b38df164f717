"""Issue 62, state left behind: a kernel that changes the calling thread's floating-point control state (flush-to-zero,
denormals-are-zero, the rounding mode) and returns without putting it back fails parity with `side_effect`, named; one
that sets it for its own loop and restores it passes. Real kernels, real g++, the judge and its host (tools/judge/)."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from tests.fixtures.cpu_faults.faults import make_task, source
from tools.judge.fpstate import describe
from tools.measure.parity import run_parity
from tools.results import ParityStatus

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
              pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                 reason="the kernels set MXCSR (x86-64)")]


def test_the_changes_are_named_in_words():
    start = {"mxcsr": 0x1F80, "x87": 0x037F}
    assert describe(start, dict(start)) is None
    assert describe(start, {**start, "mxcsr": 0x9FC0}) == ("flush-to-zero (FTZ) set, denormals-are-zero (DAZ) set, "
                                                           "MXCSR 0x1f80 -> 0x9fc0")
    assert describe(start, {**start, "mxcsr": 0x7F80}).startswith("SSE rounding to nearest -> toward zero")
    assert "a trap unmasked" in describe(start, {**start, "mxcsr": 0x1D80})
    assert describe(start, {**start, "x87": 0x0F7F}) == "x87 control word 0x037f -> 0x0f7f"


def test_the_gpus_device_wide_settings_are_named_in_words_and_absent_without_a_context():
    """tools/judge/devstate.py: the words a changed limit, cache preference or scheduling gets; here (no GPU context)
    nothing is read and nothing is named. The adversaries that change them run on the device
    (scripts/device/verify_gpu.py state_*)."""
    from tools.judge import devstate
    before = {"limit6": 0, "limit2": 8 << 20, "cache": 0, "sched": 0}
    assert devstate.describe(before, dict(before)) is None
    said = devstate.describe(before, {**before, "limit6": 32 << 20, "cache": 2, "sched": 1})
    assert said == ("the cache preference no preference -> prefer L1, the persisting L2 cache size 0 -> 33554432 bytes, "
                    "the context's scheduling auto -> spin"), said
    assert 0 not in devstate.LIMITS       # the driver raises the stack size itself: not the kernel's doing
    if devstate.snapshot() is None:       # a CPU machine, or no current context
        assert devstate.Watch().check("the kernel's calls") is None


@pytest.mark.parametrize("kernel, words", [
    ("ftz_left", "flush-to-zero (FTZ) set, denormals-are-zero (DAZ) set"),
    ("round_left", "SSE rounding to nearest -> toward zero"),
    ("ftz_on_load", "left by loading the library"),
])
def test_a_kernel_that_leaves_the_state_changed_fails_side_effect(tmp_path, kernel, words):
    """Its outputs are right (matmul of normal draws: no subnormal is near): only the state it leaves fails it."""
    task, lib = make_task(tmp_path, kernel)
    res = run_parity(task, lib, seed=7)
    assert res.status == ParityStatus.side_effect, (res.status, res.message)
    assert words in res.message and "floating-point state" in res.message, res.message
    assert all(c.ok for c in res.checks), "every output right: the state is what fails it"


def test_a_kernel_that_puts_the_state_back_passes(tmp_path):
    task, lib = make_task(tmp_path, "ftz_restored")
    res = run_parity(task, lib, seed=7)
    assert res.status == ParityStatus.ok, res.message


def test_fast_math_in_the_tasks_flags_builds_a_library_that_leaves_the_state_alone(tmp_path):
    """gcc before 13 links crtfastmath.o (FTZ/DAZ at load) into a shared library linked with -ffast-math or -Ofast:
    the build keeps those flags to the compile. The same source linked with -ffast-math by hand is refused, where this
    gcc links crtfastmath.o into a shared library (gcc 13 and later no longer do: then both pass)."""
    from tools.build.build import build
    from tools.task import load_task
    task, _ = make_task(tmp_path, "correct")
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text() + '\n[build]\nflags = ["-O2", "-ffast-math"]\n')
    task = load_task(task.root)
    b = build(task, tmp_path / "build")
    assert b.status.value == "ok", b.message
    link = [c for c in b.commands if " -shared" in c][-1]
    assert "-ffast-math" not in link and "-ffast-math" in " ".join(b.commands), b.commands
    assert run_parity(task, b.lib_path, seed=3).status == ParityStatus.ok
    by_hand = tmp_path / "libbyhand.so"
    cpp = tmp_path / "byhand.cpp"
    cpp.write_text(source("correct"))
    subprocess.run(["g++", "-O2", "-ffast-math", "-shared", "-fPIC", "-o", str(by_hand), str(cpp)], check=True)
    links_crtfastmath = "crtfastmath" in subprocess.run(
        ["g++", "-O2", "-ffast-math", "-shared", "-fPIC", "-o", str(tmp_path / "probe.so"), str(cpp), "-Wl,--trace"],
        capture_output=True, text=True).stdout
    res = run_parity(task, by_hand, seed=3)
    if links_crtfastmath:
        assert res.status == ParityStatus.side_effect and "left by loading the library" in res.message, res.message
    else:
        assert res.status == ParityStatus.ok, res.message
