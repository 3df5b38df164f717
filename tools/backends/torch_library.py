"""Extensions that register their ops with TORCH_LIBRARY: each build under a namespace of its own.

A torch extension may define its ops with `TORCH_LIBRARY(myops, m) { m.def("forward", &forward); }` (and
`TORCH_LIBRARY_IMPL(myops, CPU, m)`, `TORCH_LIBRARY_FRAGMENT`) instead of a pybind11 module; the user
calls `torch.ops.myops.forward`. The judge's host loads the best build and a candidate side by side in
one process, and torch's dispatcher takes one TORCH_LIBRARY per namespace per process: the second load
would fail in its static initializer (and take the process down). So each build registers under
`myops_<suffix>`, the suffix chosen by the loader at load time, not at compile time: the binding object
is compiled once and linked into every candidate (tools.build.reuse), so the name cannot be baked into it.

How: the compile of a source that uses those macros gets `-include` of a header made here from the
installed torch/library.h: it includes that header, then redefines the macros whose namespace
argument is turned into a string (`#ns`, `C10_STRINGIZE(ns)`) so that the string goes through
`agent_torch_library::ns_of`, which appends `_` and $AGENT_TORCH_OPS_SUFFIX when the variable is set
(tools.backends.backend sets it around the dlopen only) and returns the name unchanged otherwise (the same
library loaded by the user's own code registers `myops`). The catch-all namespace `_` (fallbacks) is
left alone. The header is content-addressed under $AGENT_CACHE/torch_library/KEY/: every build with
the same torch shares its path, so a compile line does not change between builds. The redefined macros
also catch what a registration throws (torch throws from the static initializer, which would end the
process) and keep it for the loader: `agent_torch_library_error()`, read after the dlopen.

Not renamed: a `torch::Library` built by hand, `STABLE_TORCH_LIBRARY` (torch/csrc/stable), and a
schema that names its namespace (`m.def("myops::forward(Tensor x) -> Tensor")`: torch refuses it under
the renamed library, and the load says so).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tools.backends.pch import cache_root, strip_comments

ENV = "AGENT_TORCH_OPS_SUFFIX"
HEADER_NAME = "agent_torch_library.h"

_USES = re.compile(r"\b(?:TORCH_LIBRARY|TORCH_LIBRARY_FRAGMENT|TORCH_LIBRARY_IMPL)\s*\(")
_DEFINES_NS = re.compile(r"\b(?:TORCH_LIBRARY|TORCH_LIBRARY_FRAGMENT)\s*\(\s*([A-Za-z_]\w*)\s*,")
# a macro of torch/library.h whose body stringizes its namespace argument
_MACRO = re.compile(r"^#define[ \t]+(_?TORCH_LIBRARY\w*)\((ns\b[^)]*)\)((?:[^\n]*\\\n)*[^\n]*)$", re.M)
_STRINGIZED = re.compile(r"(?<!#)#\s*ns\b|\bC10_STRINGIZE\(\s*ns\s*\)")


def uses_torch_library(text: str) -> bool:
    return bool(_USES.search(strip_comments(text)))


def namespaces(text: str) -> list[str]:
    """The namespaces a source defines ops in (TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT), in order."""
    out: list[str] = []
    for ns in _DEFINES_NS.findall(strip_comments(text)):
        if ns not in out and ns != "_":
            out.append(ns)
    return out


def shim_text(library_h: str) -> str:
    """The forced-include header for this torch/library.h's text. Raises ValueError where the macros
    cannot be renamed (a torch whose TORCH_LIBRARY does not stringize `ns`)."""
    redefined, body = [], []
    for m in _MACRO.finditer(library_h):
        name, params, text = m.groups()
        if not _STRINGIZED.search(text):
            continue
        text = _STRINGIZED.sub(lambda s: f"::agent_torch_library::ns_of({s.group(0)})", text)
        text = text.replace("torch::detail::TorchLibraryInit", "::agent_torch_library::Guarded<torch::detail::TorchLibraryInit>")
        redefined.append(name)
        body += [f"#undef {name}", f"#define {name}({params}){text}"]
    if "TORCH_LIBRARY" not in redefined or not any("IMPL" in n for n in redefined):
        raise ValueError("torch/library.h defines no TORCH_LIBRARY and TORCH_LIBRARY_IMPL that name their namespace "
                         "with #ns: this torch's extensions cannot be renamed per build")
    return "\n".join([
        "// Made by kernel-agent (tools/backends/torch_library.py) from this torch's torch/library.h: the same macros,",
        f"// with the namespace string passed through ns_of, which appends _${ENV} while the agent loads a build.",
        "#pragma once",
        "#include <torch/library.h>",
        "#include <cstdlib>",
        "#include <cstring>",
        "#include <exception>",
        "#include <memory>",
        "#include <string>",
        "#include <utility>",
        "namespace agent_torch_library {",
        "// A registration that throws (a schema naming another namespace, a bad schema) would throw out of a",
        "// static initializer: std::terminate, the process gone. Guarded keeps the first error for the loader.",
        '__attribute__((visibility("hidden"))) inline std::string& first_error() { static std::string e; return e; }',
        "template <class T> struct Guarded {",
        "  std::unique_ptr<T> held;",
        "  template <class... A> Guarded(A&&... a) {",
        "    try { held.reset(new T(std::forward<A>(a)...)); }",
        "    catch (const std::exception& e) { if (first_error().empty()) first_error() = e.what(); }",
        '    catch (...) { if (first_error().empty()) first_error() = "a registration threw"; }',
        "  }",
        "};",
        "static inline const char* ns_of(const char* ns) {",
        f'  const char* suffix = std::getenv("{ENV}");',
        '  if (suffix == nullptr || *suffix == 0 || std::strcmp(ns, "_") == 0) return ns;',
        "  // kept for the process's life: a lazily initialized torch::Library holds the pointer",
        '  return (new std::string(std::string(ns) + "_" + suffix))->c_str();',
        "}",
        "}  // namespace agent_torch_library",
        'extern "C" __attribute__((used, visibility("default"))) inline const char* agent_torch_library_error() {',
        "  return agent_torch_library::first_error().c_str();",
        "}",
        *body, ""])


def library_header(include_dirs: list[str]) -> Path | None:
    return next((Path(d) / "torch" / "library.h" for d in include_dirs if (Path(d) / "torch" / "library.h").is_file()),
                None)


def ensure_shim(include_dirs: list[str]) -> Path:
    """The forced-include header for the torch whose headers are in `include_dirs`, written once per
    torch (content-addressed, atomically). Raises ValueError or OSError with the reason it cannot."""
    lib = library_header(include_dirs)
    if lib is None:
        raise ValueError("no torch/library.h among torch's include folders")
    text = shim_text(lib.read_text(errors="replace"))
    folder = cache_root() / "torch_library" / hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / HEADER_NAME
    if not (path.is_file() and path.read_text() == text):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{HEADER_NAME}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, path)
    return path
