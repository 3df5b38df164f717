"""The demo task through the whole profiler on a GPU (skipped without CUDA / ncu), and its
compile-only check with nvcc here (ptxas resources, the numbers the fallback relies on)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent / "fixtures" / "ncu" / "demo_task"


def build_demo(tmp: Path) -> tuple[Path, str]:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc")
    lib = tmp / "libscale.so"
    p = subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-Xptxas", "-v", "-o", str(lib),
                        str(DEMO / "scale.cu")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return lib, p.stderr


@pytest.mark.nvcc
def test_demo_task_compiles_and_ptxas_reports_resources(tmp_path):
    lib, log = build_demo(tmp_path)
    assert lib.is_file()
    m = re.search(r"Used (\d+) registers", log)
    assert m and 0 < int(m.group(1)) <= 255


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_small_grid_end_to_end(tmp_path):
    from tools.profile import ProfileStatus, profile_task
    from tools.profile.fallback import profile_fallback
    from tools.profile.model import Bottleneck
    from tools.task import load_task
    lib, _ = build_demo(tmp_path)
    task = load_task(DEMO)
    fb = profile_fallback(task, lib, shape=1)
    assert fb.status == ProfileStatus.fallback and fb.kernels[0].ctas == 2
    assert fb.kernels[0].bottleneck == Bottleneck.small_grid
    if not shutil.which("ncu"):
        pytest.skip("no ncu on PATH")
    rep = profile_task(task, lib, tier=1, shape=1, out_dir=tmp_path / "p", fallback=False)
    assert rep.status == ProfileStatus.ok, rep.message
    k = rep.kernels[0]
    assert k.ctas == 2 and k.bottleneck == Bottleneck.small_grid
    assert any(r.title == "Small Grid" for r in k.rules)
