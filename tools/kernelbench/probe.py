"""What a KernelBench problem (and solution) file holds, found in a child process:
`python -m tools.kernelbench.probe PROBLEM [--solution FILE] [--scale F] [--device cpu|cuda]` prints one
JSON line: the module-level sizes get_inputs/get_init_inputs read, the shapes the model takes (KernelBench's
own sizes first, shrunk where this machine cannot hold or run them, then odd and small ones), the inputs'
and output's dtypes and shapes, and the solution's load_inline arguments. A bad file gives
{"ok": false, "file", "field", "error", "fix"}: one line for the user, no traceback.

Shapes are tried on torch's meta device (no memory, no time), then the smallest for real on the CPU
(it must run; a model that needs a GPU is said to). Sizes: a module-level int that get_inputs or
get_init_inputs reads; one of 16 or more may vary (a smaller one is a rank, a kernel size, an axis).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import time
from pathlib import Path

VARY_MIN = 16                  # a size below this is left as the problem has it (an axis, a kernel size)
CPU_BYTES = 64 << 20           # a CPU machine: inputs and output of the main shape at most this
CPU_REF_S = 0.05               # ... and the reference's forward at most this long on one thread
NO_GPU_BYTES = 80 << 30        # a CUDA solution imported on a machine without a GPU: sized for an 80 GiB card
GPU_SHARE = 8                  # a GPU: inputs and output at most 1/8 of its memory (parity holds copies)
ODD = [131, 67, 97, 45, 37, 29, 53]
SOLUTION_KEYS = ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                 "extra_ldflags", "extra_include_paths")


class ProbeError(Exception):
    def __init__(self, file: str, field: str, error: str, fix: str):
        super().__init__(error)
        self.info = {"ok": False, "file": file, "field": field, "error": error, "fix": fix}


def load(path: Path, name: str, field: str = "import"):
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise ProbeError(str(path), f"line {e.lineno}", f"syntax error: {e.msg}", "fix the Python syntax") from None
    except Exception as e:  # noqa: BLE001 (the user's module may raise anything at import)
        raise ProbeError(str(path), field, f"does not import: {type(e).__name__}: {e}",
                         "make the file import on its own with `python FILE`") from None
    return mod


def sizes_of(path: Path, mod) -> dict[str, int]:
    """Module-level ints that get_inputs / get_init_inputs read, in file order."""
    tree = ast.parse(path.read_text())
    used: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            v = getattr(mod, name, None)
            if name in used and isinstance(v, int) and not isinstance(v, bool):
                out[name] = v
    return out


def check_problem(path: Path, mod) -> None:
    for field, fix in (("Model", "define class Model(nn.Module) whose forward is the reference"),
                       ("get_inputs", "define get_inputs() returning the forward's input tensors"),
                       ("get_init_inputs", "define get_init_inputs() returning Model's constructor arguments")):
        if not callable(getattr(mod, field, None)):
            raise ProbeError(str(path), field, f"the problem defines no {field}", fix)


def set_sizes(mods, shape: dict[str, int]) -> None:
    for m in mods:
        for k, v in shape.items():
            setattr(m, k, int(v))


def run_meta(mod, shape: dict[str, int]):
    """(inputs, output) on the meta device for these sizes, or raises what the model raised."""
    import torch
    set_sizes([mod], shape)
    with torch.device("meta"):
        init = list(mod.get_init_inputs())
        model = mod.Model(*init)
        inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in mod.get_inputs()]
        out = model(*inputs)
    return inputs, out


def nbytes(tensors) -> int:
    import torch
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def describe(inputs, out, path: Path) -> dict:
    import torch
    if not isinstance(out, torch.Tensor):
        raise ProbeError(str(path), "Model.forward", f"returns {type(out).__name__}, not one tensor",
                         "return a single tensor (a tuple of outputs is not supported yet)")
    return {"inputs": [{"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
                       if isinstance(t, torch.Tensor) else {"value": repr(t)} for t in inputs],
            "output": {"dtype": str(out.dtype).replace("torch.", ""), "shape": list(out.shape)},
            "bytes": nbytes(inputs) + nbytes([out])}


def ref_seconds(mod, shape: dict[str, int]) -> float:
    """One forward of the reference on the CPU, one thread (as a CPU task times it), after one warm-up."""
    import torch
    torch.set_num_threads(1)
    set_sizes([mod], shape)
    torch.manual_seed(42)
    model = mod.Model(*mod.get_init_inputs())
    inputs = list(mod.get_inputs())
    with torch.no_grad():
        model(*inputs)
        t0 = time.perf_counter()
        model(*inputs)
    return time.perf_counter() - t0


def fits(mod, shape, on_gpu: bool, gpu_bytes: int) -> str | None:
    """Why the main shape is too large for where the task runs (`on_gpu`: a GPU of gpu_bytes), or None."""
    inputs, out = run_meta(mod, shape)
    b = nbytes(inputs) + nbytes([out])
    if on_gpu:
        return f"{b / 2**30:.1f} GiB of inputs and output, over 1/{GPU_SHARE} of the GPU" if b * GPU_SHARE > gpu_bytes else None
    if b > CPU_BYTES:
        return f"{b / 2**20:.0f} MiB of inputs and output, over the CPU's {CPU_BYTES >> 20} MiB"
    s = ref_seconds(mod, shape)
    return f"the reference takes {s * 1e3:.0f} ms a call on one CPU thread" if s > CPU_REF_S else None


def main_shape(mod, sizes, vary, scale, on_gpu, gpu_bytes, path, gpu_here: bool = False) -> tuple[dict, str]:
    """KernelBench's sizes (times --scale), halved (the largest varying size first) until this machine
    holds and runs them; with a note saying what was done and why."""
    shape = {k: (max(1, round(v * scale)) if k in vary else v) for k, v in sizes.items()}
    note = f"--scale {scale:g}: " + ", ".join(f"{k} {sizes[k]}->{shape[k]}" for k in vary) if scale != 1 else ""
    try:
        why = fits(mod, shape, on_gpu, gpu_bytes)
    except Exception as e:  # noqa: BLE001
        needs_gpu(e, gpu_here, path)
        if "meta" in str(e):
            raise ProbeError(str(path), "Model.forward", "reads tensor values in Python (an `if` on a tensor, .item()): "
                             f"it cannot run on torch's meta device, where shapes are tried ({str(e)[:120]})",
                             "not supported yet: compute the forward with tensor operations only") from None
        raise ProbeError(str(path), "Model.forward", f"fails at the file's own sizes {sizes}: {type(e).__name__}: "
                         f"{str(e)[:200]}", "make Model(*get_init_inputs())(*get_inputs()) run as written") from None
    first_why = why
    for _ in range(40):
        if why is None or not vary:
            break
        big = max(vary, key=lambda k: shape[k])
        if shape[big] < 2 * VARY_MIN:
            break
        shape[big] //= 2
        try:
            why = fits(mod, shape, on_gpu, gpu_bytes)
        except Exception:  # noqa: BLE001 (a halved size the model refuses: undo and stop)
            shape[big] *= 2
            break
    if first_why:
        note = (note + "; " if note else "") + (f"KernelBench's sizes {first_why}: bench at " +
                                                ", ".join(f"{k}={shape[k]}" for k in vary))
        if why:
            note += f" (still {why})"
    return shape, note


def other_shapes(mod, main: dict, vary: list[str]) -> tuple[list[dict], list[str]]:
    """Odd sizes (tails of every tile), then small ones, each kept only where the model takes it."""
    cands = [("odd", {**main, **{k: min(ODD[i % len(ODD)], max(main[k], VARY_MIN + 1) * 2 + 1)
                                 for i, k in enumerate(vary)}}),
             ("small", {**main, **{k: 1 for k in vary}}),
             ("small", {**main, **{k: 3 + 2 * i for i, k in enumerate(vary)}})]
    kept, dropped = [], []
    for what, shape in cands:
        if shape == main or shape in kept or (what == "small" and any(s != main and _le(s, shape) for s in kept)):
            continue
        try:
            run_meta(mod, shape)
            kept.append(shape)
        except Exception as e:  # noqa: BLE001
            dropped.append(f"{what} {shape}: {type(e).__name__}: {str(e)[:120]}")
    return kept, dropped


def _le(a: dict, b: dict) -> bool:
    return all(a[k] <= b[k] for k in a)


def real_run(mod, shape, path: Path, gpu: bool) -> None:
    """The smallest shape for real (on the GPU where there is one): the reference must run. KernelBench makes
    inputs on the CPU and moves them; a model that makes CUDA tensors itself needs a GPU, and is said to."""
    import torch
    dev = "cuda" if gpu else "cpu"
    set_sizes([mod], shape)
    try:
        torch.manual_seed(42)
        model = mod.Model(*mod.get_init_inputs()).to(dev)
        with torch.no_grad():
            model(*[t.to(dev) if isinstance(t, torch.Tensor) else t for t in mod.get_inputs()])
    except Exception as e:  # noqa: BLE001
        needs_gpu(e, gpu, path)
        raise ProbeError(str(path), "Model.forward", f"fails on the {dev} at {shape}: {type(e).__name__}: "
                         f"{str(e)[:200]}", "make the reference run as KernelBench runs it") from None


def needs_gpu(e: Exception, gpu: bool, path) -> None:
    """Raise the one line for a model that asked for CUDA on a machine without a GPU (get_inputs' .cuda(), a
    Model that moves itself), whichever of the probe's steps met it first."""
    msg = f"{type(e).__name__}: {str(e)[:200]}"
    if not gpu and any(w in msg for w in ("CUDA", "cuda", "NVIDIA")):
        raise ProbeError(str(path), "Model", f"needs a GPU and this machine has none ({msg})",
                         "import it on a machine with a GPU, or make get_inputs/Model create CPU tensors "
                         "(the task moves them to the task's device)") from None


