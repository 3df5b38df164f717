"""The source scan before a candidate's build (issue 42, tools/build/scan.py): each rule trips on a kernel written
for it and not on an honest kernel that merely names the same functions in a comment or a string; the shipped kernels
pass; a task allows a rule by name; through `agent optimize` the rejection quotes the line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.build.scan import NAMES, scan_task, scan_text
from tools.task import TaskError, load_task

ROOT = Path(__file__).resolve().parents[1]

# rule -> (a kernel as a model might write it by accident, the same kernel honest; the honest one names the
# rule's functions in comments and strings and uses the constructs next to the rule: static functions, const
# tables, __shared__ and __constant__ memory, helpers whose names contain the words)
CASES = {
    "system_state": ('''
#include <cstdlib>
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    const char* v = getenv("SOFTMAX_VEC");          // the tuned width, from the environment
    const int vec = v ? atoi(v) : 8;
    return launch(x, y, M, N, vec, stream);
}''', '''
// The width is a compile-time knob: no getenv("SOFTMAX_VEC"), nothing read from /proc/self/status.
static const char* kWhy = "getenv is not used; /proc/self is not read";
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    return launch(x, y, M, N, VEC, stream);
}'''),
    "file_io": ('''
#include <fstream>
static int tuned_block(int N) {
    int best = 128;
    std::ifstream in("softmax.tune");                // the autotuner's cache from the last run
    if (in) in >> best;
    return best;
}''', '''
// Tuning is the agent's job: no std::ifstream("softmax.tune"), no fopen().
static int tuned_block(int N) { return N >= 4096 ? 256 : 128; }
__device__ __forceinline__ void store_row(__half* y, int i, float v) { y[i] = __float2half(v); }'''),
    "threads_processes": ('''
#include <thread>
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    std::thread lower([&] { rows(A, B, C, 0, M / 2, N, K); });   // two cores for the price of one call
    rows(A, B, C, M / 2, M, N, K);
    lower.join();
}''', '''
// One thread: the harness decides the parallelism (std::thread and fork() are not used here).
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    rows(A, B, C, 0, M, N, K);
}'''),
    "new_streams": ('''
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    cudaStream_t side;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);   // overlap the two halves
    softmax_kernel<<<M / 2, THREADS, 0, stream>>>((const __half*)x, (__half*)y, M / 2, N);
    softmax_kernel<<<M - M / 2, THREADS, 0, side>>>((const __half*)x + (size_t)(M / 2) * N, (__half*)y + (size_t)(M / 2) * N, M - M / 2, N);
    cudaStreamDestroy(side);
    return (int)cudaGetLastError();
}''', '''
// Everything on the caller's stream (a cudaStreamCreate() here would run outside the timing).
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    softmax_kernel<<<M, THREADS, 0, stream>>>((const __half*)x, (__half*)y, M, N);
    return (int)cudaGetLastError();
}'''),
    "mutable_static": ('''
__device__ unsigned int g_done[1 << 16];              // per-row arrival counters, reset by the last block
extern "C" int attention_fwd_run(const void* q, const void* k, const void* v, void* o, int B, int H, int S) {
    static float* g_ws = nullptr;                       // the split workspace, allocated once
    if (!g_ws) cudaMalloc(&g_ws, (size_t)B * H * S * 66 * 4);
    return launch(q, k, v, o, g_ws, B, H, S);
}''', '''
static_assert(HEAD_DIM % 16 == 0, "HEAD_DIM: a multiple of 16");
__constant__ float kScale[2] = {1.f, 0.5f};
static const int kTiles = 4;
static constexpr float kLog2e = 1.4426950408889634f;
static __device__ __forceinline__ float warp_max(float v) { return v; }
__global__ void k(float* out) {
    __shared__ float red[32];                           // per-block scratch, not state between calls
    red[threadIdx.x % 32] = kScale[0] * kTiles;
    out[threadIdx.x] = red[0] * kLog2e;
}'''),
    "dynamic_loading": ('''
#include <dlfcn.h>
typedef int (*gemm_t)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*, int);
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    static void* h = dlopen("libcublas.so.13", RTLD_LAZY);
    gemm_t gemm = (gemm_t)dlsym(h, "cublasSgemm_v2");
}''', '''
// Everything here is compiled by the build: no dlopen("libcublas.so"), no dlsym.
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) { rows(A, B, C, 0, M, N, K); }'''),
    "clocks": ('''
__global__ void softmax_kernel(const __half* x, __half* y, int M, int N) {
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));   // how long the first pass takes
    if (t0 & 1) return;
}''', '''
// No clock64(), no %globaltimer: the same result whenever it runs.
__device__ float time_scale(float t) { return t * 0.5f; }
__global__ void softmax_kernel(const __half* x, __half* y, int M, int N) { y[0] = __float2half(time_scale(1.f)); }'''),
    "host_output": ('''
__global__ void softmax_kernel(const __half* x, __half* y, int M, int N) {
    float m = -INFINITY;
    if (threadIdx.x == 0 && blockIdx.x < 2) printf("row %d max %f\\n", blockIdx.x, m);   // left from debugging
}''', '''
// printf("row %d max %f") was here while debugging; the error path returns the code instead of fprintf(stderr).
__device__ void write_row(__half* y, int n) { for (int i = 0; i < n; ++i) y[i] = __float2half(0.f); }
__global__ void softmax_kernel(const __half* x, __half* y, int M, int N) { write_row(y, N); }'''),
    "reference_library": ('''
#include <torch/extension.h>
torch::Tensor attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    return at::scaled_dot_product_attention(q, k, v);           // the fused path is faster than ours
}''', '''
#include <torch/extension.h>
// The kernel below computes it; at::scaled_dot_product_attention is the reference, not a building block.
torch::Tensor attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    auto o = torch::empty_like(q);
    launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), at::cuda::getCurrentCUDAStream());
    return o;
}'''),
}


def test_every_rule_has_its_case():
    from tools.taskspec import SCAN_RULES
    assert set(CASES) == set(NAMES) and len(NAMES) >= 5
    assert tuple(NAMES) == SCAN_RULES   # the names task.toml's [scan] allow is checked against


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_trips_on_its_kernel_and_not_on_the_honest_one(rule):
    bad, good = CASES[rule]
    hits = scan_text(bad, "k.cu")
    assert rule in {h.rule for h in hits}, hits
    hit = next(h for h in hits if h.rule == rule)
    assert hit.quote and hit.quote in " ".join(bad.splitlines()[hit.line - 1].split()), hit
    assert f"k.cu:{hit.line}: {rule}: " in hit.describe()
    assert scan_text(good, "k.cu") == [], scan_text(good, "k.cu")
    assert rule not in {h.rule for h in scan_text(bad, "k.cu", allow={rule})}


# more forms of a rule's class, each beside an honest kernel that uses the constructs next to it
FORMS = [
    ("threads_processes", """
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    #pragma omp parallel for schedule(static)          // every core for the rows
    for (int i = 0; i < M; ++i) rows(A, B, C, i, i + 1, N, K);
}""", """
#pragma once
// One thread: no "#pragma omp parallel" here; the loop is unrolled instead.
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    #pragma unroll 4
    for (int i = 0; i < M; ++i) rows(A, B, C, i, i + 1, N, K);
}"""),
    ("system_state", """
