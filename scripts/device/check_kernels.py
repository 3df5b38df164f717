"""Self-check of the CUDA tasks (kernels/attention_fwd, kernels/softmax), standalone.

For each task: compile the default knobs and every allowed knob configuration (or a seeded sample
covering every knob value), read ptxas registers/spills, call the library's plan function, and on a
GPU check every shape against the reference (output poisoned with NaN, every element compared,
inputs checked unchanged), then time the default and the fastest passing configuration against the
PyTorch op (median of 50 reps with CUDA events, L2 flushed before each rep).

Each batch of configurations runs in a child process with a timeout; a configuration that crashes
or hangs is marked and the child restarted on the rest, so one bad configuration cannot stop the check.

    python scripts/device/check_kernels.py                     # on the GPU machine; JSON under $OUT
    python scripts/device/check_kernels.py --compile-only --max-configs 0 --jobs 2   # CPU: compile sweep
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.task import knob_pattern, load_task  # noqa: E402

TASKS = ["attention_fwd", "softmax"]
SMEM_OPTIN_MAX = 227 * 1024
_PTXAS_FN = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


# --- configurations ------------------------------------------------------------------------------
def cfg_id(cfg: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in cfg.items())


def choose_configs(task, max_configs: int, seed: int = 0) -> list[dict[str, int]]:
    """Default first; then every allowed configuration, or a seeded sample that covers each knob value."""
    space = task.spec.knob_space()
    default = task.spec.default_knobs()
    rest = [c for c in space if c != default]
    if max_configs <= 0 or len(rest) < max_configs:
        return [default] + rest
    rng = random.Random(seed)
    rng.shuffle(rest)
    picked: list[dict[str, int]] = []
    for k in task.spec.knobs:                 # every value of every knob at least once
        for v in k.values:
            if not any(c[k.name] == v for c in picked + [default]):
                picked.append(next(c for c in rest if c[k.name] == v))
    for c in rest:
        if len(picked) >= max_configs:
            break
        if c not in picked:
            picked.append(c)
    return [default] + picked


def write_variant(task, cfg: dict[str, int], dst: Path) -> None:
    """Copy the task's sources into dst with each knob's #define line rewritten."""
    dst.mkdir(parents=True, exist_ok=True)
    texts = {f: (task.root / f).read_text() for f in task.spec.sources}
    for k in task.spec.knobs:
        texts[k.file], n = knob_pattern(k.name).subn(lambda m, v=cfg[k.name]: f"{m.group(1)}{v}", texts[k.file], count=1)
        if n != 1:
            raise RuntimeError(f"{task.name}: no #define {k.name} line in {k.file}")
    for f, t in texts.items():
        (dst / f).write_text(t)


def compile_variant(task, cfg: dict[str, int], build_root: Path, arch: str, timeout_s: float = 240) -> dict:
    d = build_root / task.name / cfg_id(cfg)
    write_variant(task, cfg, d)
    lib = d / f"lib{task.name}.so"
    cmd = ["nvcc", "-O3", f"-arch={arch}", "-lineinfo", "-Xptxas", "-v", "-Xcompiler", "-fPIC", "-shared",
           "-o", str(lib)] + [str(d / f) for f in task.spec.sources if f.endswith(".cu")]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"compiled": False, "error": f"nvcc timed out after {timeout_s:.0f} s", "lib": None}
    out = p.stdout + p.stderr
    res = {"compiled": p.returncode == 0, "seconds": round(time.time() - t0, 2), "lib": str(lib) if p.returncode == 0 else None,
           "kernels": parse_ptxas(out)}
    if p.returncode != 0:
        res["error"] = "\n".join(l for l in out.splitlines() if "error" in l)[:800] or out[-800:]
    return res


def parse_ptxas(text: str) -> dict[str, dict]:
    """{mangled kernel name: {registers, spill_stores, spill_loads}} from `-Xptxas -v` output."""
    kernels: dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        if m := _PTXAS_FN.search(line):
            cur = kernels.setdefault(m.group(1), {})
        elif cur is not None and (m := _PTXAS_SPILL.search(line)):
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif cur is not None and (m := _PTXAS_REGS.search(line)):
            cur["registers"] = int(m.group(1))
    return kernels


def plan_check(task, lib_path: str) -> dict:
    """The library's launch plan for the main shape (pure host code: works without a GPU)."""
    import ctypes
    mod = task.module()
    lib = ctypes.CDLL(lib_path)
    plan = mod.launch_plan(lib, task.spec.main)
    problems = []
    for launch in plan:
        threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
        if threads % 32 or threads > 1024:
            problems.append(f"{launch['kernel']}: {threads} threads per block")
        if launch["smem_dynamic_bytes"] > SMEM_OPTIN_MAX:
            problems.append(f"{launch['kernel']}: {launch['smem_dynamic_bytes']} B dynamic shared memory")
    g = plan[0]["grid"]
    return {"launches": len(plan), "ctas_main": g[0] * g[1] * g[2], "smem": plan[0]["smem_dynamic_bytes"],
            "plan": plan, "plan_problems": problems}


