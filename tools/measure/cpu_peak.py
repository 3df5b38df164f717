"""This machine's measured CPU peaks, for "% of peak" beside a CPU kernel's figures (issue 63: a model on a CPU task got
no profile and no peak, and guessed how many FMA units the machine has).

A GPU's peaks come from its spec sheet (tools/measure/roofline.py spec_peak). A CPU's vary too much for a table (the
vector width, the FMA ports, the memory channels, SMT, what the container is given), so they are measured, once per
machine and compiler, on one thread, and cached:

- **FMA throughput**: fp32 fused multiply-adds on the widest vectors the compiler targets with -O3 -march=native
  (GCC's vector extensions: 512, 256 or 128 bits by what __AVX512F__ / __AVX__ say), enough independent accumulators
  to cover the FMA latency on two ports; 2 FLOP per lane.
- **Memory bandwidth**: a triad (a = b + s*c) over three 64 MiB arrays, far past the last-level cache; the bytes the
  loop names (3 x 4 B per element; a write-allocate's extra read is not counted, as STREAM does not).

Each is the best of several passes (a pass that another process shared the core with is slower, never faster). The
figures are a measured roofline, not hardware counters: what the machine let one thread do, which is what a
single-threaded kernel can reach. Measured in the agent's process (a judge child's HOME is its scratch directory, where
a cache would not last). Cache: $AGENT_CACHE, else $XDG_CACHE_HOME/kernel-agent, else ~/.cache/kernel-agent (the
precompiled header's root), cpu-peak-KEY.json, KEY a hash of the program, the compiler's version and the CPU's model
and flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tools.backends.pch import cache_root, compiler_id
from tools.results import DevicePeak

PROGRAM = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
#define ACC 16
#define ISA "AVX-512"
#elif defined(__AVX__)
typedef float vec __attribute__((vector_size(32)));
#define ACC 10
#define ISA "AVX2"
#else
typedef float vec __attribute__((vector_size(16)));
#define ACC 8
#define ISA "128-bit"
#endif
static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
    const int lanes = sizeof(vec) / sizeof(float);
    vec acc[ACC], a, b;
    for (int i = 0; i < ACC; ++i) for (int j = 0; j < lanes; ++j) acc[i][j] = 1.0f + 0.001f * (i + j);
    for (int j = 0; j < lanes; ++j) { a[j] = 0.9999999f; b[j] = 1e-7f; }
    const long iters = 20000000;
    double best_f = 0;
    for (int pass = 0; pass < 5; ++pass) {
        double t0 = now();
        for (long it = 0; it < iters; ++it)
            for (int i = 0; i < ACC; ++i) acc[i] = acc[i] * a + b;
        asm volatile("" : : "r"(acc) : "memory");   // acc escapes: computed before the clock is read, not after
        double t = now() - t0;
        double f = 2.0 * ACC * lanes * iters / t / 1e9;
        if (f > best_f) best_f = f;
    }
    float sink = 0;
    for (int i = 0; i < ACC; ++i) for (int j = 0; j < lanes; ++j) sink += acc[i][j];
    const size_t n = (size_t)16 << 20;     // 64 MiB a array
    std::vector<float> x(n, 1.0f), y(n, 2.0f), z(n, 0.5f);
    double best_b = 0;
    for (int pass = 0; pass < 6; ++pass) {
        const float s = 1.0f + pass * 1e-3f;
        double t0 = now();
        for (size_t i = 0; i < n; ++i) x[i] = y[i] + s * z[i];
        asm volatile("" : : "r"(x.data()) : "memory");
        double t = now() - t0;
        double g = 3.0 * 4.0 * n / t / 1e9;
        if (pass > 0 && g > best_b) best_b = g;     // the first pass also faults the pages in
        sink += x[pass];
    }
    std::printf("{\"gflops\": %.3f, \"gbps\": %.3f, \"isa\": \"%s\", \"lanes\": %d, \"sink\": %g}\n",
                best_f, best_b, ISA, lanes, (double)sink);
    return 0;
}
"""

FLAGS = ["-O3", "-march=native", "-std=c++17"]


def _cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    keep = [ln for ln in info.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(keep))


def cpu_peak(cxx: str | None = None, timeout_s: float = 120.0) -> DevicePeak | None:
    """This machine's one-thread fp32 FMA and triad peaks (the module docstring), from the cache or measured now; None
    where no compiler is found or the measurement fails (no figure is better than a made-up one)."""
    cxx = cxx or os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None
    version = compiler_id(cxx)
    key = hashlib.sha256("\0".join([PROGRAM, " ".join(FLAGS), version, _cpu_model()]).encode()).hexdigest()[:16]
    cache = cache_root() / f"cpu-peak-{key}.json"
    try:
        return DevicePeak.model_validate_json(cache.read_text())
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="agent-cpu-peak-") as d:
        src, exe = Path(d) / "peak.cpp", Path(d) / "peak"
        src.write_text(PROGRAM)
        try:
            subprocess.run([cxx, *FLAGS, str(src), "-o", str(exe)], check=True, capture_output=True, timeout=timeout_s)
            out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=timeout_s).stdout
            got = json.loads(out)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    if not (got.get("gflops", 0) > 0 and got.get("gbps", 0) > 0):
        return None
    peak = DevicePeak(tflops=got["gflops"] / 1e3, gbps=got["gbps"],
                      label=f"this CPU, measured on 1 thread: fp32 FMA on {got['lanes']}-lane {got['isa']} vectors, "
                            f"a triad over 3 x 64 MiB in DRAM, its bytes counted as STREAM counts them (a store's "
                            f"write-allocate read not counted); data held in cache can move faster")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(peak.model_dump_json())
        tmp.replace(cache)
    except OSError:
        pass
    return peak


def peak_for(task, peak: DevicePeak | None) -> DevicePeak | None:
    """A bench's peaks (a GPU's spec sheet), or for a CPU task this machine's measured ones."""
    return peak if peak is not None or task.backend.gpu else cpu_peak()
