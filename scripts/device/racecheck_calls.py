"""What one call of a candidate costs under compute-sanitizer, shape by shape (issue 66 slice 13), on the GPU box:

    python3 scripts/device/racecheck_calls.py [TASK] [KNOB=V ...]     # default attention_fwd SMEM_PAD=2

Builds the task's kernel with the knobs (the sweep's write_knobs), then runs a child that loads it and calls it once
per shape, each call timed with the GPU waited for: with no tool, under racecheck (PyTorch's kernels excluded, as the
judge runs it: tools/judge/sanitize.py TORCH_KERNELS) with CUDA's lazy module loading and with eager loading, and
under memcheck. A shape is called twice first: a first call that costs what the second does is not the tool's
instrumentation. Prints the table and writes it to $OUT/racecheck_calls.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"attention_fwd": [{"B": 2, "H": 4, "S": 333, "D": 64, "causal": 1}, {"B": 2, "H": 4, "S": 333, "D": 64, "causal": 1},
                            {"B": 1, "H": 1, "S": 333, "D": 64, "causal": 1}, {"B": 1, "H": 1, "S": 17, "D": 64, "causal": 0},
                            {"B": 8, "H": 8, "S": 333, "D": 64, "causal": 1}],
          "softmax": [{"M": 4, "N": 262144}, {"M": 4, "N": 262144}, {"M": 9, "N": 17}, {"M": 333, "N": 4097}]}


def child(lib: str, task_dir: str) -> None:
    from tools.task import load_task
    task = load_task(Path(task_dir))
    mod, backend = task.module(), task.backend
    backend.warm_up()
    lib_h = backend.load(lib)
    for shape in SHAPES[task.spec.name]:
        inputs = mod.make_inputs(shape, 1, backend.torch_device, task.spec.distributions[0])
        out = mod.empty_output(shape, *inputs)
        backend.sync()
        t = time.perf_counter()
        mod.run(lib_h, shape, out, *inputs)
        backend.sync()
        print(json.dumps({"shape": shape, "seconds": round(time.perf_counter() - t, 4)}), flush=True)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
        return 0
    from parity_costs import built     # scripts/device/parity_costs.py: the same copy, knobs and build
    from tools.judge.sanitize import TORCH_KERNELS, find_sanitizer
    args = [a for a in sys.argv[1:] if "=" not in a]
    name = args[0] if args else "attention_fwd"
    knobs = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:] if "=" in a)} or \
        ({"SMEM_PAD": 2} if name == "attention_fwd" else {})
    work = Path(tempfile.mkdtemp(prefix="racecheck-calls-"))
    d, b = built(name, knobs, work)
    tool = find_sanitizer()
    if tool is None:
        raise SystemExit("no compute-sanitizer on this machine")
    exclude = [a for k in TORCH_KERNELS for a in ("--kernel-name-exclude", f"kns={k}")]
    runs = {"no tool": ([], {}), "racecheck, lazy loading": ([tool, "--tool", "racecheck", *exclude], {"CUDA_MODULE_LOADING": "LAZY"}),
            "racecheck, eager loading": ([tool, "--tool", "racecheck", *exclude], {"CUDA_MODULE_LOADING": "EAGER"}),
            "memcheck": ([tool, "--tool", "memcheck"], {})}
    cols: dict[str, list] = {}
    for label, (wrap, env) in runs.items():
        t0 = time.perf_counter()
        p = subprocess.run([*wrap, sys.executable, __file__, "--child", str(b.lib_path), str(d)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, **env})
        got = [json.loads(ln)["seconds"] for ln in p.stdout.splitlines() if ln.startswith("{")]
        cols[label] = got + [f"(process {time.perf_counter() - t0:.1f} s, rc {p.returncode})"]
    shapes = SHAPES[name]
    lines = [f"{name} {knobs}: one call's seconds under each tool (the first shape twice)",
             "| shape | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for i, shape in enumerate(shapes + [{"": "the whole process"}]):
        lines.append(f"| {shape} | " + " | ".join(str(c[i]) if i < len(c) else "-" for c in cols.values()) + " |")
    text = "\n".join(lines)
    print(text)
    out = Path(os.environ.get("OUT") or work)
    out.mkdir(parents=True, exist_ok=True)
    (out / "racecheck_calls.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
