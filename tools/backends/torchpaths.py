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


def jit_cflags() -> list[str]:
    """The flags torch.utils.cpp_extension.load_inline gives the C++ compiler for a CPU module, less its include folders
    and the module's name: read from the build.ninja torch's own writer writes (a private function, so its cflags line
    is parsed rather than its code copied; torch 2.13: -DTORCH_API_INCLUDE_EXTENSION_H -fPIC -std=c++20). Raises where
    this torch's writer cannot be asked."""
    import shlex
    import tempfile

    from torch.utils import cpp_extension as ce
    with tempfile.TemporaryDirectory(prefix="agent-jit-flags-") as d:
        path = Path(d) / "build.ninja"
        ce._write_ninja_file_to_build_library(path=str(path), name="agent_probe", sources=[str(Path(d) / "main.cpp")],
                                              extra_cflags=[], extra_cuda_cflags=[], extra_sycl_cflags=[],
                                              extra_ldflags=[], extra_include_paths=[], with_cuda=False,
                                              with_sycl=False, is_standalone=False)
        line = next(ln for ln in path.read_text().splitlines() if ln.startswith("cflags = "))
    words, out, skip = shlex.split(line[len("cflags = "):]), [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("-isystem", "-I"):
            skip = True
        elif not (w.startswith(("-I", "-isystem")) or w.startswith("-DTORCH_EXTENSION_NAME=")):
            out.append(w)
    return out


def _asked() -> dict:
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths
    try:
        jit, how = jit_cflags(), "torch's writer"
    except Exception as e:  # noqa: BLE001 (a private function of torch's: another version may differ)
        jit, how = None, f"{type(e).__name__}: {str(e)[:200]}"
    return {"include": list(include_paths("cpu")) + [sysconfig.get_paths()["include"]],
            "lib": list(library_paths("cpu")), "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
            "jit_cflags": jit, "jit_cflags_from": how}


def _kept_or_asked() -> dict:
    from tools.backends.pch import cache_root
    ident = _identity()
    if ident is None:          # no torch (its ImportError, as the callers expect), or one without a version file:
        return _asked()        # asked, never kept under an identity that another install could match
    path = cache_root() / "torch-paths.json"
    try:
        kept = json.loads(path.read_text())
        if kept.get("identity") == ident and all(k in kept for k in ("include", "lib", "cxx11_abi", "jit_cflags")):
            return kept
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    got = _asked()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"identity": ident, **got}))
        os.replace(tmp, path)
    except OSError:
        pass          # an unwritable cache: asked again next time, never a failed build
    return got


def torch_cpu_paths() -> tuple[list[str], list[str], int]:
    """(include folders, library folders, _GLIBCXX_USE_CXX11_ABI) for a CPU build against this interpreter's torch;
    raises ImportError where torch is not installed."""
    got = _kept_or_asked()
    return got["include"], got["lib"], int(got["cxx11_abi"])


def torch_jit_cflags() -> list[str]:
    """load_inline's own C++ flags for this interpreter's torch (jit_cflags), kept beside its folders; raises
    ImportError where torch is not installed and ValueError where its writer could not be asked (said, not guessed)."""
    got = _kept_or_asked()
    if got.get("jit_cflags") is None:
        raise ValueError(f"torch's load_inline flags could not be read ({got.get('jit_cflags_from')}): build.defaults "
                         "= \"load_inline\" needs them; set build.defaults = \"agent\" and the flags by hand")
    return list(got["jit_cflags"])
