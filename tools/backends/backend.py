"""What differs between kernel forms, in one place: the Backend of a task.

A task's kernel reaches the tools in one of two forms, on a GPU or on the CPU:

- ctypes: a shared library with the task's `extern "C"` entry points; task.py's `run(lib, shape, out,
  *inputs)` calls them through ctypes.
- torch_extension: a PyTorch C++/CUDA extension as its author wrote it (`#include <torch/extension.h>`,
  `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", ...); }`), built with torch's headers
  and libraries into a Python module; the task's `run` may be left out: the entry function is called
  with the inputs and its answer checked (shape, dtype) and copied into the judge's output buffer.

What differs between forms and devices lives here, behind one small protocol, so that the loop, the
evaluate path, parity, the bench and the probes ask a question ("is there launch geometry?", "which
torch device?", "wait for the device", "which clock?") instead of branching on `device == "cuda"`.
tests/test_architecture.py fails on such a branch outside this module.

    backend_for(task)  -> Backend
    .name              "ctypes-cuda", "ctypes-cpu", "torch_extension-cuda", "torch_extension-cpu"
    .gpu               launch geometry, device limits, Nsight Compute counters, device events
    .torch_device      where the judge puts inputs and outputs ("cuda" / "cpu")
    .device_name()     what the bench reports as the device
    .runnable()        why the task cannot run here, or None
    .warm_up()         what a job pays first (torch; a CUDA task's context)
    .sync()            wait for the device (nothing on the CPU)
    .clock()           the per-rep clock of the bench (tools.backends.clocks)
    .limits(arch)      DeviceLimits for the launch check, None where there is no launch geometry
    .build_flags()     what tools.build.build adds to its compile and link lines for this form
    .source_flags(text)  what it adds to one source's compile (a TORCH_LIBRARY source's renaming header)
    .unbuildable()     why this machine cannot build the form (a CUDA extension on a CPU torch), or None
    .load(path)        the built artifact, loaded (in the host process only)
    .complete(mod)     task.py, with what the form supplies (a torch extension's default `run`)
    slow_rebuild_note(task)   why each candidate's build will be slow (torch's headers in an editable file;
                              tools/backends/pch.py eases a C++ one)

A new form (a Triton kernel, say) is a new class here and one line in backend_for; see
docs/ARCHITECTURE.md. The module sits near the bottom of tools/: it imports tools.backends.device,
tools.backends.clocks, tools.backends.toolchain and tools.backends.pch only inside its methods, and nothing above them.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class BuildFlags:
    """A form's additions to tools.build.build's command lines."""
    cxx: list[str] = field(default_factory=list)     # compile flags, C++ and (forwarded) nvcc
    nvcc: list[str] = field(default_factory=list)    # nvcc only
    link: list[str] = field(default_factory=list)    # after the objects
    linker: str = "native"        # "native": nvcc for a CUDA task (static cudart), c++ else; "cxx": c++ always
    no_undefined: bool = True     # -Wl,--no-undefined (a Python module's Python symbols come from the interpreter)


class _Device:
    """The device half of a backend: what a GPU task and a CPU task do differently."""

    form = ""

    def __init__(self, gpu: bool, threads: int | None = None):
        self.gpu = gpu
        self.threads = threads      # TaskSpec.threads: set by warm_up
        self.torch_device = "cuda" if gpu else "cpu"
        self.name = f"{self.form}-{self.torch_device}"

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"

    def device_name(self) -> str:
        if not self.gpu:
            return "cpu"
        import torch
        return f"cuda: {torch.cuda.get_device_name()}"

    def runnable(self) -> str | None:
        if not self.gpu:
            return None
        import torch
        return None if torch.cuda.is_available() else "the task needs CUDA but no GPU is visible"

    def warm_up(self) -> None:
        """Set this process up to run the kernel: the task's CPU threads (for torch now, and for an
        OpenMP, MKL or OpenBLAS runtime the kernel's library loads later, through the environment it
        reads when it starts), and the CUDA context made."""
        if self.threads is not None:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                os.environ[var] = str(self.threads)
        import torch
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        if self.gpu and torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")

    def sync(self) -> None:
        if self.gpu:
            import torch
            torch.cuda.synchronize()

    def clock(self):
        from tools.backends.clocks import CpuClock, CudaClock
        if self.gpu:
            import torch
            return CudaClock(torch)
        return CpuClock()

    def limits(self, arch: str | None):
        """The device's limits for the launch check (the GPU's own, else the table's for `arch`); None
        on the CPU, which has no launch geometry."""
        if not self.gpu:
            return None
        from tools.backends.device import device_limits
        return device_limits(arch)


class CtypesBackend(_Device):
    """A shared library with the task's `extern "C"` entry points, called through ctypes."""

    form = "ctypes"

    def build_flags(self) -> BuildFlags:
        return BuildFlags()

    def unbuildable(self) -> str | None:
        return None

    def source_flags(self, text: str) -> list[str]:
        return []

    def load(self, path: str):
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"library {path} does not exist")
        return ctypes.CDLL(str(p.resolve()), mode=os.RTLD_LOCAL | os.RTLD_NOW)

    def complete(self, mod):
        return mod