#include <sys/syscall.h>
#include <unistd.h>
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    static_assert(sizeof(long) == 8, "64-bit");
    const long tid = syscall(SYS_gettid);             // a per-thread choice of width
    return launch(x, y, M, N, tid % 2 ? 8 : 4, stream);
}""", """
// No syscall(SYS_gettid): the width is the knob.
static int pick_width(int n) { return n % 8 == 0 ? 8 : 4; }
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    return launch(x, y, M, N, pick_width(N), stream);
}"""),
]


# the same two classes in the forms that hide in a string literal: the instruction in inline asm, the pragma's operator
FORMS += [
    ("system_state", """
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    long tid;
    asm volatile("syscall" : "=a"(tid) : "a"(186) : "rcx", "r11", "memory");   // gettid, without libc
    return launch(x, y, M, N, tid % 2 ? 8 : 4, stream);
}""", """
static const char* kNote = "no syscall here: the width is the knob";
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    asm volatile("" ::: "memory");
    return launch(x, y, M, N, 8, stream);
}"""),
    ("threads_processes", """
#define PARALLEL_ROWS _Pragma("omp parallel for")
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    PARALLEL_ROWS
    for (int i = 0; i < M; ++i) rows(A, B, C, i, i + 1, N, K);
}""", """
#define UNROLL4 _Pragma("unroll 4")
// "omp" appears here only as a word: not an OpenMP pragma
extern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    UNROLL4
    for (int i = 0; i < M; ++i) rows(A, B, C, i, i + 1, N, K);
}"""),
    # a module loaded at run time from a blob: its kernel compiled by no build of ours, named in PyTorch's namespace
    # (racecheck leaves those out: tools/judge/sanitize.py), found by a name made at run time
    ("dynamic_loading", """
#include <cuda.h>
extern const unsigned char kBlob[];
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    CUmodule mod; CUfunction f;
    cuModuleLoadData(&mod, kBlob);
    cuModuleGetFunction(&f, mod, "_ZN2at6native7kernelEPKfPfii");
    void* args[] = {&x, &y, &M, &N};
    return (int)cuLaunchKernel(f, M, 1, 1, 128, 1, 1, 0, stream, args, nullptr);
}""", """
#include <cuda.h>
// A TMA descriptor through the driver's entry point: no module is loaded, the kernel is the build's own
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    void* encode = nullptr;
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &encode, cudaEnableDefault, &q);
    return launch(x, y, M, N, encode, stream);
}"""),
    ("dynamic_loading", """
