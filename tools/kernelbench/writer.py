"""The task folder of an imported KernelBench problem, from the probe's answer (tools/kernelbench/probe.py).

    task.toml        the spec: the problem's sizes as shapes, KernelBench's tolerance, the extension's entry
    task.py          tools/kernelbench/task_py.py (reference: the problem's Model; call: the solution's ModelNew)
    problem.py       the problem file as given
    model_new.py     the solution's Python as given (its load_inline call gets the build under test)
    binding.cpp      what load_inline would write as main.cpp: torch/extension.h, the C++ side, the pybind11
                     module for `functions`; a CPU solution's includes kernel.cpp (one translation unit, as
                     load_inline compiles it), a CUDA solution's is compiled once a run
    kernel.cu        the solution's cuda_sources (the file the agent edits), or kernel.cpp: its cpp_sources
                     where the solution has no CUDA (a CPU solution)
    kernelbench.json which load_inline argument the editable file is, for `agent export --kernelbench`
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tools.task import knob_pattern

# KernelBench's tolerance by the output's dtype (its evaluator's allclose: atol = rtol)
TOLERANCE = {"float32": 1e-4, "float64": 1e-6, "float16": 1e-2, "bfloat16": 1e-2}
CUDA_HEADERS = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"   # load_inline's own
META = "kernelbench.json"


class WriteError(Exception):
    """One line for the user: the file, the field, the fix."""


def binding(sol: dict, cuda: bool, where: str, kernel_file: str = "kernel.cpp") -> str:
    """load_inline's main.cpp for the solution. A CPU solution's is one translation unit with its cpp_sources, as
    load_inline compiles it: the editable kernel.cpp is included here, not compiled apart (one compile of torch's
    headers a build, not two: 8.6 s each on 2 cores with the precompiled header, and no prototypes read out of the
    source for a second file)."""
    head = ("// What torch.utils.cpp_extension.load_inline writes as main.cpp for this solution (agent import\n"
            "// kernelbench): torch/extension.h, the C++ side, the pybind11 module for `functions`. Not edited.\n"
            "#include <torch/extension.h>\n")
    body = sol["cpp_sources"] if cuda else f'#include "{kernel_file}"   // the solution\'s cpp_sources: the file the agent edits'
    mod = "\n".join(["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
                     *(f'    m.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in sol["functions"]),
                     "}"])
    return head + body.strip("\n") + "\n\n" + mod + "\n"


def kernel(sol: dict, cuda: bool) -> str:
    if cuda:
        return ("// The solution's cuda_sources (agent import kernelbench): the file the agent edits. The three\n"
                "// includes are the ones load_inline adds.\n" + CUDA_HEADERS + sol["cuda_sources"].strip("\n") + "\n")
    return ("// The solution's cpp_sources (agent import kernelbench): the file the agent edits.\n"
            "#include <torch/extension.h>\n" + sol["cpp_sources"].strip("\n") + "\n")


def entry_of(sol: dict, where: str) -> str:
    if sol["functions"]:
        return sol["functions"][0]
    m = re.search(r'\bm\.def\(\s*"(\w+)"', sol["cpp_sources"])
    if not m:
        raise WriteError(f"{where}: cpp_sources: its PYBIND11_MODULE defines no function; fix: m.def(\"forward\", ...)")
    return m.group(1)


ROLES = [("THREAD", "threads"), ("VEC", "vector"), ("TILE", "tile"), ("BLOCK", "tile"), ("SPLIT", "split"),
         ("PAD", "pad"), ("UNROLL", "other")]


def knobs_toml(knobs: dict[str, list[int]], kernel_file: str, text: str, by: str = "import") -> str:
    """[[knobs]] for `--knob NAME=v1,v2,...`: each a `#define NAME <int>` the kernel has (its value the default)."""
    out = []
    for name, values in knobs.items():
        m = knob_pattern(name).search(text)
        if not m:
            raise WriteError(f"--knob {name}: the kernel ({kernel_file}) has no `#define {name} <integer>` line; fix: "
                             f"write one where the value is used, or drop the knob")
        default = int(m.group(2))
        role = next((r for key, r in ROLES if key in name), "other")
        vals = sorted(set(values) | {default})
        out += ["", "[[knobs]]", f'name = "{name}"', f"values = {vals}", f"default = {default}",
                f'file = "{kernel_file}"', f'role = "{role}"', f'description = "from --knob at {by}; the kernel\'s value {default}"']
    return "\n".join(out) + ("\n" if out else "")


def _toml_shape(shape: dict) -> str:
    return "{ " + ", ".join(f"{k} = {int(v)}" for k, v in shape.items()) + " }"


def task_toml(name: str, probe: dict, src: dict, files: dict) -> str:
    dtype = probe["output"]["dtype"]
    tol = TOLERANCE.get(dtype)
    if tol is None:
        raise WriteError(f"{src['problem']}: Model.forward: returns {dtype}; fix: an imported problem's output is one "
                         f"of {', '.join(TOLERANCE)}")
    labels = ["KernelBench's sizes" + (" (shrunk: see the note)" if probe["note"] else ""),
              *(["odd sizes: tails of every tile"] if len(probe["shapes"]) > 1 else []),
              *(["small sizes"] if len(probe["shapes"]) > 2 else [])]
    shapes = "\n".join(f"  {_toml_shape(s)},   # {labels[min(i, len(labels) - 1)]}" for i, s in enumerate(probe["shapes"]))
    note = "".join(f"# {line}\n" for line in (probe["note"] or "").split("; ") if line)
    dropped = "".join(f"# not taken by the model: {d}\n" for d in probe["dropped"])
    lines = [
        f"# Imported from the KernelBench problem {src['problem']}"
        + (f" and the solution {src['solution']}" if src.get("solution") else "") + " by `agent import kernelbench`.",
        "# problem.py is the reference (Model, seeded with 42 as KernelBench's evaluator seeds it); model_new.py the",
        f"# solution's Python; {files['kernel']} the kernel the agent edits; binding.cpp load_inline's main.cpp.",
        f'name = "{name}"',
        f'description = """KernelBench problem {Path(src["problem"]).name}: the output of Model.forward, '
        f'{dtype} {tuple(probe["output"]["shape"])} at the first shape."""',
        f'device = "{probe["device"]}"',
        'form = "torch_extension"',
        'module = "task.py"',
        f"sources = {json.dumps(files['sources'])}",
        f'editable = ["{files["kernel"]}"]',
        'baseline = "reference"        # KernelBench\'s speedup: against the problem\'s Model in PyTorch',
        f'dtypes = ["{dtype}"]',
        'distributions = ["problem"]   # the problem\'s own get_inputs, seeded',
        "main_shape = 0",
        note + dropped + "shapes = [",
        shapes,
        "]",
        "",
        f"# KernelBench's tolerance for {dtype} outputs (torch.allclose, atol = rtol)",
        f"[tolerance.{dtype}]",
        f"atol = {tol:g}",
        f"rtol = {tol:g}",
        "",
        "[extension]",
        f'entry = "{files["entry"]}"     # a function of `functions` in the load_inline call',
        "",
        "[parity]",
        "hidden_shapes = 0              # the problem defines no other sizes; the listed odd and small ones stand in",
        ""]
    if not files["kernel"].endswith(".cu"):     # a CPU solution: built with the flags KernelBench's build gives it
        lines += ["# built as load_inline builds the solution (torch's own flags, then its extra_cflags), so that what is",
                  "# timed here is what KernelBench times",
                  "[build]",
                  'defaults = "load_inline"',
                  f"flags = {json.dumps(list(src.get('extra_cflags') or []))}",
                  ""]
    else:       # load_inline builds for the GPU's generic target (TORCH_CUDA_ARCH_LIST unset): so does this build
        lines += ["# the GPU's generic target, as torch's load_inline builds the solution (sm_90, not sm_90a): a kernel",
                  "# that builds here builds in KernelBench's evaluation",
                  "[build]",
                  "arch_specific = false",
                  ""]
    return "\n".join(lines)


