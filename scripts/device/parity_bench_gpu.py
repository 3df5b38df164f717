"""GPU validation of tools/measure/parity.py and tools/measure/bench.py, in one go (run from the repo root on the GPU box):

    python scripts/device/parity_bench_gpu.py

Builds a small CUDA task (out = 2*x + y, float32) in a temp folder with nvcc, plus faulty variants:
unmasked tail (writes past the end), far out-of-bounds write (illegal address), a launch of 2048
threads (checked: the launcher returns the error; unchecked: nothing runs), a computed NaN, and a
kernel on its own side stream (events miss it). Runs each through run_parity, then: the correct
kernel vs itself (CI must contain 1), the side-stream kernel through bench (must be suspicious),
and 5 repeated run_bench of the correct kernel (the repeatability figure: spread of the medians).
Writes $OUT/parity_bench_gpu.json; prints a summary last. Exit code 0 when every expectation held.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.measure.bench import run_bench      # noqa: E402
from tools.measure.parity import run_parity    # noqa: E402
from tools.task import load_task       # noqa: E402

TOML = """
name = "saxpy_gpu_check"
device = "cuda"
sources = ["saxpy.cu"]
editable = ["saxpy.cu"]
dtypes = ["float32"]
distributions = ["normal", "uniform"]
main_shape = 2
shapes = [ { n = 4096 }, { n = 1000003 }, { n = 67108864 } ]
[tolerance.float32]
atol = 1e-5
rtol = 1e-5
[metrics]
flops = "2*n"
bytes = "12*n"
[parity]
seeds = 2
hidden_shapes = 2
timeout_s = 120
[bench]
warmup_ms = 25
rep_ms = 100
rounds = 10
input_sets = 4
timeout_s = 300
"""

TASK_PY = '''
import ctypes
import torch


def make_inputs(shape, seed, device, dist):
    g = torch.Generator(device=device).manual_seed(seed)
    n = shape["n"]
    if dist == "normal":
        return torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
    return (torch.rand(n, generator=g, device=device) * 2 - 1, torch.rand(n, generator=g, device=device) * 2 - 1)


def reference(shape, x, y):
    return (2.0 * x.double() + y.double()).float()


def empty_output(shape, x, y):
    return torch.empty_like(x)


def run(lib, shape, out, x, y):
    err = lib.saxpy_run(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                        ctypes.c_long(shape["n"]), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err:
        raise RuntimeError(f"saxpy_run returned CUDA error {err}")


def hidden_shapes(rng):
    return [{"n": rng.randint(1000, 3000000)} for _ in range(2)]
'''

KERNEL = '''
#include <cuda_runtime.h>
__global__ void saxpy(const float* x, const float* y, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    %(body)s
}
extern "C" int saxpy_run(const float* x, const float* y, float* out, long n, cudaStream_t stream) {
    int threads = %(threads)s;
    long blocks = (n + 255) / 256;
    %(launch)s
    return %(ret)s;
}
'''
GOOD = {"body": "if (i < n) out[i] = 2.0f * x[i] + y[i];", "threads": "256",
        "launch": "saxpy<<<blocks, threads, 0, stream>>>(x, y, out, n);", "ret": "(int)cudaGetLastError()"}
VARIANTS = {
    "correct": ({}, "ok"),
    "oob_tail": ({"body": "out[i] = (i < n) ? 2.0f * x[i] + y[i] : 0.0f;"}, "out_of_bounds"),
    "oob_far": ({"body": "if (i < n) out[i + (1L << 36)] = 1.0f; if (i < n) out[i] = 2.0f * x[i] + y[i];"}, "error"),
    "threads2048": ({"threads": "2048"}, "error"),
    # a statically linked cudart keeps its own last-error: torch should not see it, so nothing ran -> unwritten
    "threads2048_unchecked": ({"threads": "2048", "ret": "0"}, "unwritten|error"),
    "nan": ({"body": "if (i < n) out[i] = (i == n / 2) ? __int_as_float(0x7fc00000) : 2.0f * x[i] + y[i];"},
            "nan_inf"),
    "side_stream": ({"launch": "static cudaStream_t s = nullptr; if (!s) cudaStreamCreateWithFlags(&s, "
                               "cudaStreamNonBlocking); saxpy<<<blocks, threads, 0, s>>>(x, y, out, n);"}, "ok"),
}


def build(root: Path, name: str, overrides: dict) -> Path:
    src = root / f"{name}.cu"
    src.write_text(KERNEL % {**GOOD, **overrides})
    lib = root / f"lib{name}.so"
    subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True, text=True)
    return lib


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="saxpy_gpu_"))
    (root / "task.toml").write_text(TOML)
    (root / "task.py").write_text(TASK_PY)
    (root / "saxpy.cu").write_text(KERNEL % GOOD)
    task = load_task(root)
    libs = {name: build(root, name, ov) for name, (ov, _) in VARIANTS.items()}
    report: dict = {"parity": {}, "bench": {}}
    failures: list[str] = []
    for name, (_, expect) in VARIANTS.items():
        t0 = time.monotonic()
        r = run_parity(task, libs[name])
        report["parity"][name] = {"expect": expect, "status": r.status.value, "message": r.message,
                                  "seconds": round(time.monotonic() - t0, 2)}
        if r.status.value not in expect.split("|"):
            failures.append(f"parity {name}: expected {expect}, got {r.status.value}: {r.message[:200]}")

    shape = [dict(task.spec.main)]
    [self_r] = run_bench(task, libs["correct"], baseline_lib=libs["correct"], shapes=shape)
    report["bench"]["self"] = self_r.model_dump(mode="json")
    ci = self_r.speedup_vs_baseline
    if self_r.status.value != "ok" or ci is None or not ci.low <= 1.0 <= ci.high:
        failures.append(f"bench self: {self_r.status.value} {ci}: {self_r.message}")
    [side] = run_bench(task, libs["side_stream"], shapes=shape, with_reference=False)
    report["bench"]["side_stream"] = side.model_dump(mode="json")
    if side.status.value != "suspicious":
        failures.append(f"bench side_stream: expected suspicious, got {side.status.value}: {side.message}")

    medians, refs = [], []
    for _ in range(5):
        [r] = run_bench(task, libs["correct"], shapes=shape)
        report["bench"].setdefault("repeats", []).append(r.model_dump(mode="json"))
        if r.status.value == "ok":
            medians.append(r.timing("candidate").median_ms)
            refs.append(r.timing("reference").median_ms)
        else:
            failures.append(f"bench repeat: {r.status.value}: {r.message}")
    if medians:
        spread = (max(medians) - min(medians)) / statistics.median(medians) * 100
        report["bench"]["repeatability"] = {"medians_ms": medians, "spread_pct": spread, "reference_ms": refs,
                                            "gbps": report["bench"]["repeats"][0]["timings"][0]["gbps"]}
    report["failures"] = failures
    (out_dir / "parity_bench_gpu.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(root, ignore_errors=True)

    for name, p in report["parity"].items():
        print(f"parity {name:22s} expect {p['expect']:16s} got {p['status']:14s} {p['seconds']:6.1f}s  {p['message'][:110]}")
    print(f"bench self      : {self_r.status.value} speedup {ci.median:.4f} CI {ci.low:.4f}-{ci.high:.4f}" if ci
          else f"bench self: {self_r.status.value} {self_r.message}")
    print(f"bench side_stream: {side.status.value}: {side.message[:160]}")
    if medians:
        rep = report["bench"]["repeatability"]
        print(f"repeatability   : 5 medians {['%.4f' % m for m in medians]} ms, spread {rep['spread_pct']:.2f}%, "
              f"{rep['gbps']:.0f} GB/s; reference median {statistics.median(refs):.4f} ms")
    print(f"SUMMARY: {'ALL EXPECTATIONS HELD' if not failures else str(len(failures)) + ' FAILED: ' + ' | '.join(failures)}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