_LOADED = itertools.count()


class TorchExtensionBackend(_Device):
    """A PyTorch C++/CUDA extension (pybind11), built by tools.build.build with torch's own flags."""

    form = "torch_extension"

    def __init__(self, gpu: bool, module_name: str, entry: str, where: str, threads: int | None = None):
        super().__init__(gpu, threads)
        self.module_name, self.where = module_name, where
        # "ns::op": an op of TORCH_LIBRARY(ns, m); else a function of the pybind11 module
        self.op_namespace, _, self.entry = entry.rpartition("::")

    def unbuildable(self) -> str | None:
        """Why this torch cannot build the extension (a CUDA extension on a CPU build of torch), or None."""
        if self.gpu:
            import torch
            if torch.version.cuda is None:
                return (f"{self.name}: this torch ({torch.__version__}) is a CPU build, without the CUDA headers and "
                        "libraries a CUDA extension compiles and links against: install a CUDA build of torch")
        return None

    def build_flags(self) -> BuildFlags:
        inc, libs, abi = _torch_paths(self.gpu)
        defines = [f"-DTORCH_EXTENSION_NAME={self.module_name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
                   f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
        cxx = defines + [f for d in inc for f in ("-isystem", d)]
        link = [f"-L{d}" for d in libs] + [f"-Wl,-rpath,{d}" for d in libs] + ["-lc10", "-ltorch", "-ltorch_cpu",
                                                                                  "-ltorch_python"]
        nvcc: list[str] = []
        if self.gpu:
            from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
            nvcc = list(COMMON_NVCC_FLAGS)     # what torch's own builds pass (no implicit half conversions)
            link += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
        return BuildFlags(cxx=cxx, nvcc=nvcc, link=link, linker="cxx", no_undefined=False)

    def source_flags(self, text: str) -> list[str]:
        """A source that registers ops with TORCH_LIBRARY is compiled with the header that renames its
        namespace per load (tools/backends/torch_library.py), after torch/extension.h where the file starts with
        that (so that a precompiled one, tools.backends.pch, is still the first thing the compile reads).
        Raises ValueError where this torch's macros cannot be renamed."""
        from tools.backends.pch import first_code_is_torch_extension
        from tools.backends.torch_library import ensure_shim, uses_torch_library
        if not uses_torch_library(text):
            return []
        first = ["-include", "torch/extension.h"] if first_code_is_torch_extension(text) else []
        return first + ["-include", str(ensure_shim(_torch_paths(self.gpu)[0]))]

    def load(self, path: str):
        """The module, under a name of its own in this process (two builds of one extension, the best
        and a candidate, load side by side: CPython keys a module by its file), checked for its entry."""
        import importlib.machinery
        import importlib.util
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"extension {path} does not exist")
        if self.op_namespace:
            return self._load_ops(p)
        name = f"agent_ext_{os.getpid()}_{next(_LOADED)}.{self.module_name}"
        loader = importlib.machinery.ExtensionFileLoader(name, str(p.resolve()))
        spec = importlib.util.spec_from_file_location(name, str(p.resolve()), loader=loader)
        try:
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        except ImportError as e:
            msg = " ".join(str(e).split())[:300]
            if "PyInit" in msg or "init function" in msg:
                raise ImportError(f"{self.where}: extension.name: the module is not {self.module_name!r}: write "
                                  "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m), or set [extension] name") from None
            raise ImportError(f"{self.where}: the built extension does not import: {msg}") from None
        if not callable(getattr(mod, self.entry, None)):
            have = sorted(n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n)))
            raise AttributeError(f"{self.where}: extension.entry: the module has no function {self.entry!r} "
                                 f"(it has {', '.join(have) or 'none'}): name it in task.toml's [extension] "
                                 "entry, or m.def() it in PYBIND11_MODULE")
        return mod

    def _load_ops(self, p: Path):
        """A TORCH_LIBRARY extension: dlopen'ed with $AGENT_TORCH_OPS_SUFFIX set, so that its namespace
        is ns_<suffix>, its own in this process; its ops as attributes (lib.forward, as a module's)."""
        from types import SimpleNamespace

        import torch

        from tools.backends.torch_library import ENV
        suffix = f"agent{os.getpid()}_{next(_LOADED)}"
        os.environ[ENV] = suffix
        try:
            so = ctypes.CDLL(str(p.resolve()), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as e:
            raise ImportError(f"{self.where}: the built extension does not load: {' '.join(str(e).split())[:300]}") from None
        finally:
            os.environ.pop(ENV, None)
        ns = f"{self.op_namespace}_{suffix}"
        if (err := getattr(so, "agent_torch_library_error", None)) is not None:
            err.restype = ctypes.c_char_p
            if msg := (err() or b"").decode(errors="replace").splitlines()[:1]:
                first = msg[0].split(". ")[0].rstrip(".")[:240].replace(ns, self.op_namespace + "_<suffix>")
                hint = (f" (the agent registers each build under {self.op_namespace}_<suffix>: leave the namespace out "
                        "of the schema)") if "amespace" in first else ""
                raise ImportError(f"{self.where}: the extension's TORCH_LIBRARY registration failed: {first}{hint}")
        names = torch._C._dispatch_get_all_op_names()
        ops = sorted({n.split("::", 1)[1].split(".")[0] for n in names if n.startswith(ns + "::")})
        if self.entry not in ops:
            mine = sorted({n.split(".")[0].replace(f"_{suffix}::", "::") for n in names
                           if n.split("::")[0].endswith(f"_{suffix}")})
            plain = f"{self.op_namespace}::{self.entry}" in {n.split(".")[0] for n in names}
            raise AttributeError(
                f"{self.where}: extension.entry: the extension registers no op {self.op_namespace}::{self.entry} ("
                + (f"it registers {', '.join(mine)}): name one in task.toml's [extension] entry" if mine else
                   "it registers it outside a source listed in `sources` (a header?), where the per-build namespace "
                   "does not reach: move TORCH_LIBRARY into a listed .cpp/.cu" if plain else
                   "it registers none: write TORCH_LIBRARY(ns, m) { m.def(...); } in a listed source") + ")")
        lib = SimpleNamespace(**{op: getattr(getattr(torch.ops, ns), op) for op in ops})
        lib.__name__ = f"torch.ops.{ns}"
        return lib

    def complete(self, mod):
        """task.py may leave out `run`: the entry function is called with the inputs, and its answer must
        be the task's output (empty_output's shape and dtype) to be copied into the judge's buffer."""
        if hasattr(mod, "run"):
            return mod
        entry, where = self.entry, self.where

        def run(lib, shape, out, *inputs):
            got = getattr(lib, entry)(*inputs)
            if not hasattr(got, "shape") or tuple(got.shape) != tuple(out.shape) or got.dtype != out.dtype \
                    or got.device != out.device:
                what = (f"{str(got.dtype).removeprefix('torch.')} {list(got.shape)} on {got.device}"
                        if hasattr(got, "shape") else type(got).__name__)
                raise ValueError(f"{where}: {entry}() returned {what}; the task's output is "
                                 f"{str(out.dtype).removeprefix('torch.')} {list(out.shape)} on {out.device} "
                                 "(task.py's empty_output): return that, or write run(lib, shape, out, *inputs)")
            out.copy_(got)

        mod.run = run
        return mod


@lru_cache(maxsize=2)
def _torch_paths(gpu: bool) -> tuple[list[str], list[str], int]:
    """torch's include and library folders and its C++ ABI, as torch.utils.cpp_extension gives them
    to its own builds (and the interpreter's include folder, for pybind11). The CUDA folders come from
    the nvcc tools.backends.toolchain found (torch's own lookup wants CUDA_HOME or nvcc on PATH)."""
    from tools.backends.torchpaths import torch_cpu_paths
    inc, libs, abi = torch_cpu_paths()       # without importing torch where an earlier process asked
    inc, libs = list(inc), list(libs)
    if gpu:
        from tools.backends.toolchain import cuda_home, find_nvcc
        home = cuda_home(find_nvcc())
        if home is None:
            raise OSError("no CUDA toolkit found for the extension's CUDA headers and libraries: put nvcc on "
                          "PATH or set CUDA_HOME")
        inc.append(str(home / "include"))
        libs.append(str(home / ("lib64" if (home / "lib64").is_dir() else "lib")))
    return inc, libs, abi


Backend = CtypesBackend | TorchExtensionBackend

_TORCH_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](torch/|ATen/|c10/|pybind11/)', re.M)


