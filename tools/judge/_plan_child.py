"""Child process of the launch check: loads a task module and its library, prints one JSON line.

    python -m tools.judge._plan_child plan  TASK_DIR LIB SHAPE_JSON
    python -m tools.judge._plan_child trace TASK_DIR LIB SHAPE_JSON DIST

`plan` calls the module's launch_plan(lib, shape) (no GPU needed: the library links cudart
statically); a task without one (a torch extension as its author wrote it) answers no launches and
`planned: false`, and its geometry comes from `trace` alone. `trace` runs the shape once on the GPU
under torch.profiler and reports every kernel launch with the geometry the driver saw. The library is
loaded by the task's backend (tools/backends/backend.py). The parent never imports generated code.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def _emit(obj: dict) -> None:
    sys.stdout.flush()
    print(json.dumps(obj), flush=True)


def _load(task_dir: str, lib_path: str):
    from tools.task import load_task
    task = load_task(Path(task_dir))
    return task.module(), task.backend.load(lib_path), task.spec.module


def plan(task_dir: str, lib_path: str, shape: dict) -> dict:
    from tools.task import load_task
    task = load_task(Path(task_dir))
    mod, lib, _ = _load(task_dir, lib_path)
    return plan_shapes(task, mod, lib, shape)


MAX_OTHERS = 96   # shapes planned beside the main one


def plan_shapes(task, mod, lib, main: dict) -> dict:
    """The plan on the main shape, and under "others" on every declared shape, every [dims] extreme parity runs
    (tools/measure/ranges.py, a fixed seed) and the wide shape: resources that grow with the shape (a row staged in
    shared memory, a grid of one CTA per element) break a limit on long rows only. A shape whose plan fails is
    left out here: the run on it fails as well, and parity says so."""
    import random

    from tools.measure.ranges import range_shapes, wide_shape
    out = plan_from(mod, lib, main, task.spec.module)
    if not out.get("ok") or out.get("planned") is False:
        return out
    wide = wide_shape(task.spec, mod)
    shapes = [dict(s) for s in task.spec.shapes] + [s for s, _ in range_shapes(task.spec, mod, random.Random(0))]
    seen, others = {tuple(sorted(main.items()))}, []
    for shape in shapes + ([wide] if wide else []):
        shape = {k: (v if isinstance(v, bool) else int(v)) for k, v in shape.items()}
        key = tuple(sorted(shape.items()))
        if key in seen or len(others) >= MAX_OTHERS:
            continue
        seen.add(key)
        try:
            got = plan_from(mod, lib, shape, task.spec.module)
        except Exception:  # the task's launch_plan refuses the shape: the run on it is parity's business
            continue
        if got.get("ok") and got.get("launches"):
            others.append({"shape": shape, "launches": got["launches"]})
    out["others"] = others
    return out


def plan_from(mod, lib, shape: dict, module_name: str = "the task module") -> dict:
    """The library's own launch plan for `shape`, from an already loaded module and library (also
    used inside the loop's evaluate child, where they are loaded anyway)."""
    if not hasattr(mod, "launch_plan"):
        return {"ok": True, "launches": [], "planned": False}
    launches = []
    for i, item in enumerate(mod.launch_plan(lib, shape)):
        try:
            launches.append({"kernel": str(item["kernel"]), "grid": [int(v) for v in item["grid"]],
                             "block": [int(v) for v in item["block"]],
                             "smem_dynamic_bytes": int(item.get("smem_dynamic_bytes", 0))})
        except (KeyError, TypeError, ValueError) as e:
            return {"ok": False, "error": f"launch_plan entry {i} is malformed ({e!r}): need kernel, grid, block"}
    return {"ok": True, "launches": launches}


def _dims(v) -> list[int]:
    if isinstance(v, str):
        v = [int(x) for x in v.strip("[]() ").replace(",", " ").split()]
    v = [int(x) for x in v] + [1, 1, 1]
    return v[:3]


def trace(task_dir: str, lib_path: str, shape: dict, dist: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tools.task_messages import make_inputs
    if not torch.cuda.is_available():
        return {"ok": False, "error": "no CUDA device visible to torch"}
    mod, lib, _ = _load(task_dir, lib_path)
    inputs = make_inputs(mod, shape, 0, "cuda", dist)
    out = mod.empty_output(shape, *inputs)
    mod.run(lib, shape, out, *inputs)        # warm-up: module load, cudaFuncSetAttribute, ...
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mod.run(lib, shape, out, *inputs)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    launches = []
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0)):
        args = e.get("args", {})
        if "grid" not in args or "block" not in args:
            continue
        launches.append({"kernel": e.get("name", "?"), "grid": _dims(args["grid"]), "block": _dims(args["block"]),
                         "registers": args.get("registers per thread"), "shared_memory": args.get("shared memory"),
                         "args": {k: v for k, v in args.items() if isinstance(v, (int, float, str, list))}})
    return {"ok": True, "launches": launches, "device": torch.cuda.get_device_name(0)}


def main(argv: list[str]) -> int:
    mode, task_dir, lib_path, shape_json = argv[:4]
    shape = json.loads(shape_json)
    try:
        if mode == "plan":
            res = plan(task_dir, lib_path, shape)
        elif mode == "trace":
            res = trace(task_dir, lib_path, shape, argv[4] if len(argv) > 4 else "normal")
        else:
            res = {"ok": False, "error": f"unknown mode {mode!r}"}
    except OSError as e:
        res = {"ok": False, "error": f"cannot load the library: {e}"}
    except Exception as e:  # the task's own code failed: report it as one line, no traceback
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    _emit(res)
    return 0


if __name__ == "__main__":
    # before any candidate code is loaded: writes only in this process's scratch directory
    from tools.isolation.confine import fence_scratch
    fence_scratch()
    sys.exit(main(sys.argv[1:]))