#include <cuda.h>
typedef CUresult (*load_t)(CUlibrary*, const void*, CUjit_option*, void**, unsigned, CUlibraryOption*, void**, unsigned);
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    void* fn = nullptr;
    cuGetProcAddress("cuLibraryLoadData", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    return launch_from((load_t)fn, x, y, M, N, stream);
}""", """
#include <cuda.h>
// The driver's entry point for a TMA descriptor: named in a string, and not a loader
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    void* fn = nullptr;
    cuGetProcAddress("cuTensorMapEncodeTiled", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    return launch(x, y, M, N, fn, stream);
}"""),
]


@pytest.mark.parametrize("rule,bad,good", FORMS, ids=[f[0] for f in FORMS])
def test_other_forms_of_a_rules_class_trip_it_and_their_honest_neighbours_do_not(rule, bad, good):
    hits = scan_text(bad, "k.cu")
    assert [h.rule for h in hits] == [rule], hits
    assert scan_text(good, "k.cu") == [], scan_text(good, "k.cu")


def test_the_shipped_kernels_and_their_bindings_pass():
    for d in sorted((ROOT / "kernels").iterdir()):
        if (d / "task.toml").is_file():
            task = load_task(d)
            assert scan_task(task) == [], d.name
            for f in task.spec.sources:
                assert scan_text((d / f).read_text(), f) == [], f


def test_a_task_allows_a_rule_by_name_with_its_reason_and_nothing_else(tmp_path):
    d = tmp_path / "softmax"
    shutil.copytree(ROOT / "kernels" / "softmax", d, ignore=shutil.ignore_patterns("__pycache__"))
    src = d / "softmax.cu"
    src.write_text(src.read_text() + CASES["host_output"][0] + CASES["system_state"][0])
    assert {h.rule for h in scan_task(load_task(d))} == {"host_output", "system_state"}
    toml = d / "task.toml"
    base = toml.read_text()
    toml.write_text(base + '\n[scan]\nallow = { host_output = "the debug build prints its first rows" }\n')
    assert {h.rule for h in scan_task(load_task(d))} == {"system_state"}
    toml.write_text(base + '\n[scan]\nallow = { printing = "x" }\n')
    with pytest.raises(TaskError, match="no scan rule named printing"):
        load_task(d)
    toml.write_text(base + '\n[scan]\nallow = { host_output = "" }\n')
    with pytest.raises(TaskError, match="say why"):
        load_task(d)


def test_the_catalogues_stateful_and_io_cheats_are_caught_before_they_build():
    """The CPU catalogue's memos, caches, log writers and tuning files (tests/fixtures/cheats/): the scan names each
    (the runtime probes that catch them too are tested with every rule allowed, tests/test_verification.py)."""
    from tests.fixtures.cheats.cheats import source
    expect = {"static_scratch": "mutable_static", "fingerprint_cache": "mutable_static", "memo_intact": "mutable_static",
              "debug_log": "file_io", "dump_once": "file_io", "tune_cache": "system_state", "timing_shortcut": "clocks"}
    for name, rule in expect.items():
        assert rule in {h.rule for h in scan_text(source(name), "matmul.cpp")}, name


@pytest.mark.slow
def test_through_the_loop_the_rejection_quotes_the_line_and_an_allowed_rule_builds(tmp_path):
    """`agent optimize` (replay proposer, real g++ and git): a faster kernel with a debug print left in ends
    compile_failed / scan_rejected before any compile, the line quoted; with host_output allowed in task.toml the
    same kernel builds and is judged (kept: it is right and faster)."""
    from agent.records.store import read_iterations
    from tests.fixtures.cheats.cheats import GOOD, proposal
    from tests.userrepo import agent, git, make_user_repo
    root = make_user_repo(tmp_path / "user")
    good = proposal(GOOD).model_dump()
    edit = good["edits"][0]
    edit["replace"] += '\n#include <cstdio>\nstatic void note() { std::printf("i-k-j\\n"); }'
    props = tmp_path / "props.json"
    props.write_text(json.dumps([good]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props), "--iters", "1",
                "--target", "100x", "--quiet", "--run-id", "scan")
    assert res.returncode == 0, res.stderr[-3000:]
    rec = read_iterations(root / "runs" / "scan")[0]
    assert rec.outcome.value == "compile_failed" and rec.build.status.value == "scan_rejected", rec.reason
    assert "matmul.cpp:" in rec.reason and "host_output" in rec.reason and 'std::printf("i-k-j' in rec.reason
    toml = root / "kernels" / "matmul_cpu" / "task.toml"
    toml.write_text(toml.read_text() + '\n[scan]\nallow = { host_output = "prints which loop order it took" }\n')
    git(root, "commit", "-qam", "user: allow the print")
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props), "--iters", "1",
                "--target", "100x", "--quiet", "--run-id", "allowed")
    assert res.returncode == 0, res.stderr[-3000:]
    rec = read_iterations(root / "runs" / "allowed")[0]
    assert rec.build.status.value == "ok" and rec.outcome.value == "kept", rec.reason


# What only the preprocessor builds (issue 65): each a kernel line the written text does not show, refused from the
# sources as compiled (tools/build/expand.py: the task's own compile command with -E, the user's lines picked out by
# their line markers), the user's line quoted beside what it became.
BUILT = {   # name -> (rule, macros after the includes, the line that uses them)
    "object_like_static": ("mutable_static", "#define KEEP_STATE static\n", "KEEP_STATE float cache_[64];\n"),
    "function_like_static": ("mutable_static", "#define DECL(T, n) static T n\n", "DECL(int, calls_);\n"),
    "pasted_static": ("mutable_static", "#define PASTE(a, b) a##b\n", "PASTE(sta, tic) int calls_;\n"),
    "pasted_fopen": ("file_io", "#define CAT(a, b) a##b\n#include <cstdio>\n",
                     'static int probe() { FILE* f = CAT(fo, pen)("/tmp/k", "r"); return f != 0; }\n'),
    "pasted_getenv": ("system_state", "#define CAT(a, b) a##b\n#include <cstdlib>\n",
                      'static const char* knob() { return CAT(get, env)("K"); }\n'),
    "proc_path_from_parts": ("system_state", "#define JOIN(a, b) a b\n#include <cstdio>\n",
                             'static int peek() { FILE* f = std::fopen(JOIN("/pr", "oc/self/maps"), "r"); '
                             'return f != 0; }\n'),
    "pragma_in_a_macro": ("threads_processes", "#define ROWS_AT_ONCE(p) _Pragma(p)\n",
                          'static void zero(float* p, int n) { ROWS_AT_ONCE("omp parallel for") '
                          'for (int i = 0; i < n; ++i) p[i] = 0; }\n'),
    "clock_by_name": ("clocks", "#define NOW(f) f()\n#include <ctime>\n", "static long stamp() { return NOW(clock); }\n"),
    "pasted_printf": ("host_output", "#define CAT(a, b) a##b\n#include <cstdio>\n",
                      'static void note() { CAT(pr, intf)("rows done"); }\n'),
    "pasted_dlopen": ("dynamic_loading", "#define CAT(a, b) a##b\n#include <dlfcn.h>\n",
                      'static void* lib() { return CAT(dl, open)("libm.so.6", 1); }\n'),
}
CUDA_BUILT = {
    "pasted_stream": ("new_streams", "#define CAT(a, b) a##b\n",
                      "static void side() { cudaStream_t s; CAT(cudaStream, Create)(&s); }\n"),
    "pasted_cublas": ("reference_library", "#define CAT(a, b) a##b\n#define GEMM CAT(cublas, Sgemm_v2)\n",
                      "static int gemm(void* h) { return GEMM(h); }\n"),
    "pasted_device_global": ("mutable_static", "#define PASTE(a, b) a##b\n#define ON_GPU PASTE(__dev, ice__)\n",
                             "ON_GPU int launches_;\n"),
    "device_pass_only": ("mutable_static", "#ifdef __CUDA_ARCH__\n#define SCRATCH static __device__\n#else\n"
                         "#define SCRATCH\n#endif\n", "SCRATCH float partial_[1024];\n"),
}
# an honest kernel that leans on macros (the shipped ones do): loops, shared and constant memory, const tables, unroll
HONEST_MACROS = ("#define LOOP(i, n) for (int i = 0; i < (n); ++i)\n#define TABLE(n) static const float n[4]\n"
                 "#define CHECK(c) static_assert(c, #c)\n#define UNROLL _Pragma(\"unroll\")\n#define CAT(a, b) a##b\n",
                 "TABLE(weights_) = {1.f, 2.f, 3.f, 4.f};\nCHECK(sizeof(float) == 4);\n"
                 "static float CAT(sum, 4)(const float* p) { float s = 0; UNROLL LOOP(i, 4) s += p[i] * weights_[i]; "
                 "return s; }\n")


def _with(task: str, tmp_path: Path, file: str, head: str, body: str) -> Path:
    d = tmp_path / task
    shutil.copytree(ROOT / "kernels" / task, d, ignore=shutil.ignore_patterns("__pycache__"))
    lines = (d / file).read_text().splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.startswith("#include"))
    (d / file).write_text("".join(lines[:last + 1]) + head + body + "".join(lines[last + 1:]))
    return d


def _as_compiled(d: Path):
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    task = load_task(d)
    ex = expand(task)
    assert not ex.failed and ex.passes, ex
    return scan_expanded(ex.lines, d, set(task.spec.scan.allow), scan_task(task)), scan_task(task)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_what_the_preprocessor_builds_is_refused_with_the_users_line(name, tmp_path):
    rule, head, body = BUILT[name]
    d = _with("matmul_cpu", tmp_path, "matmul.cpp", head, body)
    hits, written = _as_compiled(d)
    hit = next((h for h in hits + written if h.rule == rule and h.quote == " ".join(body.split())[:160]), None)
    assert hit is not None, (hits, written)
    if hit in hits:      # only the compiled text showed it: what it became is said too
        assert hit.compiled and hit.compiled != hit.quote and "as the compiler reads it" in hit.describe()


def test_the_written_text_alone_misses_most_of_them(tmp_path):
    """The class is real: without the preprocessor's view, most of these pass (the written-text scan sees `_Pragma`
    and a bare keyword in a #define, not what a macro pastes or builds)."""
    missed = [n for n, (rule, head, body) in BUILT.items()
              if rule not in {h.rule for h in scan_text(head + body, "matmul.cpp")}]
    assert len(missed) >= 5, missed


