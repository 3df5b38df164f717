"""`agent init NAME --cuda kernel.cu | --cpp kernel.cpp --reference module:function`: a task folder from a kernel's
extern "C" function and a Python reference, in any git repository: task.toml (every field commented, the function's
parameters declared in [signature]) and a two-line task.py whose bindings tools/signature.py makes from it.
`agent init NAME --kernelbench PROBLEM.py` is `agent import kernelbench PROBLEM.py --name NAME`.

The kernel's parameters are read from its prototype: a const pointer is an input, the one other pointer the output,
an integer a size (a shape field of its own name unless --scalar gives its value), a float or double a constant
(--scalar), a cudaStream_t the caller's stream. What a prototype cannot say is asked for: each tensor's shape where
there is more than one size (--shape), the sizes (--size). The reference is called once in a child process on the
smallest shape before anything is kept; nothing is written when a check fails, and the repository's other files,
branches and index are never touched."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rich.markup import escape

from tools.console import make_console

DTYPE_OF_C = {"float": "float32", "double": "float64", "half": "float16", "__half": "float16",
              "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16", "int": "int32", "int32_t": "int32",
              "int64_t": "int64", "long": "int64", "uint8_t": "uint8", "int8_t": "int8", "bool": "bool"}
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "float16": 1e-2, "bfloat16": 1e-2}
CHECK_TIMEOUT_S = 300.0


def register(subparsers) -> None:
    p = subparsers.add_parser("init", help="make a task folder from a kernel file and a Python reference",
                              description="Make kernels/NAME from a kernel's extern \"C\" function and a reference "
                                          "function (or from a KernelBench problem file).")
    p.add_argument("name", help="the task's name (letters, digits, _ and -)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cuda", type=Path, metavar="KERNEL.cu", help="a CUDA file with an extern \"C\" host function")
    src.add_argument("--cpp", type=Path, metavar="KERNEL.cpp", help="a C++ file with an extern \"C\" function (CPU)")
    src.add_argument("--kernelbench", type=Path, metavar="PROBLEM.py", help="a KernelBench problem file")
    p.add_argument("--reference", metavar="MODULE:FUNCTION", help="the Python function the kernel must match, "
                   "importable from the repository's root (ops.ref:fma for ops/ref.py's fma)")
    p.add_argument("--function", help="the extern \"C\" function (default: the file's only one)")
    p.add_argument("--output", help="the output parameter (default: the one pointer that is not const)")
    p.add_argument("--shape", action="append", default=[], metavar="ARG=D1,D2",
                   help="a tensor's shape, expressions over the sizes (default with one size: that size)")
    p.add_argument("--size", action="append", default=[], metavar="DIM=N", help="a size's value on the main shape")
    p.add_argument("--scalar", action="append", default=[], metavar="ARG=VALUE",
                   help="a float parameter's value, or an integer parameter's expression over the sizes")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a tunable #define of the kernel and the values the heuristic and sweep may give it")
    p.add_argument("--into", type=Path, help="the new folder (default: kernels/NAME in this git repository)")
    p.set_defaults(func=_init)


def _fail(msg: str) -> int:
    make_console(stderr=True).print(f"[red]init failed[/red] {escape(msg)}")
    return 2


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for it in items:
        k, eq, v = it.partition("=")
        if not eq or not k.strip() or not v.strip():
            raise ValueError(f"{flag} {it}: give NAME=VALUE")
        out[k.strip()] = v.strip()
    return out


def signature_args(params: list[dict], a) -> tuple[list[dict], list[str]]:
    """[signature] args from the prototype's parameters and the flags; the sizes (shape fields) they use."""
    shapes, scalars = _pairs(a.shape, "--shape"), _pairs(a.scalar, "--scalar")
    ptrs = [p for p in params if p["pointer"]]
    out_name = a.output or next(iter([p["name"] for p in ptrs if not p["const"]][:1]), None)
    if out_name is None or out_name not in [p["name"] for p in ptrs]:
        raise ValueError(f"--output: no output among the pointers {[p['name'] for p in ptrs]}; fix: --output NAME")
    if a.output is None and sum(not p["const"] for p in ptrs) > 1:
        raise ValueError(f"several pointers are not const ({[p['name'] for p in ptrs if not p['const']]}); fix: "
                         "--output NAME names the output (the others are inputs), or make the inputs const")
    sizes = [p["name"] for p in params if not p["pointer"] and p["type"] not in ("float", "double", "cudaStream_t")
             and p["name"] not in scalars]
    args = []
    for p in params:
        if p["pointer"]:
            dtype = DTYPE_OF_C.get(p["type"])
            if dtype is None:
                raise ValueError(f"parameter {p['name']}: element type {p['type']!r} has no dtype here; fix: write it "
                                 f"as one of {sorted(DTYPE_OF_C)}")
            dims = shapes.get(p["name"], ",".join(sizes) if len(sizes) == 1 else None)
            if dims is None:
                raise ValueError(f"parameter {p['name']}: its shape is not known with sizes {sizes}; fix: --shape "
                                 f"{p['name']}={','.join(sizes) or 'N'}")
            args.append({"name": p["name"], "kind": "output" if p["name"] == out_name else "input", "dtype": dtype,
                         "shape": [d.strip() for d in dims.split(",")]})
        elif p["type"] == "cudaStream_t":
            args.append({"name": p["name"], "kind": "stream"})
        elif p["type"] in ("float", "double"):
            args.append({"name": p["name"], "kind": "float", "value": float(scalars.get(p["name"], 1.0)),
                         "ctype": p["type"]})
        else:
            args.append({"name": p["name"], "kind": "int", "ctype": p["type"],
                         **({"value": scalars[p["name"]]} if p["name"] in scalars else {})})
    return args, sizes


