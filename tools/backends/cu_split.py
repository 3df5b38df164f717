"""The seeds' one-file CUDA extension split, for the build only, into its kernels and its torch code.

The user's extension in one .cu (`#include <torch/extension.h>`, the kernels, a launcher taking
torch::Tensor, PYBIND11_MODULE) costs 42-63 s a rebuild on the H200: nvcc's three front ends
(cudafe++, cicc, the host gcc) each read torch's headers again, and no precompiled header reaches
them (BENCHMARKS.md, "Where a rebuild's seconds go"). The file stays the user's, and the one the
agent edits and commits; the build compiles two files made from it instead:

- X.kernels.cu: every top-level item but the torch code (kernels, device functions, types, macros),
  with no torch header: nvcc, 1-2 s. At its end one accessor per launch site returns the kernel's
  address (`extern "C" const void* agent_cu_split_fn_N()`), so a template kernel is instantiated here.
- X.host.cpp: the torch code (items naming torch, at, c10, py, pybind11, Tensor, TORCH_/AT_/C10_/
  PYBIND11_ macros), a declaration of each kernel it launches, and copies of what else it names (types,
  constexpr values, inline functions, the #defines it reads). Each `k<<<grid, block, smem, stream>>>(args)`
  becomes a call of cudaLaunchKernel with the kernel's address and the arguments converted to the
  kernel's parameter types, what nvcc's own launch stub does. g++ compiles it with tools.backends.pch's
  precompiled torch/extension.h where the file starts with that include; its object is kept by the
  text that made it (tools.build.build), so a candidate that leaves the torch code and the macros it reads
  alone does not compile it again.

`#line` directives keep the user's file and line numbers in every error. The split is refused (and
the file built whole, as before) where it could change what the program means: device code naming
torch, a non-inline function or a variable that both halves use, a kernel named other than in a
launch where only the launch can reach it. A split that does not compile is built whole too
(tools.build.build), so the worst case is today's 42 s, never a wrong build.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tools.backends.cu_scan import IDENT, TORCH_INCLUDE, Item, Launch, directive, duplicable, launches_in, scan

# headers only nvcc's device pass wants: the torch code never needs them, and kept in the host half
# they would drag the knobs that guard them (`#if USE_TENSOR_CORES`) into its text
_DEVICE_HEADER = re.compile(r'#\s*include\s*[<"](?:mma\.h|cooperative_groups|cuda/|cub/|cute/|cutlass/|cuda_pipeline'
                            r'|sm_\d+_intrinsics|crt/)')
_COND_OPEN, _COND_MID, _COND_CLOSE = ("if", "ifdef", "ifndef"), ("elif", "else", "elifdef", "elifndef"), ("endif",)
_STRIP_DECL = re.compile(r"\b(?:__global__|__launch_bounds__\s*\([^()]*\)|__maxnreg__\s*\([^()]*\)|"
                         r"__cluster_dims__\s*\([^()]*\)|__grid_constant__|static|inline|__forceinline__|__noinline__)\s*")
# what a template argument of a launch may name besides the file's own macros and declarations
_BUILTIN = {"int", "unsigned", "signed", "long", "short", "char", "bool", "float", "double", "void", "true", "false",
            "size_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "half",
            "__half", "half2", "__half2", "__nv_bfloat16", "__nv_bfloat162", "nv_bfloat16", "float2", "float4", "int4",
            "sizeof", "const", "std"}
_COMPILER_MACROS = re.compile(r"\b__(?:CUDA|NVCC|NVCOMPILER)\w*|\b__(?:LINE|COUNTER)__\b")
PREFIX = "agent_cu_split"


@dataclass
class Split:
    kernels: str                   # X.kernels.cu
    host: str                      # X.host.cpp
    launches: int


@dataclass
class NoSplit:
    reason: str


def _drop_empty_groups(seq: list[tuple[Item, str]]) -> list[tuple[Item, str]]:
    """Conditional groups (#if ... #endif) that hold nothing else of this half are left out."""
    changed = True
    while changed:
        changed, out, i = False, [], 0
        while i < len(seq):
            it, _ = seq[i]
            if it.kind == "pp" and directive(it) in _COND_OPEN:
                j, only_conds = i + 1, True
                while j < len(seq) and not (seq[j][0].kind == "pp" and directive(seq[j][0]) in _COND_OPEN + _COND_CLOSE):
                    only_conds &= seq[j][0].kind == "pp" and directive(seq[j][0]) in _COND_MID
                    j += 1
                if only_conds and j < len(seq) and directive(seq[j][0]) in _COND_CLOSE:
                    i, changed = j + 1, True
                    continue
            out.append(seq[i])
            i += 1
        seq = out
    return seq


def _line(n: int, path: str) -> str:
    return f'#line {n} "{path}"\n'


def split(text: str, path: str) -> Split | NoSplit:
    """The two files made from a one-file extension's text (`path`: the name errors give), or why not."""
    items = scan(text)
    code = [it for it in items if it.kind == "code"]
    host = {id(it) for it in code if it.torch}
    if not host:
        return NoSplit("no torch code (nothing names torch, at, c10, pybind11 or Tensor)")
    for it in code:
        if it.torch and it.device:
            what = ", ".join(sorted(it.names)) or f"line {it.line}"
            return NoSplit(f"{path}:{it.line}: {what} is __{it.device}__ code that names torch's types")
    launches = {id(it): launches_in(it.masked, it.text) for it in code if id(it) in host}
    if any("<<<" in it.masked and not launches[id(it)] for it in code if id(it) in host):
        return NoSplit("a <<<...>>> launch the split cannot read")
    seen = _BUILTIN | set().union(*(it.names for it in items if id(it) not in host))
    for it in code:
        for ln in launches.get(id(it), []):
            if foreign := sorted(set(IDENT.findall(ln.callee.partition("<")[2])) - seen):
                return NoSplit(f"{path}:{it.line + it.text.count(chr(10), 0, ln.start)}: the launch of {ln.callee} takes "
                               f"{', '.join(foreign)} from the torch code (as AT_DISPATCH's scalar_t): the kernels' half "
                               "cannot instantiate it")
    named = set()             # what the torch code names outside its launches' kernel names
    for it in code:
        if id(it) in host:
            m = it.masked
            for ln in launches[id(it)]:
                m = m[:ln.start] + " " * len(ln.callee) + m[ln.start + len(ln.callee):]
            named |= set(IDENT.findall(m))
    ident = lambda s: set(IDENT.findall(s))  # noqa: E731
    need = set().union(*(ident(it.masked) for it in code if id(it) in host))
    declared, copied, moved = set(), set(), set()
    cond_idents: set[str] = set()
    while True:
        before = (len(need), len(declared), len(copied), len(moved))
        for it in code:
            if id(it) in host or not (it.names & need) or id(it) in declared | copied | moved:
                continue
            name = ", ".join(sorted(it.names & need))
            if re.match(r"\s*(?:(?:inline\s+)?namespace\b|extern\s*{)", it.masked):
                return NoSplit(f"{path}:{it.line}: the torch code names {name}, in a namespace or extern \"C\" block, "
                               "which the split does not take apart")
            has_body = "{" in it.masked and not re.match(r"\s*(?:template\s*<[^;{]*>\s*)?(?:struct|class|union|enum)\b",
                                                              it.masked)
            is_fn = "(" in it.masked.split("{", 1)[0].split("=", 1)[0]
            if it.device == "global":
                if re.search(r"\btemplate\b|\bstatic\b", it.masked.split("(", 1)[0]) and it.names & named:
                    return NoSplit(f"{path}:{it.line}: the torch code names {'template' if 'template' in it.masked.split('(', 1)[0] else 'static'} "
                                   f"kernel {name} outside a launch")
                declared.add(id(it))
                need |= ident(_declaration(it))
            elif it.device and not re.search(r"\b__host__\b", it.masked.split("{", 1)[0]):
                return NoSplit(f"{path}:{it.line}: the torch code names {name}, __{it.device}__ on the GPU only")
            elif is_fn and has_body and "<<<" in it.masked or is_fn and has_body and not duplicable(it):
                if re.search(r"\bstatic\b|\btemplate\b", it.masked.split("(", 1)[0]):
                    return NoSplit(f"{path}:{it.line}: the torch code calls {name}, a static or template function that "
                                   "launches kernels (the host half cannot reach it)")
                declared.add(id(it))                       # defined in the kernels' half, declared in the host's
                need |= ident(_declaration(it))
            elif duplicable(it) or is_fn:
                copied.add(id(it))
                need |= ident(it.masked)
            elif not any(it.names & ident(o.masked) for o in code if o is not it and id(o) not in host | moved):
                moved.add(id(it))
                need |= ident(it.masked)
            else:
                return NoSplit(f"{path}:{it.line}: {name} is a variable both the kernels and the torch code use "
                               "(two copies would be two objects)")
        seq = _host_seq(items, host, declared, copied, moved, need)
        cond_idents = set().union(*(ident(it.masked.split(None, 1)[-1]) for it, _ in seq
                                    if it.kind == "pp" and directive(it) in _COND_OPEN + _COND_MID))
        need |= cond_idents
        for it in items:
            if it.kind == "pp" and it.names & need:
                need |= ident(it.masked)
        if before == (len(need), len(declared), len(copied), len(moved)):
            break
    seq = _host_seq(items, host, declared, copied, moved, need)
    if why := _compiler_dependent(seq, Path(path).parent):
        return NoSplit(why)
    return _emit(items, host, declared, copied, moved, need, launches, path)


def _compiler_dependent(seq: list[tuple[Item, str]], folder: Path) -> str:
    """Why the torch half would mean something else compiled by the C++ compiler than by nvcc, as the
    user's own build compiles it: its code, or a header of the user's it includes (followed), tests
    nvcc's macros (`#ifdef __CUDACC__`, __CUDA_ARCH__, the __CUDA_NO_HALF_* flags torch gives nvcc) or
    reads __LINE__/__COUNTER__ (the half keeps its object while only its line numbers move). The judged
    build would not be the build the user gets: the split is refused."""
    todo = [(it.line, "", folder, it.masked if it.kind == "code" else it.text) for it, role in seq if role != "decl"]
    seen: set[Path] = set()
    while todo:
        line, where, here, text = todo.pop()
        if m := _COMPILER_MACROS.search(re.sub(r"(?m)^#line .*$", "", text)):
            return f"{where or 'line ' + str(line)}: the torch code reads {m.group(0)}, which the C++ compiler and nvcc " \
                   "set differently (or which moves with the file's lines)"
        for q, inc in re.findall(r'(?m)^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', text):
            # "x.h" beside the includer or in the task's folder; <x.h> there too (the build passes -I for it)
            h = next((c.resolve() for c in ([here / inc] if q == '"' else []) + [folder / inc] if c.is_file()), None)
            if h is not None and h not in seen:
                seen.add(h)
                todo.append((0, str(Path(where).parent / inc) if where else inc, h.parent, h.read_text(errors="replace")))
    return ""


def _declaration(it: Item) -> str:
    head = it.text.split("{", 1)[0] if "{" in it.masked else it.text.rstrip().rstrip(";")
    return _STRIP_DECL.sub("", head).strip() + ";"


def _host_seq(items, host, declared, copied, moved, need) -> list[tuple[Item, str]]:
    """The host half's items in order, each with its role."""
    seq = []
    for it in items:
        if it.kind == "code":
            role = ("torch" if id(it) in host else "decl" if id(it) in declared else
                    "copy" if id(it) in copied | moved else "")
        elif re.match(r"#\s*include\b", it.masked):
            role = "" if _DEVICE_HEADER.match(it.text) else "pp"
        elif re.match(r"#\s*(?:define|undef)\b", it.masked):
            role = "pp" if it.names & need else ""
        else:
            role = "pp" if directive(it) in _COND_OPEN + _COND_MID + _COND_CLOSE else ""
        if role:
            seq.append((it, role))
    return _drop_empty_groups(seq)


_PROLOGUE = f"""#include <cuda_runtime.h>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
namespace {PREFIX} {{
// what nvcc's launch stub does for a triple-chevron launch: the arguments converted to
// the kernel's parameter types, their addresses handed to cudaLaunchKernel with the kernel's address
struct Config {{
  dim3 grid, block; size_t smem; cudaStream_t stream;
  Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {{}}
}};
template <class... P, class... A>
inline void launch(const void* fn, void (*)(P...), const Config& c, A&&... a) {{
  std::tuple<std::decay_t<P>...> v(std::forward<A>(a)...);
  std::apply([&](auto&... x) {{
    void* args[] = {{static_cast<void*>(&x)..., nullptr}};
    cudaLaunchKernel(fn, c.grid, c.block, args, c.smem, c.stream);
  }}, v);
}}
}}  // namespace {PREFIX}
// cuda_runtime.h's C++ forms that take the kernel itself, declared for nvcc only: as nvcc gives them
template <class T> inline cudaError_t cudaFuncSetAttribute(T* f, cudaFuncAttribute a, int v) {{
  return ::cudaFuncSetAttribute((const void*)f, a, v);
}}
template <class T> inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, T* f) {{
  return ::cudaFuncGetAttributes(a, (const void*)f);
}}
template <class T> inline cudaError_t cudaFuncSetCacheConfig(T* f, cudaFuncCache c) {{
  return ::cudaFuncSetCacheConfig((const void*)f, c);
}}
"""


def _emit(items, host, declared, copied, moved, need, launches, path) -> Split:
    seq = _host_seq(items, host, declared, copied, moved, need)
    first = next((i for i, (it, _) in enumerate(seq) if TORCH_INCLUDE.match(it.text)), None)
    if first is not None and re.match(r"#\s*include\s*<torch/extension\.h>", seq[first][0].text) \
            and all(re.match(r"#\s*include\b", it.text) for it, _ in seq[:first]):
        seq.insert(0, seq.pop(first))     # first, so that tools.backends.pch's precompiled header serves it
    sites: list[Launch] = [ln for it, _ in seq if id(it) in launches for ln in launches[id(it)]]
    h, n, prologue_done = [], 0, False
    for it, role in seq:
        body = it.text
        if role == "decl":
            body = _declaration(it)
        if role == "torch" and not prologue_done:
            h.append(f'#line 1 "<{PREFIX}>"\n' + _PROLOGUE
                     + "".join(f'extern "C" const void* {PREFIX}_fn_{i}(void);\n' for i in range(len(sites))))
            prologue_done = True
        if role == "torch" and launches.get(id(it)):
            out, last = [], 0
            for ln in launches[id(it)]:
                call = (f"{PREFIX}::launch({PREFIX}_fn_{n}(), (decltype(&{ln.callee}))nullptr, "
                        f"{PREFIX}::Config({ln.config})" + (f", {ln.args})" if ln.args else ")"))
                out += [it.text[last:ln.start], call, "\n" * (it.text.count("\n", ln.start, ln.end) - call.count("\n"))]
                last, n = ln.end, n + 1
            body = "".join(out) + it.text[last:]
        h.append(_line(it.line, path) + body + "\n")
    k = []
    for it in items:
        if it.kind == "code" and (id(it) in host or id(it) in moved):
            continue
        if it.kind == "pp" and TORCH_INCLUDE.match(it.text):
            continue
        k.append(_line(it.line, path) + it.text + "\n")
    k.append(f'#line 1 "<{PREFIX}>"\n' + "".join(
        f'extern "C" const void* {PREFIX}_fn_{i}(void) {{ return (const void*)&{ln.callee}; }}\n'
        for i, ln in enumerate(sites)))
    return Split(kernels="".join(k), host="".join(h), launches=len(sites))


@dataclass
class Halves:
    kernels: Path                  # the build folder's split/X.kernels.cu
    host: Path                     # split/X.host.cpp
    pch: bool                      # the host half starts with torch/extension.h (tools.backends.pch can serve it)


def _write(path: Path, text: str, same=lambda a, b: a == b) -> Path:
    """Written only where the text changed: ninja compiles a half again only when it did."""
    if not path.is_file() or not same(path.read_text(), text):
        path.write_text(text)
    return path


def same_code(a: str, b: str) -> bool:
    """The same code, its #line numbers aside: lines added to a kernel above the torch code move those
    numbers, and recompiling torch's headers for that would undo the split. The object then keeps the
    earlier numbers in its __LINE__ (TORCH_CHECK's messages) until its code changes."""
    strip = lambda t: re.sub(r'(?m)^#line \d+ "[^"\n]*"$', "#line", t)  # noqa: E731
    return strip(a) == strip(b)


def prepare(task, src_dir: Path, build_dir: Path) -> tuple[dict[str, Halves], str]:
    """The halves of each editable .cu of a CUDA torch extension that includes torch's headers, written
    under build_dir/split, and a line per file for the build log (split, or built whole and why).
    AGENT_CU_SPLIT=0 turns it off."""
    if os.environ.get("AGENT_CU_SPLIT", "1") == "0" or task.spec.form != "torch_extension" or not task.backend.gpu:
        return {}, ""
    out, notes = {}, []
    for rel in task.spec.editable:
        path = Path(src_dir) / rel
        if Path(rel).suffix != ".cu" or rel not in task.spec.sources or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if not any(TORCH_INCLUDE.match(ln.strip()) for ln in text.splitlines()):
            continue                      # no torch header: nvcc compiles it alone already
        got = split(text, str(path.resolve()))
        if isinstance(got, NoSplit):
            notes.append(f"{rel}: built whole (torch's headers through nvcc): {got.reason}")
            continue
        folder = Path(build_dir) / "split"
        folder.mkdir(parents=True, exist_ok=True)
        stem = rel.replace("/", "__")
        out[rel] = Halves(_write(folder / f"{stem}.kernels.cu", got.kernels),
                          _write(folder / f"{stem}.host.cpp", got.host, same_code),
                          bool(re.match(r'#line \d+ "[^"]*"\n#\s*include\s*<torch/extension\.h>', got.host)))
        notes.append(f"{rel}: split (tools.backends.cu_split): the kernels by nvcc without torch's headers, the torch code "
                     f"({got.launches} launch site(s) rewritten) by the C++ compiler, again only when its code changes")
    return out, "\n".join(notes)


def prepare_note(task, files: list[str]) -> tuple[set[str], str]:
    """Which of `files` (editable, including torch's headers) the build splits, and why the first .cu
    among the others is built whole (for tools.backends.backend.slow_rebuild_note)."""
    done, why = set(), ""
    for rel in files if os.environ.get("AGENT_CU_SPLIT", "1") != "0" and task.backend.gpu else []:
        if Path(rel).suffix == ".cu" and rel in task.spec.sources:
            got = split(task.path(rel).read_text(errors="replace"), str(task.path(rel)))   # its headers beside it
            done |= {rel} if isinstance(got, Split) else set()
            why = why or ("" if isinstance(got, Split) else f"; the build could not split {rel} into its kernels and "
                          f"its torch code: {got.reason.replace(str(task.path(rel).parent) + '/', '')}")
    return done, why