class _Stub:
    """What the captured load_inline answers: any function of the module, doing nothing."""

    def __getattr__(self, name):
        return lambda *a, **k: None


def capture_solution(path: Path, problem, shape: dict) -> dict:
    """The solution's one load_inline call, its arguments by name (nothing is compiled here)."""
    import inspect

    import torch
    import torch.utils.cpp_extension as ext
    calls, saved, saved_load = [], ext.load_inline, ext.load

    def inline(*a, **k):
        calls.append(inspect.signature(saved).bind(*a, **k).arguments)
        return _Stub()

    def file_load(*a, **k):
        raise ProbeError(str(path), "load", "builds with torch.utils.cpp_extension.load (files), not load_inline",
                         "put the sources in the file and build with load_inline, as KernelBench's solutions do")
    ext.load_inline, ext.load = inline, file_load
    try:
        sol = load(path, "kb_solution")
        if not callable(getattr(sol, "ModelNew", None)):
            raise ProbeError(str(path), "ModelNew", "the solution defines no ModelNew",
                             "define class ModelNew(nn.Module) taking Model's constructor arguments")
        if not calls:       # load_inline inside ModelNew.__init__
            set_sizes([problem, sol], shape)
            with torch.device("meta"):
                sol.ModelNew(*problem.get_init_inputs())
    except ProbeError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ProbeError(str(path), "ModelNew", f"cannot be built: {type(e).__name__}: {str(e)[:200]}",
                         "ModelNew(*get_init_inputs()) must construct") from None
    finally:
        ext.load_inline, ext.load = saved, saved_load
    if len(calls) != 1:
        raise ProbeError(str(path), "load_inline", f"calls load_inline {len(calls)} times",
                         "build the solution's kernels with one load_inline call")
    return _solution_info(calls[0], path)