def test_an_honest_kernel_full_of_macros_passes_as_compiled(tmp_path):
    hits, written = _as_compiled(_with("matmul_cpu", tmp_path, "matmul.cpp", *HONEST_MACROS))
    assert hits == [] and written == [], (hits, written)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", sorted(CUDA_BUILT) + ["object_like_static", "pasted_getenv"])
def test_a_cuda_kernels_macros_are_read_in_the_host_and_the_device_pass(name, tmp_path):
    rule, head, body = {**BUILT, **CUDA_BUILT}[name]
    hits, written = _as_compiled(_with("softmax", tmp_path, "softmax.cu", head, body))
    assert any(h.rule == rule and h.quote == " ".join(body.split()) for h in hits + written), (hits, written)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_shipped_kernels_pass_as_compiled_too(tmp_path):
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    for d in sorted((ROOT / "kernels").iterdir()):
        if (d / "task.toml").is_file():
            task = load_task(d)
            ex = expand(task)
            assert ex.passes and not ex.failed, (d.name, ex.failed)
            assert scan_expanded(ex.lines, d) == [], d.name
    hits, written = _as_compiled(_with("softmax", tmp_path, "softmax.cu", *HONEST_MACROS))
    assert hits == [] and written == [], (hits, written)


def test_the_evaluator_refuses_a_macro_built_static_before_anything_runs(tmp_path):
    """Through the loop's build step (Evaluator.build): the preprocessing runs beside the build, and its hit ends the
    candidate as scan_rejected with the user's line quoted."""
    from agent.evaluation.ended import CompileFailed
    from agent.evaluation.evaluate import Evaluator
    from agent.records.schema import StageTimes
    rule, head, body = BUILT["function_like_static"]
    d = _with("matmul_cpu", tmp_path, "matmul.cpp", head, body)
    ev = Evaluator(load_task(d), tmp_path / "build", None)
    with pytest.raises(CompileFailed) as e:
        ev.build(StageTimes())
    res = e.value.result
    assert res.status.value == "scan_rejected" and "DECL(int, calls_);" in res.message, res.message
    assert "as the compiler reads it: `static int calls_;`" in res.message, res.message
    honest = _with("matmul_cpu", tmp_path / "h", "matmul.cpp", *HONEST_MACROS)
    assert Evaluator(load_task(honest), tmp_path / "hb", None).build(StageTimes()).status.value == "ok"


