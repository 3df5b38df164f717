"""The README's promise: "Each instrument also works alone and prints JSON: `python -m tools.build
kernels/TASK --json`, likewise tools.measure.launch, tools.measure.parity, tools.measure.bench,
tools.profile". Each is run as written on the CPU task, from the README's own list (so a renamed
module or a flag one of them does not take fails here: `python -m tools.profile kernels/TASK --json`
exited 2, `unrecognized arguments`, and wanted a --lib)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.userrepo import REPO
from tools.backends.toolchain import find_cxx, find_ninja


def _readme_instruments() -> list[str]:
    text = " ".join((REPO / "README.md").read_text().split())
    m = re.search(r"Each instrument also works alone and prints JSON: `python -m (tools\.\w+) kernels/TASK --json`, "
                  r"likewise ((?:`tools\.[\w.]+`(?:, )?)+)", text)
    assert m, "README.md no longer says how the instruments run alone"
    return [m.group(1)] + re.findall(r"`(tools\.[\w.]+)`", m.group(2))


def test_the_readme_lists_every_instrument():
    assert _readme_instruments() == ["tools.build", "tools.measure.launch", "tools.measure.parity",
                                     "tools.measure.bench", "tools.profile"]


@pytest.mark.slow
@pytest.mark.parametrize("module", _readme_instruments())
def test_each_instrument_runs_alone_as_the_readme_says_and_prints_json(module, tmp_path):
    if not (find_cxx() and find_ninja()):
        pytest.skip("no C++ compiler or ninja here")
    task = tmp_path / "matmul_cpu"   # a copy outside any repository: its build goes beside it, not in runs/
    shutil.copytree(REPO / "kernels" / "matmul_cpu", task, ignore=shutil.ignore_patterns("__pycache__"))
    tmp = tmp_path / "tmp"   # the instrument's own temporary folder: it leaves nothing there (a build was left)
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(tmp)}
    res = subprocess.run([sys.executable, "-m", module, str(task), "--json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=env)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    # nothing but the judges' shared scratch folder, emptied (tools/isolation/scratch.py removes each child's own)
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert left in ([], ["kernel-agent-scratch"]), left
    got = json.loads(res.stdout)
    first = got[0] if isinstance(got, list) else got
    assert isinstance(first, dict) and first, res.stdout[:500]
    if module == "tools.profile":
        # its one failure here, and the status that says why (tools/profile/ncu.py: Nsight Compute profiles CUDA
        # kernels, and this is the CPU task; tools/profile/__main__.py: 1 for a failure status): any other 1 is a bug
        assert (res.returncode, first["status"]) == (1, "error"), (res.returncode, res.stdout[:500], res.stderr[-2000:])
        assert "runs on the cpu: Nsight Compute profiles CUDA kernels" in first["message"], first["message"]
    else:
        # the CPU task builds, launches, matches and times: each of the others answers 0 (1 is a failure status)
        assert res.returncode == 0, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