def _solution_info(args: dict, path: Path) -> dict:
    def text(v):
        return "\n".join(v) if isinstance(v, (list, tuple)) else (v or "")
    fns = args.get("functions")
    fns = [fns] if isinstance(fns, str) else list(fns or [])
    info = {"name": args.get("name"), "cpp_sources": text(args.get("cpp_sources")),
            "cuda_sources": text(args.get("cuda_sources")) or None, "functions": fns}
    for k in SOLUTION_KEYS[4:]:
        info[k] = list(args.get(k) or [])
    if not fns and "PYBIND11_MODULE" not in info["cpp_sources"]:
        raise ProbeError(str(path), "load_inline", "neither functions=[...] nor a PYBIND11_MODULE in cpp_sources",
                         "name the functions to bind: functions=[\"my_forward\"]")
    return info


def probe(problem_path: Path, solution: Path | None, scale: float, gpu: bool) -> dict:
    """`gpu`: this machine has one (torch sees it). The task is a CUDA task where the solution has CUDA sources
    (without a solution: where there is a GPU), else a CPU task."""
    import torch
    mod = load(problem_path, "kb_problem")
    check_problem(problem_path, mod)
    sizes = sizes_of(problem_path, mod)
    sol = capture_solution(solution, mod, sizes) if solution is not None else None
    cuda_task = bool(sol["cuda_sources"]) if sol is not None else gpu
    vary = [k for k, v in sizes.items() if v >= VARY_MIN]
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if gpu else NO_GPU_BYTES
    main, note = main_shape(mod, sizes, vary, scale, cuda_task, gpu_bytes, problem_path, gpu)
    if cuda_task and not gpu:
        note = (note + "; " if note else "") + (f"no GPU here: sizes held to a {NO_GPU_BYTES >> 30} GiB card, "
                                                "the CUDA kernel neither built nor run")
    others, dropped = other_shapes(mod, main, vary)
    shapes = [main, *others]
    real_run(mod, min(shapes, key=lambda s: describe(*run_meta(mod, s), problem_path)["bytes"]), problem_path, gpu)
    info = describe(*run_meta(mod, main), problem_path)
    if sol is None:
        sol = _scaffold(mod, problem_path, min(shapes, key=lambda s: sum(s.values())), cuda_task)
    return {"ok": True, "sizes": sizes, "vary": vary, "shapes": shapes, "dropped": dropped, "note": note,
            "device": "cuda" if cuda_task else "cpu", **info, **({"solution": sol} if sol else {})}