# --- GPU worker (child process) ------------------------------------------------------------------
def worker(task_name: str, jobs_file: str, quick_reps: int) -> None:
    """Runs parity (and a quick timing of the main shape) for each (id, lib) in jobs_file, printing one
    JSON line when a configuration starts and one when it ends."""
    import ctypes
    import torch

    task = load_task(ROOT / "kernels" / task_name)
    mod, spec = task.module(), task.spec
    tol = spec.tolerance[spec.dtypes[0]]
    jobs = json.loads(Path(jobs_file).read_text())
    cache: dict = {}

    def case(shape, seed, dist):
        key = (json.dumps(shape, sort_keys=True), seed, dist)
        if key not in cache:
            inputs = mod.make_inputs(shape, seed, "cuda", dist)
            cache[key] = (inputs, mod.reference(shape, *inputs).float(), [t.clone() for t in inputs])
        return cache[key]

    def check(lib, shape, seed, dist) -> dict:
        inputs, ref, pristine = case(shape, seed, dist)
        out = mod.empty_output(shape, *inputs)
        out.fill_(float("nan"))
        mod.run(lib, shape, out, *inputs)
        torch.cuda.synchronize()
        got = out.float()
        err = (got - ref).abs()
        bad = ~torch.isfinite(got) | (err > tol.atol + tol.rtol * ref.abs())
        rel = err / ref.abs().clamp_min(tol.atol)
        r = {"shape": shape, "seed": seed, "dist": dist, "max_abs": float(torch.nan_to_num(err, nan=float("inf")).max()),
             "max_rel": float(torch.nan_to_num(rel, nan=float("inf")).max()), "bad": int(bad.sum())}
        if r["bad"]:
            idx = int(bad.flatten().nonzero()[0])
            r["first_bad"] = {"index": idx, "expected": float(ref.flatten()[idx]), "got": float(got.flatten()[idx])}
        if not all(torch.equal(a, b) for a, b in zip(inputs, pristine)):
            r["bad"] += 1
            r["inputs_modified"] = True
        return r

    for job in jobs:
        print(json.dumps({"start": job["id"]}), flush=True)
        lib = ctypes.CDLL(job["lib"])
        results = []
        cases = [(s, sd, d) for s in spec.shapes for sd in range(job["seeds"]) for d in job["dists"]]
        for shape, seed, dist in cases:
            try:
                results.append(check(lib, shape, seed, dist))
            except RuntimeError as e:   # a launch error: the context may be unusable, stop this child
                print(json.dumps({"done": job["id"], "ok": False, "error": str(e)[:300], "cases": results}), flush=True)
                return
        ok = all(r["bad"] == 0 for r in results)
        quick = None
        if ok and quick_reps:
            inputs, _, _ = case(spec.main, 0, spec.distributions[0])
            out = mod.empty_output(spec.main, *inputs)
            quick = time_ms(lambda: mod.run(lib, spec.main, out, *inputs), reps=quick_reps, warmup=3)["median_ms"]
        worst = max(results, key=lambda r: r["max_abs"]) if results else None
        print(json.dumps({"done": job["id"], "ok": ok, "quick_ms": quick, "worst": worst,
                          "failures": [r for r in results if r["bad"]][:3]}), flush=True)