def write_task(into: Path, name: str, probe: dict, problem: Path, solution: Path | None,
               knobs: dict[str, list[int]] | None = None, scan_allow: dict[str, str] | None = None) -> dict:
    """The task folder `into` (which must not exist or be empty), with `knobs` (name -> values) and the source scan's
    rules `scan_allow` allows (name -> why). Returns what was written."""
    if into.exists() and any(into.iterdir()):
        raise WriteError(f"{into}: exists and is not empty; fix: name a new folder with --into (nothing was written)")
    sol = probe["solution"]
    cuda = bool(sol["cuda_sources"])
    where = str(solution) if solution else "the scaffolded solution"
    entry = entry_of(sol, where)
    ext = "cu" if cuda else "cpp"
    # a CPU solution that writes its own PYBIND11_MODULE is one file; otherwise the binding is a file of its own
    files = {"kernel": f"kernel.{ext}", "entry": entry,
             "sources": ["binding.cpp", f"kernel.{ext}"] if sol["functions"] or cuda else [f"kernel.{ext}"]}
    texts = {"task.toml": task_toml(name, probe, {"problem": str(problem), "solution": str(solution) if solution else None,
                                                  "extra_cflags": sol.get("extra_cflags")}, files),
             files["kernel"]: kernel(sol, cuda),
             META: json.dumps({"kernel": files["kernel"], "argument": "cuda_sources" if cuda else "cpp_sources",
                               "functions": sol["functions"], "problem": str(problem), "solution": where}, indent=1)}
    texts["task.toml"] += knobs_toml(knobs or {}, files["kernel"], texts[files["kernel"]])
    if scan_allow:
        texts["task.toml"] += "\n[scan]\nallow = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in scan_allow.items()) + " }\n"
    if "binding.cpp" in files["sources"]:
        texts["binding.cpp"] = binding(sol, cuda, where, files["kernel"]) if sol["functions"] else \
            "#include <torch/extension.h>\n" + sol["cpp_sources"]
    into.mkdir(parents=True, exist_ok=True)
    for f, t in texts.items():
        (into / f).write_text(t)
    shutil.copyfile(Path(__file__).with_name("task_py.py"), into / "task.py")
    shutil.copyfile(problem, into / "problem.py")
    if solution:
        shutil.copyfile(solution, into / "model_new.py")
    else:
        (into / "model_new.py").write_text(sol["model_new"])
    return {"into": str(into), "files": sorted([*texts, "task.py", "problem.py", "model_new.py"]), "entry": entry,
            "device": probe["device"]}