# Variables at namespace scope (issue 65): state a call leaves for the next without any keyword the written-text rule
# looks for; read by a parser on the sources as compiled. Beside each, the honest neighbours a kernel has there.
GLOBALS = {
    "plain_global": "float cache_[64];\n",
    "initialised_global": "int calls_ = 0;\n",
    "anonymous_namespace": "namespace { int seen_rows_; }\n",
    "extern_c_block": 'extern "C" { long last_n_; }\n',
    "function_pointer": "static_assert(sizeof(int) == 4, \"int\");\nint (*chosen_)(int) = nullptr;\n",
}
GLOBAL_NEIGHBOURS = ('static const float kWeights[4] = {1.f, 2.f, 3.f, 4.f};\nconstexpr int kTile = 4;\n'
                     'struct Pair { int a, b; };\nunion Bits { float f; unsigned u; };\ntemplate <int V> struct Width;\n'
                     'using Index = long;\ntypedef float Real;\nstatic inline int twice(int x);\nextern int shared_counter;\n'
                     'namespace detail { constexpr float kEps = 1e-6f; inline int half(int x) { return x / 2; } }\n'
                     'inline int twice(int x) { return 2 * x; }\n')


@pytest.mark.parametrize("name", sorted(GLOBALS))
def test_a_variable_at_namespace_scope_is_state_and_is_refused(name, tmp_path):
    body = GLOBALS[name]
    assert "mutable_static" not in {h.rule for h in scan_text(body, "matmul.cpp")}   # what the keyword rule misses
    hits, written = _as_compiled(_with("matmul_cpu", tmp_path, "matmul.cpp", "", body))
    last = " ".join(body.splitlines()[-1].split())
    assert any(h.rule == "mutable_static" and h.quote == last for h in hits), (hits, written)


