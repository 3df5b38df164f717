"""torch's build folders for the agent without importing torch (tools/backends/torchpaths.py): torch's own answer,
kept per torch install in $AGENT_CACHE, read back by a later process that then never imports torch, and asked again
where the kept answer is of another install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ASK = ("import json, sys; from tools.backends.torchpaths import torch_cpu_paths; got = torch_cpu_paths(); "
       "print(json.dumps({'paths': got, 'torch_imported': 'torch' in sys.modules}))")


def _ask(cache: Path) -> dict:
    env = {**os.environ, "AGENT_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", ASK], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_torchs_own_answer_kept_and_read_back_without_torch(tmp_path):
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths
    import sysconfig
    want = [list(include_paths("cpu")) + [sysconfig.get_paths()["include"]], list(library_paths("cpu")),
            int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))]
    first = _ask(tmp_path)
    assert first == {"paths": want, "torch_imported": True}          # asked: torch imported once
    again = _ask(tmp_path)
    assert again == {"paths": want, "torch_imported": False}         # read back: the agent's 1.2-1.5 s of CPU saved
    kept = tmp_path / "torch-paths.json"
    data = json.loads(kept.read_text())
    data["identity"]["version_py"] = [0, 0]                          # another install of torch at the same place
    data["include"] = ["/nowhere"]
    kept.write_text(json.dumps(data))
    assert _ask(tmp_path) == {"paths": want, "torch_imported": True}
    kept.write_text("{torn")                                         # a torn file: asked again, never an error
    assert _ask(tmp_path)["paths"] == want
