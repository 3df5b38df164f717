"""The CUDA adversaries of issue 40 (tests/fixtures/cuda_cheats/softmax/ and attention/, a README.md in each) compile on
CI: each is a whole-file rewrite of its task's kernel (kernels/softmax/softmax.cu, kernels/attention_fwd/attention.cu)
that the task still loads (its knob lines kept), that nvcc builds through the product's own build (tools/build), and
whose library answers its launch plan. The softmax ones run on the GPU through the real loop in
scripts/device/verify_gpu.py (VERIFICATION.md names what catches each); the attention ones are not run on a GPU yet
(their README says so)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from tests.userrepo import one_fast
from tools.build.build import build, find_nvcc
from tools.task import load_task

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "tests" / "fixtures" / "cuda_cheats" / "softmax"
NAMES = sorted(p.stem for p in CHEATS.glob("*.cu"))
ATTENTION = ROOT / "tests" / "fixtures" / "cuda_cheats" / "attention"
ATT_NAMES = sorted(p.stem for p in ATTENTION.glob("*.cu"))
FIRST = r"// CHEAT \((range|precision|memcheck|race|shared-state|output-state|stale-input), issue (40|66)\): "


def test_every_adversary_says_what_it_is_and_is_in_the_device_run():
    import re
    verify = (ROOT / "scripts" / "device" / "verify_gpu.py").read_text()
    readme = (CHEATS / "README.md").read_text()
    assert len(NAMES) >= 6
    for name in NAMES:
        first = (CHEATS / f"{name}.cu").read_text().splitlines()[0]
        assert re.match(FIRST, first), (name, first)
        assert f"`{name}.cu`" in readme, name
        assert f'"{name}"' in verify, name   # run through the loop on the device


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", one_fast(*NAMES))      # 19 nvcc builds, 2.5-3.4 s each: one between commits
def test_the_adversary_builds_and_answers_its_plan(tmp_path, name):
    d = tmp_path / "softmax"
    shutil.copytree(ROOT / "kernels" / "softmax", d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CHEATS / f"{name}.cu", d / "softmax.cu")
    task = load_task(d)    # the knob lines are still there
    res = build(task, tmp_path / "b")
    assert res.status.value == "ok", res.message
    lib = ctypes.CDLL(res.lib_path)
    buf = (ctypes.c_int * 7)()
    assert lib.softmax_plan(8192, 4096, 0, buf, 1) == 1
    assert buf[0] > 0 and buf[3] > 0


def test_every_attention_adversary_says_what_it_is():
    import re
    readme = (ATTENTION / "README.md").read_text()
    # run on a GPU through the loop by the script the README names (VERIFICATION.md has what caught each)
    assert len(ATT_NAMES) >= 9 and "scripts/device/verify_attention.py" in readme
    assert (ROOT / "scripts" / "device" / "verify_attention.py").is_file()
    for name in ATT_NAMES:
        first = (ATTENTION / f"{name}.cu").read_text().splitlines()[0]
        assert re.match(FIRST, first), (name, first)
        assert f"`{name}.cu`" in readme, name


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ATT_NAMES)
def test_the_attention_adversary_builds_and_answers_its_plan(tmp_path, name):
    d = tmp_path / "attention_fwd"
    shutil.copytree(ROOT / "kernels" / "attention_fwd", d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ATTENTION / f"{name}.cu", d / "attention.cu")
    task = load_task(d)    # the knob lines are still there, their values within the task's lists and restrictions
    res = build(task, tmp_path / "b")
    assert res.status.value == "ok", res.message
    lib = ctypes.CDLL(res.lib_path)
    buf = (ctypes.c_int * 14)()
    n = lib.attention_fwd_plan(32, 8, 512, 64, 0, buf, 2)
    assert 1 <= n <= 2 and buf[0] > 0 and buf[3] > 0
