"""torch's include and library folders and its C++ ABI, as torch.utils.cpp_extension gives them to its own builds,
without importing torch in the agent where an earlier process already asked.

Importing torch costs 1.2-1.5 s of CPU on a 2-core machine, and the agent itself needs nothing of torch but these
folders to write a torch extension's build (every `agent check`, `optimize` and `sweep` of one paid it again; the
judges import torch in their own processes). They are asked once per torch install and kept in
$AGENT_CACHE/torch-paths.json, keyed on where torch is (found without importing it), its version file's size and
mtime (a reinstall changes them) and the interpreter; any other answer is asked again."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path


def _identity() -> dict | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    root = Path(spec.origin).resolve().parent
    try:
        st = (root / "version.py").stat()
    except OSError:
        return None
    return {"torch": str(root), "version_py": [st.st_size, st.st_mtime_ns], "python": sys.executable,
            "python_include": sysconfig.get_paths()["include"]}


def _asked() -> dict:
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths
    return {"include": list(include_paths("cpu")) + [sysconfig.get_paths()["include"]],
            "lib": list(library_paths("cpu")), "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}


def torch_cpu_paths() -> tuple[list[str], list[str], int]:
    """(include folders, library folders, _GLIBCXX_USE_CXX11_ABI) for a CPU build against this interpreter's torch;
    raises ImportError where torch is not installed."""
    from tools.backends.pch import cache_root
    ident = _identity()
    if ident is None:          # no torch (its ImportError, as the callers expect), or one without a version file:
        got = _asked()         # asked, never kept under an identity that another install could match
        return got["include"], got["lib"], got["cxx11_abi"]
    path = cache_root() / "torch-paths.json"
    try:
        kept = json.loads(path.read_text())
        if kept.get("identity") == ident:
            return kept["include"], kept["lib"], int(kept["cxx11_abi"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    got = _asked()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"identity": ident, **got}))
        os.replace(tmp, path)
    except OSError:
        pass          # an unwritable cache: asked again next time, never a failed build
    return got["include"], got["lib"], got["cxx11_abi"]