def time_ms(fn, reps: int = 50, warmup: int = 10) -> dict:
    """Median and p90 of `reps` timed calls (one CUDA event pair each, L2 flushed before each)."""
    import torch
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return {"median_ms": ts[len(ts) // 2], "p90_ms": ts[int(len(ts) * 0.9)], "reps": reps}


def timer(task_name: str, libs_file: str) -> None:
    """Child: 50-rep timing of each library on the main shape, and of the PyTorch op."""
    import ctypes
    import torch

    task = load_task(ROOT / "kernels" / task_name)
    mod, spec = task.module(), task.spec
    inputs = mod.make_inputs(spec.main, 0, "cuda", spec.distributions[0])
    out = mod.empty_output(spec.main, *inputs)
    res = {"torch": time_ms(lambda: mod.timing_reference(spec.main, *inputs))}
    for name, path in json.loads(Path(libs_file).read_text()).items():
        lib = ctypes.CDLL(path)
        res[name] = time_ms(lambda: mod.run(lib, spec.main, out, *inputs))
    print(json.dumps(res), flush=True)


# --- parent --------------------------------------------------------------------------------------
def run_parity(task, cfgs: dict[str, dict], compiled: dict[str, dict], tmp: Path, deadline: float,
               quick_reps: int) -> dict[str, dict]:
    """Parity for every compiled configuration, in child processes restarted after a crash or hang."""
    default_id = cfg_id(task.spec.default_knobs())
    todo = [i for i in cfgs if compiled[i].get("compiled")]
    out: dict[str, dict] = {}
    while todo:
        left = deadline - time.time()
        if left < 20:
            for i in todo:
                out[i] = {"ok": False, "skipped": "time budget spent"}
            break
        jobs = [{"id": i, "lib": compiled[i]["lib"],
                 "seeds": 2 if i == default_id else 1,
                 "dists": task.spec.distributions if i == default_id else task.spec.distributions[:1]} for i in todo]
        jf = tmp / f"{task.name}-jobs.json"
        jf.write_text(json.dumps(jobs))
        cmd = [sys.executable, __file__, "--worker", task.name, "--jobs-file", str(jf), "--quick-reps", str(quick_reps)]
        current, progressed = None, False
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left - 10, start_new_session=True)
            lines, tail = p.stdout.splitlines(), p.stderr[-600:]
            ended = f"child exited with {p.returncode}"
        except subprocess.TimeoutExpired as e:
            lines = (e.stdout or b"").decode(errors="replace").splitlines() if isinstance(e.stdout, bytes) else (e.stdout or "").splitlines()
            tail, ended = "", "child timed out"
        for line in lines:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in msg:
                current, progressed = msg["start"], True
            elif "done" in msg:
                out[msg.pop("done")] = msg
                current = None
        if current is not None:     # crashed or hung in the middle of this configuration
            out[current] = {"ok": False, "error": f"{ended} while checking it: {tail.strip()[-300:]}"}
        todo = [i for i in todo if i not in out]
        if todo and not progressed:   # the child started nothing (import error, no device, ...)
            for i in todo:
                out[i] = {"ok": False, "error": f"{ended} before this configuration ran: {tail.strip()[-300:]}"}
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="*", default=TASKS)
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile, ptxas and plan checks only")
    ap.add_argument("--max-configs", type=int, default=None,
                    help="configurations besides the default (0 = all; default: all for compile-only, else 48 per task)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting new checks after this")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--timer", help=argparse.SUPPRESS)
    ap.add_argument("--jobs-file", help=argparse.SUPPRESS)
    ap.add_argument("--quick-reps", type=int, default=10, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.jobs_file, a.quick_reps)
        return 0
    if a.timer:
        timer(a.timer, a.jobs_file)
        return 0

    t_start = time.time()
    deadline = t_start + a.budget_s
    gpu = False
    if not a.compile_only:
        import torch
        gpu = torch.cuda.is_available()
        if not gpu:
            print("no CUDA device: running the compile-only checks")
    arch = a.arch
    if arch is None:
        if gpu:
            import torch
            mj, mn = torch.cuda.get_device_capability()
            arch = f"sm_{mj}{mn}"
        else:
            arch = "sm_90"
    max_configs = a.max_configs if a.max_configs is not None else (0 if not gpu else 48)
    out_dir = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="check_kernels_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"arch": arch, "gpu": None, "tasks": {}}
    if gpu:
        import torch
        report["gpu"] = torch.cuda.get_device_name()

    with tempfile.TemporaryDirectory(prefix="ck_build_") as tmp_s:
        tmp = Path(tmp_s)
        for name in a.tasks:
            task = load_task(ROOT / "kernels" / name)
            cfg_list = choose_configs(task, max_configs)
            cfgs = {cfg_id(c): c for c in cfg_list}
            default_id = cfg_id(task.spec.default_knobs())
            t0 = time.time()
            with cf.ThreadPoolExecutor(a.jobs) as ex:
                futs = {i: ex.submit(compile_variant, task, c, tmp, arch) for i, c in cfgs.items()}
                compiled = {i: f.result() for i, f in futs.items()}
            t_compile = time.time() - t0
            for i, c in compiled.items():
                if c["compiled"]:
                    try:
                        c.update(plan_check(task, c["lib"]))
                    except Exception as e:   # a plan that cannot be read is a failed check, reported
                        c["plan_problems"] = [f"plan: {e}"]
            parity = run_parity(task, cfgs, compiled, tmp, deadline, a.quick_reps) if gpu else {}
            rows = {}
            for i, c in cfgs.items():
                comp = compiled[i]
                rows[i] = {"knobs": c, "compiled": comp["compiled"], "error": comp.get("error"),
                           "kernels": comp.get("kernels"), "ctas_main": comp.get("ctas_main"), "smem": comp.get("smem"),
                           "launches": comp.get("launches"), "plan_problems": comp.get("plan_problems", [])}
                if gpu:
                    rows[i]["parity"] = parity.get(i, {"ok": False, "error": "not run"})
            timing = None
            if gpu:
                passing = {i: r["parity"]["quick_ms"] for i, r in rows.items()
                           if r["parity"].get("ok") and r["parity"].get("quick_ms") is not None}
                libs = {}
                if default_id in passing:
                    libs["default"] = compiled[default_id]["lib"]
                if passing:
                    best = min(passing, key=passing.get)
                    libs["best"] = compiled[best]["lib"]
                    report.setdefault("best", {})[name] = cfgs[best]
                lf = tmp / f"{name}-time.json"
                lf.write_text(json.dumps(libs))
                try:
                    p = subprocess.run([sys.executable, __file__, "--timer", name, "--jobs-file", str(lf)],
                                       capture_output=True, text=True, timeout=max(30.0, deadline + 25 - time.time()))
                    timing = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-400:]}
                except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as e:
                    timing = {"error": f"timing child failed: {type(e).__name__}"}
            report["tasks"][name] = {"configs": rows, "compile_seconds": round(t_compile, 1), "timing": timing,
                                     "flops_main": task.spec.flops(task.spec.main), "bytes_main": task.spec.bytes(task.spec.main)}
            print_task(name, task, rows, timing, default_id, gpu)

    path = out_dir / "check_kernels.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    failed = summary(report, gpu)
    print(f"wrote {path}; {time.time() - t_start:.0f} s")
    return 1 if failed else 0