def _scaffold(mod, path: Path, shape: dict, cuda: bool) -> dict:
    """The starting solution for a problem given without one (tools/kernelbench/scaffold.py), captured at a small
    shape (every dimension is dynamic in the capture)."""
    from tools.kernelbench.scaffold import ScaffoldError, scaffold
    set_sizes([mod], shape)
    try:
        return scaffold(mod, path, list(mod.get_init_inputs()), cuda)
    except ScaffoldError as e:
        raise ProbeError(str(path), "Model.forward", f"no starting kernel could be made from it: {e}",
                         "give a solution with --solution NEW.py (a ModelNew built with load_inline)") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.kernelbench.probe")
    p.add_argument("problem", type=Path)
    p.add_argument("--solution", type=Path)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--no-gpu", action="store_true", help="as on a machine without a GPU (default: torch's answer)")
    a = p.parse_args(argv)
    try:
        import torch
        res = probe(a.problem, a.solution, a.scale, not a.no_gpu and torch.cuda.is_available())
    except ProbeError as e:
        res = e.info
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    # before the problem's and the solution's Python is imported: writes only in this process's scratch directory
    # (tools/isolation/confine.py; its HOME and TMPDIR are there: tools/isolation/sandbox.py run_python_json)
    from tools.isolation.confine import fence_scratch
    fence_scratch()
    sys.exit(main())