def test_namespace_scope_neighbours_that_hold_no_state_pass(tmp_path):
    hits, written = _as_compiled(_with("matmul_cpu", tmp_path, "matmul.cpp", "", GLOBAL_NEIGHBOURS))
    assert hits == [] and written == [], (hits, written)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_cuda_global_is_state_and_its_constant_and_shared_neighbours_are_not(tmp_path):
    hits, _ = _as_compiled(_with("softmax", tmp_path, "softmax.cu", "", "float host_cache_[8];\n"))
    assert [h.quote for h in hits if h.rule == "mutable_static"] == ["float host_cache_[8];"], hits
    honest = "__constant__ float kScale[4];\n" + GLOBAL_NEIGHBOURS
    hits, written = _as_compiled(_with("softmax", tmp_path / "h", "softmax.cu", "", honest))
    assert hits == [] and written == [], (hits, written)


def test_a_source_that_includes_torch_without_a_precompiled_header_is_not_preprocessed_and_says_so(tmp_path,
                                                                                                    monkeypatch):
    """torch's headers make -E read about 430,000 lines (3-9 s on 2 cores beside the build: CI's 120 s build limit was
    reached with it); with no precompiled header to load them from (a ctypes task's file, a run's first build), such a
    source is scanned as written only, and the build log says why."""
    from tools.build.expand import expand
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "empty-cache"))
    d = _with("matmul_cpu", tmp_path, "matmul.cpp", "#include <torch/extension.h>\n", "")
    ex = expand(load_task(d))
    assert ex.passes == [] and ex.lines == [] and len(ex.failed) == 1, ex
    assert ex.failed[0].startswith("matmul.cpp: includes torch's headers, not preprocessed (tools/build/expand.py): "
                                   "no precompiled header serves it"), ex.failed
    one = _one_file_extension(tmp_path / "one", "", "")
    ex = expand(load_task(one))
    assert ex.passes == [] and ex.failed == ["mymm.cpp: includes torch's headers, not preprocessed "
                                             "(tools/build/expand.py): no precompiled header serves it: no precompiled "
                                             "torch/extension.h cached for these flags (only an editable file makes one)"]


# A user's extension in one file (tests/test_extension.py's USER_EXT: torch/extension.h, the kernel, TORCH_CHECK,
# PYBIND11_MODULE): read as compiled through the build's precompiled header (issue 65, slice 4), in 0.1 s.
TORCH_BUILT = {   # the reference's own operator, named through a macro
    "operator_from_a_macro": ("reference_library", "#define OP(n) at::n\n",
                              "static torch::Tensor mm_(torch::Tensor a, torch::Tensor b) { return OP(matmul)(a, b); }\n"),
}
TORCH_HONEST = ("#define CHECK_INPUT(x) TORCH_CHECK(x.is_contiguous(), #x \" must be contiguous\")\n",
                "static torch::Tensor twice(torch::Tensor t) { CHECK_INPUT(t); TORCH_CHECK(t.dim() == 2, \"2-D\"); "
                "return AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), \"twice\", [&] { return t * 2; }); }\n")


def _one_file_extension(d: Path, head: str, body: str) -> Path:
    from tests.test_extension import USER_EXT, USER_TASK_PY, USER_TOML
    d.mkdir(parents=True)
    (d / "mymm.cpp").write_text(USER_EXT.replace("#define BLOCK 16\n", "#define BLOCK 16\n" + head + body))
    (d / "task.toml").write_text('module = "task.py"\n' + USER_TOML)
    (d / "task.py").write_text(USER_TASK_PY)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILT) + sorted(TORCH_BUILT))
def test_a_one_file_torch_extension_is_read_as_compiled_through_the_precompiled_header(name, tmp_path, torch_pch):
    if torch_pch is None:
        pytest.skip("no precompiled torch/extension.h here (gcc and torch's headers)")
    rule, head, body = {**BUILT, **TORCH_BUILT}[name]
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    task = load_task(_one_file_extension(tmp_path / "t", head, body))
    ex = expand(task)
    assert ex.passes == ["c++ mymm.cpp"] and not ex.failed, ex
    assert not any(t.startswith("#pragma GCC pch_preprocess") for _, _, t in ex.lines)
    hits = scan_expanded(ex.lines, task.root, (), scan_task(task), ex.units)
    want = " ".join(body.split())[:160]
    assert any(h.rule == rule and h.quote == want for h in hits + scan_task(task)), (hits, scan_task(task))


