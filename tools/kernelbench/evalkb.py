"""A KernelBench solution file checked as KernelBench's evaluator checks one, in a fresh process:
`python -m tools.kernelbench.evalkb PROBLEM SOLUTION [--sizes k=v,...] [--no-gpu] [--trials N]`.

The solution file is loaded as it is (its load_inline builds for real); torch is seeded with 42 before
Model(*get_init_inputs()) and again before ModelNew(*get_init_inputs()); each trial draws get_inputs() on the
CPU with its own seed, moves them to the device, and compares the two outputs with torch.allclose at
KernelBench's tolerance for the output's dtype. One JSON line: {"ok", "compiled", "correct", "trials",
"max_abs_diff", "error"}. `--sizes` sets the problem's module-level sizes first (a CPU machine's smaller ones).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.kernelbench.probe import ProbeError, load, set_sizes
from tools.kernelbench.writer import TOLERANCE


def evaluate(problem: Path, solution: Path, sizes: dict[str, int], device: str, trials: int) -> dict:
    import torch
    res = {"ok": False, "compiled": False, "correct": False, "trials": 0, "max_abs_diff": None, "error": ""}
    try:
        prob = load(problem, "kb_problem")
        set_sizes([prob], sizes)
        sol = load(solution, "kb_solution")      # builds the extension
        set_sizes([sol], sizes)
    except ProbeError as e:
        res["error"] = f"{e.info['file']}: {e.info['error']}"
        return res
    res["compiled"] = True
    init = list(prob.get_init_inputs())
    torch.manual_seed(42)
    ref = prob.Model(*init).to(device)
    torch.manual_seed(42)
    new = sol.ModelNew(*init).to(device)
    worst = 0.0
    with torch.no_grad():
        for t in range(trials):
            torch.manual_seed(1000 + t)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in prob.get_inputs()]
            want = ref(*inputs)
            got = new(*inputs)
            tol = TOLERANCE.get(str(want.dtype).replace("torch.", ""), 1e-2)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                res["error"] = f"trial {t}: ModelNew returned {getattr(got, 'shape', type(got).__name__)}, Model {want.shape}"
                return res
            worst = max(worst, float((got.float() - want.float()).abs().max()) if want.numel() else 0.0)
            res["max_abs_diff"] = worst
            if not torch.allclose(got, want, atol=tol, rtol=tol):
                res["error"] = f"trial {t}: outputs differ past atol = rtol = {tol:g} (max abs diff {worst:.3g})"
                return res
            res["trials"] = t + 1
    res.update(ok=True, correct=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.kernelbench.evalkb")
    p.add_argument("problem", type=Path)
    p.add_argument("solution", type=Path)
    p.add_argument("--sizes", default="", help="k=v,... the problem's module-level sizes to set first")
    p.add_argument("--no-gpu", action="store_true", help="on the CPU even where there is a GPU")
    p.add_argument("--trials", type=int, default=3)
    a = p.parse_args(argv)
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() and not a.no_gpu else "cpu")
    sizes = {k: int(v) for k, v in (kv.split("=", 1) for kv in a.sizes.split(",") if kv)}
    try:
        res = evaluate(a.problem, a.solution, sizes, device, a.trials)
    except Exception as e:  # noqa: BLE001 (the solution's code: its error is the answer)
        res = {"ok": False, "compiled": True, "correct": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    # before the exported solution (a candidate's kernel) is built and loaded: writes only in this process's scratch
    # directory (tools/isolation/confine.py; its HOME and TMPDIR are there: tools/isolation/sandbox.py run_python_json),
    # and so load_inline's build folder and a compiler cache, which the user's environment may name elsewhere
    import os
    if os.environ.get("AGENT_SCRATCH"):
        for var, sub in (("TORCH_EXTENSIONS_DIR", "torch_extensions"), ("CCACHE_DIR", "ccache")):
            os.environ[var] = os.path.join(os.environ["AGENT_SCRATCH"], sub)
    from tools.isolation.confine import fence_scratch
    fence_scratch()
    sys.exit(main())