def slow_rebuild_note(task) -> str | None:
    """A torch extension whose editable file includes torch's headers recompiles them for every
    candidate (11-45 s instead of 1-2 s): one line naming the files, what the build does about it
    (a precompiled torch/extension.h for a C++ file, tools.backends.pch; nothing reaches nvcc) and the fix, else None."""
    if task.spec.form != "torch_extension":
        return None
    heavy = [f for f in task.spec.editable if _TORCH_INCLUDE.search(task.path(f).read_text(errors="replace"))]
    from tools.backends.cu_split import prepare_note
    split, why = prepare_note(task, heavy)       # a .cu the build splits is not slow (tools.backends.cu_split)
    heavy = [f for f in heavy if f not in split]
    if not heavy:
        return None
    from tools.backends.pch import pch_sources
    eased = set(pch_sources(task, task.root))
    if task.spec.build.defaults == "load_inline":   # an imported KernelBench solution: its form is the export's format
        return (f"{', '.join(heavy)} include{'s' if len(heavy) == 1 else ''} torch's headers, as the solution's source "
                "does: every candidate compiles them again, as load_inline does (one translation unit"
                + (", with a precompiled torch/extension.h the build makes once: 0.76 GB, AGENT_CACHE)" if eased else ")"))
    cost = ("25-45 s a build, not 1-2 s" if not eased else
            "about 11 s a build on 2 cores with the precompiled torch/extension.h the build makes once (0.76 GB, "
            "AGENT_CACHE), 22 s without, not 1 s" if eased == set(heavy) else
            f"25-45 s a build, not 1-2 s; {', '.join(sorted(eased))} about half that with a precompiled torch/extension.h")
    return (f"{', '.join(heavy)} {'is' if len(heavy) == 1 else 'are'} editable and include{'s' if len(heavy) == 1 else ''} "
            f"torch's headers: every candidate recompiles them ({cost}){why}. Move the binding "
            "(PYBIND11_MODULE and the torch::Tensor code) into a file left out of `editable` and call the kernel "
            "through a plain function (README: Bring your own kernel)")


def backend_for(task) -> Backend:
    spec = task.spec
    gpu = spec.device == "cuda"
    # torch's default on a CPU, one thread per core, is no figure to compare with: beside any other
    # process its OpenMP workers wait on a descheduled one (a 48-cube matmul took 16 ms a call instead
    # of 5 us beside one busy process on 2 cores), and spinning after each burst they slow what is
    # timed next by 1.7x. A task whose kernel runs on more threads says so (cpu_threads).
    threads = spec.cpu_threads or (None if gpu else 1)
    if spec.form == "torch_extension":
        ext = spec.ext
        return TorchExtensionBackend(gpu, ext.name, ext.entry, str(Path(task.root) / "task.toml"), threads)
    return CtypesBackend(gpu, threads)