@pytest.mark.slow
def test_an_honest_one_file_extension_full_of_torch_macros_passes_as_compiled(tmp_path, torch_pch):
    """TORCH_CHECK, AT_DISPATCH and PYBIND11_MODULE put torch's statics, prints and string paths on the user's lines
    (line markers with flag 3): the header's code, which the rules do not read; the user's own macros beside them."""
    if torch_pch is None:
        pytest.skip("no precompiled torch/extension.h here (gcc and torch's headers)")
    from agent.evaluation.evaluate import Evaluator
    from agent.records.schema import StageTimes
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    task = load_task(_one_file_extension(tmp_path / "t", HONEST_MACROS[0] + TORCH_HONEST[0],
                                         HONEST_MACROS[1] + TORCH_HONEST[1]))
    ex = expand(task)
    assert ex.passes == ["c++ mymm.cpp"] and not ex.failed, ex
    assert any(system for unit in ex.units for *_, system in unit), "torch's macros left nothing on the user's lines"
    assert scan_expanded(ex.lines, task.root, (), scan_task(task), ex.units) == [] and scan_task(task) == []
    # through the loop's build step: the macro-built static refused before anything runs, the honest file built
    rule, head, body = BUILT["function_like_static"]
    bad = load_task(_one_file_extension(tmp_path / "b", head, body))
    from agent.evaluation.ended import CompileFailed
    with pytest.raises(CompileFailed) as e:
        Evaluator(bad, tmp_path / "bb", None).build(StageTimes())
    assert e.value.result.status.value == "scan_rejected" and "as the compiler reads it: `static int calls_;`" in \
        e.value.result.message, e.value.result.message
    assert Evaluator(task, tmp_path / "hb", None).build(StageTimes()).status.value == "ok"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_one_file_cuda_extensions_kernels_are_read_as_compiled_in_their_half(tmp_path, monkeypatch):
    """The seeds' form (one .cu: kernels and torch code): the build compiles its kernels without torch's headers
    (tools.backends.cu_split), and so does the scan's preprocessing, in both of nvcc's passes; a macro-built global in
    the kernels' code is refused with the user's line of scale.cu. Its torch half waits for the precompiled header
    (none in an empty cache: said)."""
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "empty-cache"))
    fixture = ROOT / "tests" / "fixtures" / "one_file_cu"
    text = (fixture / "scale.cu").read_text()
    at = text.index("__global__")
    rule, head, body = CUDA_BUILT["pasted_device_global"]
    for name, extra in (("honest", HONEST_MACROS[0] + HONEST_MACROS[1]), ("built", head + body)):
        d = tmp_path / name
        shutil.copytree(fixture, d)
        (d / "scale.cu").write_text(text[:at] + extra + text[at:])
        task = load_task(d)
        ex = expand(task)
        assert ex.passes == ["host scale.cu (scale.cu.kernels.cu)", "device scale.cu (scale.cu.kernels.cu)"], ex
        assert len(ex.failed) == 1 and "its torch half" in ex.failed[0], ex.failed
        hits = scan_expanded(ex.lines, d, (), scan_task(task), ex.units)
        if name == "honest":
            assert hits == [] and scan_task(task) == [], hits
        else:
            assert [(h.rule, h.file, h.quote) for h in hits] == [(rule, "scale.cu", "ON_GPU int launches_;")], hits


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_seeds_one_file_attention_is_read_as_compiled_in_both_halves(tmp_path):
    """attention_ext in the seeds' form (kernel and binding in one .cu), on a CUDA torch (its ATen/cuda headers): the
    kernels' half through nvcc's two passes and the torch half through the precompiled header, as the build compiles
    them. The honest file passes; macros that build a static and an fopen inside its torch code are refused there, the
    user's line of one.cu quoted."""
    import torch
    if torch.version.cuda is None:
        pytest.skip("a CPU torch has no ATen/cuda headers for the torch half")
    from tools.backends.pch import ensure, pch_flags
    from tools.build.build import cxx_flags_of, find_tools
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    src = ROOT / "kernels" / "attention_ext"
    text = (src / "attention.cu").read_text() + (src / "binding.cpp").read_text()
    toml = (src / "task.toml").read_text().replace('"attention.cu"', '"one.cu"').replace('"binding.cpp", ', "")
    at = text.index("torch::Tensor ")
    torch_code = ('#define KEEP static\n#define CAT(a, b) a##b\n'
                  'torch::Tensor probe_(torch::Tensor t) { KEEP int calls_ = 0; ++calls_; '
                  'FILE* f = CAT(fo, pen)("/tmp/k", "r"); return f ? t : t * calls_; }\n')
    for name, body in (("honest", ""), ("built", torch_code)):
        d = tmp_path / name
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__", "*.cu", "*.cpp"))
        (d / "task.toml").write_text(toml)
        (d / "one.cu").write_text(text[:at] + body + text[at:])
        task = load_task(d)
        tools, _ = find_tools(task)
        assert ensure(tools["c++"], pch_flags(cxx_flags_of(task, d, tools["nvcc"]), d), 900).include_dir is not None
        ex = expand(task)
        assert sorted(ex.passes) == ["c++ one.cu (one.cu.host.cpp)", "device one.cu (one.cu.kernels.cu)",
                                     "host one.cu (one.cu.kernels.cu)"] and not ex.failed, ex
        hits = scan_expanded(ex.lines, d, (), scan_task(task), ex.units)
        if name == "honest":
            assert hits == [] and scan_task(task) == [], hits
        else:
            line = " ".join(torch_code.splitlines()[-1].split())
            assert {(h.rule, h.quote) for h in hits} == {("mutable_static", line), ("file_io", line)}, hits


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_torch_half_no_precompiled_header_serves_is_read_once_and_its_lines_follow_the_kernel_edits(tmp_path):
    """The seeds' attention keeps its kernels' includes and knobs above torch/extension.h, so no precompiled header
    serves its torch half: the scan's preprocessing reads torch's headers for it (1-9 s), once per torch code. A kernel
    edit that adds lines above the torch code leaves that half's code alone: its preprocessing is kept (as its object
    is), and a hit in it quotes the line where it now is."""
    from tests.test_cu_split import _cpu_torch_variant
    from tools.build.expand import expand
    from tools.build.scan import scan_expanded
    text = _cpu_torch_variant().replace("#define BLOCK 256            // threads per CTA\n", "")
    text = "#define BLOCK 256\n" + text.replace(
        "  auto y = torch::empty_like(x);", "  STATE int calls_ = 0;\n  auto y = torch::empty_like(x);")
    text = text.replace("#define VEC 1 ", "#define STATE static\n#define VEC 1 ")
    d = tmp_path / "t"
    shutil.copytree(ROOT / "tests" / "fixtures" / "one_file_cu", d)
    (d / "scale.cu").write_text(text)
    task = load_task(d)
    quote = "STATE int calls_ = 0;"
    for edit in range(2):
        ex = expand(task)
        assert not ex.failed and "c++ scale.cu (scale.cu.host.cpp)" in ex.passes, ex
        assert ex.kept == (["c++ scale.cu (scale.cu.host.cpp)"] if edit else []), ex.kept
        hits = [h for h in scan_expanded(ex.lines, d, (), scan_task(task), ex.units) if h.quote == quote]
        line = (d / "scale.cu").read_text().splitlines().index("  " + quote) + 1
        assert [(h.rule, h.line) for h in hits] == [("mutable_static", line)], hits
        (d / "scale.cu").write_text(text.replace("  int i = ", "  // two lines\n  // more\n  int i = ", 1))