def print_task(name, task, rows, timing, default_id, gpu) -> None:
    n = len(rows)
    n_comp = sum(r["compiled"] for r in rows.values())
    spills = [i for i, r in rows.items() if r["compiled"] and any(k.get("spill_stores", 0) for k in r["kernels"].values())]
    regs = [max((k.get("registers", 0) for k in r["kernels"].values()), default=0) for r in rows.values() if r["compiled"]]
    print(f"\n== {name}: {n_comp}/{n} configurations compiled; registers {min(regs, default=0)}-{max(regs, default=0)}; "
          f"{len(spills)} spill")
    for i in spills[:5]:
        print(f"   spills: {i} {rows[i]['kernels']}")
    for i, r in rows.items():
        if not r["compiled"] or r["plan_problems"]:
            print(f"   FAIL {i}: {r['error'] or r['plan_problems']}")
    d = rows[default_id]
    print(f"   default {default_id}: CTAs on main shape {d['ctas_main']}, smem {d['smem']} B, kernels {d['kernels']}")
    if not gpu:
        return
    bad = {i: r["parity"] for i, r in rows.items() if not r["parity"].get("ok")}
    print(f"   parity: {n - len(bad)}/{n} configurations pass every shape")
    for i, p in list(bad.items())[:8]:
        print(f"   PARITY FAIL {i}: {p.get('error') or p.get('skipped') or p.get('failures')}")
    if timing and "torch" in timing:
        fl, by = task.spec.flops(task.spec.main), task.spec.bytes(task.spec.main)
        for k in ("torch", "default", "best"):
            if k in timing:
                ms = timing[k]["median_ms"]
                perf = f"{fl / ms / 1e9:.1f} TFLOP/s" if fl else f"{by / ms / 1e6:.0f} GB/s"
                print(f"   {k:8s} median {ms * 1e3:9.1f} us  p90 {timing[k]['p90_ms'] * 1e3:9.1f} us  {perf}")
    elif timing:
        print(f"   timing: {timing}")


def summary(report, gpu) -> bool:
    failed = False
    parts = []
    for name, t in report["tasks"].items():
        rows = t["configs"].values()
        nc = sum(r["compiled"] and not r["plan_problems"] for r in rows)
        s = f"{name}: compiled+planned {nc}/{len(rows)}"
        failed |= nc != len(rows)
        if gpu:
            npass = sum(bool(r["parity"].get("ok")) for r in rows)
            failed |= npass != len(rows)
            s += f", parity {npass}/{len(rows)}"
            tm = t.get("timing") or {}
            if "default" in tm and "best" in tm and "torch" in tm:
                s += (f", default {tm['default']['median_ms'] * 1e3:.0f} us, best {tm['best']['median_ms'] * 1e3:.0f} us,"
                      f" torch {tm['torch']['median_ms'] * 1e3:.0f} us")
        parts.append(s)
    print("SUMMARY " + ("FAIL" if failed else "OK") + " | " + " | ".join(parts))
    return failed


if __name__ == "__main__":
    sys.exit(main())
