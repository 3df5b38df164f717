"""The precompiled torch/extension.h of a one-file C++ extension (tools/backends/pch.py): which files take it,
the cache and its lock, a header that does not compile. A real one-file extension built with it, a second include
of torch/extension.h among its lines: tests/test_extension.py's end-to-end test, on `agent check`'s build."""

import threading
from pathlib import Path

import pytest

from tools.backends.pch import ensure, first_code_is_torch_extension, pch_sources
from tools.task import load_task
from tools.backends.toolchain import find_cxx


def test_only_a_file_whose_first_code_is_the_torch_include_takes_it():
    assert first_code_is_torch_extension("// my kernel\n/* a\n block */\n#pragma once\n\n#include <torch/extension.h>\nint x;")
    assert first_code_is_torch_extension("  #  include <torch/extension.h>  \n")
    assert not first_code_is_torch_extension("#include <vector>\n#include <torch/extension.h>\n")   # code before it
    assert not first_code_is_torch_extension("#define BLOCK 16\n#include <torch/extension.h>\n")  # a macro it may read
    assert not first_code_is_torch_extension('#include "torch/extension.h"\n#include <torch/extension.h>\n')
    assert not first_code_is_torch_extension("// only a comment\n")


def _ext_task(tmp_path: Path, text: str, editable: bool = True, name: str = "one.cpp"):
    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    (d / "k.cpp").write_text("int k() { return 1; }\n")
    (d / "task.py").write_text("import torch\ndef make_inputs(shape, seed, device, dist):\n    return (torch.ones(2),)\n"
                               "def reference(shape, x):\n    return x\ndef empty_output(shape, x):\n    return torch.empty(2)\n")
    (d / "task.toml").write_text(f'name = "t"\ndevice = "cpu"\nform = "torch_extension"\nsources = ["{name}", "k.cpp"]\n'
                                 f'editable = ["{name if editable else "k.cpp"}"]\nshapes = [{{ N = 2 }}]\n'
                                 "[tolerance.float32]\natol = 1e-4\nrtol = 1e-4\n")
    return load_task(d)


def test_the_files_that_take_it_are_editable_cpp_files_of_an_extension(tmp_path):
    body = "#include <torch/extension.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"
    assert pch_sources(_ext_task(tmp_path, body), tmp_path / "t") == ["one.cpp"]
    assert pch_sources(_ext_task(tmp_path, body, editable=False), tmp_path / "t") == []   # compiled once anyway
    # ... but it takes a cached one (tools.build.build asks ensure(make=False) for these)
    assert pch_sources(_ext_task(tmp_path, body, editable=False), tmp_path / "t", editable=False) == ["one.cpp"]
    assert pch_sources(_ext_task(tmp_path, body), tmp_path / "t", editable=False) == []
    assert pch_sources(_ext_task(tmp_path, body, name="one.cu"), tmp_path / "t") == []    # nvcc: no gcc PCH
    # a file left out of `editable` that includes the edited one (an imported KernelBench task's binding.cpp and its
    # kernel.cpp, load_inline's one unit) is compiled for every candidate: it makes one; the included file is no unit
    inc = "#include <torch/extension.h>\n#include \"k.cpp\"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"
    assert pch_sources(_ext_task(tmp_path, inc, editable=False), tmp_path / "t") == ["one.cpp"]
    assert pch_sources(_ext_task(tmp_path, inc, editable=False), tmp_path / "t", editable=False) == []
    assert pch_sources(_ext_task(tmp_path, inc.replace('"k.cpp"', '"k.cpp" // in a comment: "other.cpp"'),
                                 editable=False), tmp_path / "t") == ["one.cpp"]


def _fake_torch(tmp_path: Path, body: str) -> list[str]:
    inc = tmp_path / "inc"
    (inc / "torch").mkdir(parents=True)
    (inc / "torch" / "extension.h").write_text(body)
    return ["-O1", "-isystem", str(inc)]


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
def test_it_is_made_once_under_a_lock_and_then_taken_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    flags = _fake_torch(tmp_path, "#pragma once\ninline int twice(int x) { return 2 * x; }\n")
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(ensure(find_cxx(), flags, 60))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if "not gcc" in got[0].note:
        pytest.skip(got[0].note)
    assert all(g.include_dir == got[0].include_dir for g in got) and got[0].include_dir is not None
    assert sum("into" in g.note for g in got) == 1, [g.note for g in got]       # one compiled it, two waited
    gch = got[0].include_dir / "torch" / "extension.h.gch"
    assert gch.is_file() and not [p for p in gch.parent.iterdir() if p.name.startswith(".")]   # no temporary left
    again = ensure(find_cxx(), flags, 60)
    assert again.include_dir == got[0].include_dir and "from" in again.note
    assert ensure(find_cxx(), flags + ["-DOTHER=1"], 60).include_dir != got[0].include_dir   # other flags, other header


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
def test_a_file_compiled_once_takes_a_cached_header_and_never_makes_one(tmp_path, monkeypatch):
    """ensure(make=False), what a split extension's binding asks: nothing compiled and nothing written
    while the cache lacks the header; the header an editable file's build made, once there."""
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    flags = _fake_torch(tmp_path, "#pragma once\ninline int twice(int x) { return 2 * x; }\n")
    none = ensure(find_cxx(), flags, 60, make=False)
    if "not gcc" in none.note:
        pytest.skip(none.note)
    assert none.include_dir is None and "only an editable file makes one" in none.note
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*"))
    made = ensure(find_cxx(), flags, 60)
    if "not gcc" in made.note:
        pytest.skip(made.note)
    assert made.include_dir is not None
    assert ensure(find_cxx(), flags, 60, make=False).include_dir == made.include_dir


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
def test_a_header_that_does_not_compile_leaves_none_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    got = ensure(find_cxx(), _fake_torch(tmp_path, "#error this torch is broken\n"), 60)
    if "not gcc" in got.note:
        pytest.skip(got.note)
    assert got.include_dir is None and "this torch is broken" in got.note
    assert not list((tmp_path / "cache").rglob("*.gch*"))
    monkeypatch.setenv("AGENT_PCH", "0")
    assert ensure(find_cxx(), _fake_torch(tmp_path / "x", "int y;\n"), 60).note == "off (AGENT_PCH=0)"