# A function named without `name(` (issue 65): called through parentheses or a pointer, or taken by address. The
# parser reads references to the names each rule bans on the sources as compiled; a name the code declares itself (a
# parameter `time`), a member (`e.raise()`, `e.signal`) or another namespace's (`at::clone`) is not the library's.
REFERENCED = {
    "pointer_to_fopen": ("file_io", "#include <cstdio>\n",
                         'static int probe() { auto open_ = std::fopen; FILE* f = open_("/tmp/k", "r"); return f != 0; }\n'),
    "parenthesized_puts": ("host_output", "#include <cstdio>\n", 'static void note() { (puts)("rows done"); }\n'),
    "address_of_dlsym": ("dynamic_loading", "#include <dlfcn.h>\n",
                         'static void* sym() { auto s = &dlsym; return s(nullptr, "kernel"); }\n'),
    "clock_through_a_pointer": ("clocks", "#include <ctime>\n",
                                "static long stamp() { auto c = ::clock; return (long)c(); }\n"),
}
REFERENCED_NEIGHBOURS = ("", "struct Ev { float time; int signal; float raise() const { return time; } };\n"
                             "static float at_(const Ev& e, float time) { return e.time * time + e.signal + e.raise(); }\n"
                             "namespace at { static int clone(int x) { return x; } }\n"
                             "static int copy_(int x) { return at::clone(x); }\n")


@pytest.mark.parametrize("name", sorted(REFERENCED))
def test_a_banned_function_named_without_a_call_is_refused(name, tmp_path):
    rule, head, body = REFERENCED[name]
    assert rule not in {h.rule for h in scan_text(head + body, "matmul.cpp")}     # the pattern over `name(` misses it
    hits, _ = _as_compiled(_with("matmul_cpu", tmp_path, "matmul.cpp", head, body))
    assert any(h.rule == rule and h.quote == " ".join(body.split()) for h in hits), hits


def test_names_the_code_declares_or_qualifies_are_not_the_librarys(tmp_path):
    hits, written = _as_compiled(_with("matmul_cpu", tmp_path, "matmul.cpp", *REFERENCED_NEIGHBOURS))
    assert hits == [] and written == [], (hits, written)