def _toml_value(v) -> str:
    return json.dumps(v) if not isinstance(v, list) else "[" + ", ".join(json.dumps(x) for x in v) + "]"


def task_toml(name: str, a, kernel: str, function: str, args: list[dict], main: dict[str, int]) -> str:
    from tools.kernelbench.writer import knobs_toml
    cuda = a.cuda is not None
    out = next(x for x in args if x["kind"] == "output")
    dtype = out["dtype"]
    tol = TOLERANCE.get(dtype, 0)
    odd = {d: max(1, min(v, 37) - (1 - min(v, 37) % 2)) for d, v in main.items()}   # odd: tails in every loop
    shapes = [main, odd, {d: 1 for d in main}]
    elem = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1, "int8": 1,
            "bool": 1}
    nbytes = " + ".join(f"{elem.get(x['dtype'], 4)}*({'*'.join(x['shape'])})" for x in args
                        if x["kind"] in ("input", "output"))
    lines = [f"# {name}: made by `agent init` (docs/TASKS.md explains every field). Edit freely; `agent check` checks it.",
             f'name = "{name}"',
             f'description = "{kernel}\'s {function}, against {a.reference}"   # given to the LLM proposer',
             f'device = "{"cuda" if cuda else "cpu"}"           # cuda: nvcc, the launch check, ncu; cpu: c++',
             'module = "task.py"          # the functions of docs/TASKS.md section 4: here made from [signature]',
             f'sources = ["{kernel}"]      # every file the build compiles',
             f'editable = ["{kernel}"]     # the files a proposal may change',
             'baseline = "reference"      # --target is measured against the reference (timed as a user calls it)',
             f'dtypes = ["{dtype}"]         # the output\'s dtype; each has a [tolerance.<dtype>]',
             'distributions = ["normal", "uniform"]   # parity runs both; the bench times the first',
             "main_shape = 0               # the shape that is timed, launch-checked and profiled",
             "shapes = [                   # parity runs every one; the first is the main shape",
             *(f"  {{ {', '.join(f'{k} = {v}' for k, v in s.items())} }},{c}" for s, c in
               zip(shapes, ["   # the main shape (--size)", "   # odd sizes: tails", "   # the smallest"])),
             "]", "",
             "# each size's range: parity adds shapes at the extremes (every value 1..17, each at its largest)",
             "[dims]", *(f"{d} = {{ min = 1, max = {v} }}" for d, v in main.items()), "",
             f"[tolerance.{dtype}]          # |got - expected| <= atol + rtol * |expected|, elementwise",
             f"atol = {tol:g}", f"rtol = {tol:g}", "",
             "[metrics]                    # bytes each call moves (GB/s, the roofline); add flops where it computes",
             f'bytes = "{nbytes}"', "",
             "# the extern \"C\" function the generated task.py calls (tools/signature.py), in the prototype's order;",
             "# checked against the kernel before every build. kind: input (const pointer), output, int (a size: a",
             "# shape field of its name, or value = an expression), float (value), stream (the caller's cudaStream_t)",
             "[signature]", f'function = "{function}"',
             f'reference = "{a.reference}"   # module:function, from the repository\'s root: called with the inputs '
             "in order, each float by name",
             "args = [",
             *(f"  {{ {', '.join(f'{k} = {_toml_value(v)}' for k, v in x.items())} }}," for x in args), "]"]
    text = "\n".join(lines) + "\n"
    knobs = {k: [int(v) for v in vals.split(",")] for k, vals in _pairs(a.knob, "--knob").items()}
    return text + knobs_toml(knobs, kernel, (Path(a.cuda or a.cpp)).read_text(), by="init")


TASK_PY = '''"""{name}: docs/TASKS.md section 4's functions, made from task.toml's [signature] by tools/signature.py (`agent
init`). Declare the kernel's parameters there; write your own functions here instead where they need more."""

from tools.signature import bind

make_inputs, reference, timing_reference, empty_output, run = bind(__file__)
'''


def _init(a) -> int:
    from agent.commands.kernelbench import repo_root
    from tools.isolation.sandbox import run_python_json
    from tools.signature import prototype
    from tools.task import TaskError, load_task
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", a.name):
        return _fail(f"NAME {a.name!r}: letters, digits, _ and - only")
    root = repo_root()
    if not (root / ".git").exists():
        return _fail(f"{Path.cwd()}: not in a git repository; fix: run agent init inside one (git init)")
    if a.kernelbench is not None:
        from argparse import Namespace

        from agent.commands.kernelbench import import_kernelbench
        return import_kernelbench(Namespace(problem=a.kernelbench, solution=None, into=a.into, name=a.name, scale=1.0, knob=a.knob))
    src = a.cuda or a.cpp
    if not src.is_file():
        return _fail(f"{src}: {'--cuda' if a.cuda else '--cpp'}: no such file; fix: the path to the kernel's source")
    if not a.reference or not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", a.reference):
        return _fail(f"--reference {a.reference or ''}: give MODULE:FUNCTION (ops.ref:fma for ops/ref.py's fma)")
    into = a.into or root / "kernels" / a.name
    if into.exists():
        return _fail(f"{into}: exists; fix: another NAME or --into (nothing was written)")
    text = src.read_text(errors="replace")
    names = re.findall(r'extern\s+"C"\s+[\w\s*]*?\b([A-Za-z_]\w*)\s*\(', text)
    function = a.function or (names[0] if len(set(names)) == 1 else None)
    if function is None:
        return _fail(f"{src}: {'several' if names else 'no'} extern \"C\" functions ({', '.join(names) or 'none'}); "
                     "fix: --function NAME" + ("" if names else ', declared extern "C"'))
    params = prototype(text, function)
    if params is None:
        return _fail(f"{src}: --function {function}: not defined there")
    try:
        args, sizes = signature_args(params, a)
        given = {k: int(v) for k, v in _pairs(a.size, "--size").items()}
        if set(given) - set(sizes):
            raise ValueError(f"--size {sorted(set(given) - set(sizes))}: not a size of {function} (its sizes: {sizes})")
        default = {1: 1 << 20, 2: 1024, 3: 256}.get(len(sizes), 64)
        main = {d: given.get(d, default) for d in sizes}
        toml = task_toml(a.name, a, src.name, function, args, main)
    except (ValueError, KeyError) as e:
        return _fail(f"{src}: {e}")
    except Exception as e:    # knobs_toml's WriteError names the flag and the fix
        return _fail(str(e))
    made = next(d for d in [*reversed(into.absolute().parents), into.absolute()] if not d.exists())  # removed on failure
    into.mkdir(parents=True)
    try:
        (into / "task.toml").write_text(toml)
        (into / "task.py").write_text(TASK_PY.format(name=a.name))
        shutil.copyfile(src, into / src.name)
        try:
            load_task(into)
        except TaskError as e:
            raise ValueError(str(e)) from None
        res, data = run_python_json("tools.signature", [str(into)], CHECK_TIMEOUT_S)
        if data is None:
            raise ValueError(f"checking the reference failed: {res.reason()}")
        if not data.get("ok"):
            raise ValueError(f"{data['field']}: {data['error']}; fix: {data['fix']}")
    except ValueError as e:
        shutil.rmtree(made, ignore_errors=True)
        return _fail(f"{e} (nothing was written)")
    con = make_console()
    con.print(f"[green]made[/green] {escape(str(into))}: {function}({', '.join(x['name'] for x in args)}) against "
              f"{escape(a.reference)}, sizes {escape(str(main))}")
    con.print(f"next: agent check {escape(str(into))}; then commit the folder (and the reference) and agent optimize "
              f"{escape(str(into))}")
    return 0
