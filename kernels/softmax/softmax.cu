// Row softmax over the last dimension: y[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max)).
//
// x, y: (M, N) contiguous fp16; max, sum and exp in fp32. Memory-bound: the work is reading x and
// writing y. A CTA of THREADS threads owns ROWS_PER_CTA rows; each row is handled by a group of
// THREADS / ROWS_PER_CTA threads (shuffles inside a warp, shared memory across warps).
// Each row is read as a scalar head up to a (2*VEC)-byte boundary, a body of VEC-wide vectors and a
// scalar tail, so any N (odd ones too) is handled.
//
// The knobs below are moved by the agent; every combination allowed by task.toml's restrictions
// must compile and be correct. The committed values are honest and untuned: one row per CTA,
// scalar 2-byte loads, and three passes over x (max, sum, write).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define THREADS 128           // threads per CTA
#define ROWS_PER_CTA 1        // rows per CTA (THREADS / ROWS_PER_CTA threads per row)
#define VEC 1                 // halves per load/store: 1, 2, 4 or 8 (16 bytes)
#define ONLINE 0              // 1: one pass for (max, sum) with online rescaling, then the write pass

#define GROUP (THREADS / ROWS_PER_CTA)          // threads per row
#define NUM_WARPS (THREADS / 32)
#define GROUP_WARPS (GROUP >= 32 ? GROUP / 32 : 1)
#define WARP_WIDTH (GROUP >= 32 ? 32 : GROUP)   // shuffle width of a group's reduction inside a warp

static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: a multiple of 32, at most 1024");
static_assert(THREADS % ROWS_PER_CTA == 0 && (GROUP & (GROUP - 1)) == 0, "threads per row: a power of two");
static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC: 1, 2, 4 or 8");

template <int V> struct VecType;
template <> struct VecType<1> { using T = unsigned short; };
template <> struct VecType<2> { using T = unsigned int; };
template <> struct VecType<4> { using T = uint2; };
template <> struct VecType<8> { using T = uint4; };
union Pack {
    VecType<VEC>::T v;
    unsigned short u[VEC];
};

__device__ __forceinline__ float h2f(unsigned short u) { return __half2float(__ushort_as_half(u)); }
__device__ __forceinline__ unsigned short f2h(float f) { return __half_as_ushort(__float2half(f)); }

// How a row splits into a scalar head (up to a 2*VEC-byte boundary), VEC-wide vectors and a scalar tail.
struct RowSplit {
    int head, nvec, tail_start;
};
__device__ __forceinline__ RowSplit split_row(const __half* row, int n) {
    const int mis = (int)(((uintptr_t)row / 2) % VEC);   // elements past the last (2*VEC)-byte boundary
    const int head = min(n, (VEC - mis) % VEC);
    const int nvec = (n - head) / VEC;
    return {head, nvec, head + nvec * VEC};
}

// Calls f(value) for every element of the row this thread owns.
template <class F>
__device__ __forceinline__ void for_row(const __half* __restrict__ x, int n, int gl, F f) {
    const RowSplit sp = split_row(x, n);
    for (int i = gl; i < sp.head; i += GROUP) f(h2f(__half_as_ushort(x[i])));
    const VecType<VEC>::T* xv = reinterpret_cast<const VecType<VEC>::T*>(x + sp.head);
    for (int v = gl; v < sp.nvec; v += GROUP) {
        Pack p;
        p.v = xv[v];
#pragma unroll
        for (int e = 0; e < VEC; ++e) f(h2f(p.u[e]));
    }
    for (int i = sp.tail_start + gl; i < n; i += GROUP) f(h2f(__half_as_ushort(x[i])));
}

// Reductions over a row's group. All threads of the CTA call them the same number of times
// (rows past M take part with neutral values), so the __syncthreads inside are uniform.
__device__ __forceinline__ float group_max(float v, float* red) {
#pragma unroll
    for (int off = WARP_WIDTH / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
#if GROUP > 32
    const int w0 = (threadIdx.x / GROUP) * GROUP_WARPS;
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[w0];
    for (int w = 1; w < GROUP_WARPS; ++w) v = fmaxf(v, red[w0 + w]);
    __syncthreads();   // red is reused by the next reduction
#endif
    return v;
}

__device__ __forceinline__ float group_sum(float v, float* red) {
#pragma unroll
    for (int off = WARP_WIDTH / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
#if GROUP > 32
    const int w0 = (threadIdx.x / GROUP) * GROUP_WARPS;
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[w0];
    for (int w = 1; w < GROUP_WARPS; ++w) v += red[w0 + w];
    __syncthreads();
#endif
    return v;
}

__global__ void __launch_bounds__(THREADS, 1)
softmax_kernel(const __half* __restrict__ x, __half* __restrict__ y, int M, int N) {
    __shared__ float red[2][NUM_WARPS];
    const int gl = threadIdx.x % GROUP;
    const long long r = (long long)blockIdx.x * ROWS_PER_CTA + threadIdx.x / GROUP;
    const int n = r < M ? N : 0;                 // rows past M read nothing but join the reductions
    const __half* xr = x + (r < M ? r : 0) * (long long)N;
    __half* yr = y + (r < M ? r : 0) * (long long)N;

#if ONLINE
    float m = -INFINITY, s = 0.f;                // s = sum over this thread's elements of exp(x - m)
    for_row(xr, n, gl, [&](float v) {
        if (v > m) { s = s * __expf(m - v) + 1.f; m = v; }   // m = -inf: s * 0 + 1
        else if (v != -INFINITY) s += __expf(v - m);          // -inf while m is -inf: exp(-inf + inf) is NaN
    });
    const float m_row = group_max(m, red[0]);
    const float s_row = group_sum(m == -INFINITY ? 0.f : s * __expf(m - m_row), red[1]);
#else
    float m = -INFINITY;
    for_row(xr, n, gl, [&](float v) { m = fmaxf(m, v); });
    const float m_row = group_max(m, red[0]);
    float s = 0.f;
    for_row(xr, n, gl, [&](float v) { s += __expf(v - m_row); });
    const float s_row = group_sum(s, red[1]);
#endif
    const float inv = 1.f / s_row;

    // Write pass: the same head / vector / tail split for x and y where they share their alignment; a caller's
    // views need not (x[1:] beside a fresh y): then every element on its own, no vector touches a misaligned address.
    const bool same_phase = ((uintptr_t)xr - (uintptr_t)yr) % (2 * VEC) == 0;
    const RowSplit sp = same_phase ? split_row(xr, n) : RowSplit{n, 0, n};
    for (int i = gl; i < sp.head; i += GROUP) yr[i] = __float2half(__expf(__half2float(xr[i]) - m_row) * inv);
    const VecType<VEC>::T* xv = reinterpret_cast<const VecType<VEC>::T*>(xr + sp.head);
    VecType<VEC>::T* yv = reinterpret_cast<VecType<VEC>::T*>(yr + sp.head);
    for (int v = gl; v < sp.nvec; v += GROUP) {
        Pack p;
        p.v = xv[v];
#pragma unroll
        for (int e = 0; e < VEC; ++e) p.u[e] = f2h(__expf(h2f(p.u[e]) - m_row) * inv);
        yv[v] = p.v;
    }
    for (int i = sp.tail_start + gl; i < n; i += GROUP) yr[i] = __float2half(__expf(__half2float(xr[i]) - m_row) * inv);
}

// ---- C ABI --------------------------------------------------------------------------------------
// flags: unused (0).

// Launch geometry, 7 ints per launch (grid xyz, block xyz, dynamic smem bytes). Returns the number
// of launches (writes at most `cap`), or -1 for unsupported dimensions.
extern "C" int softmax_plan(int M, int N, int flags, int* out, int cap) {
    (void)flags;
    if (M <= 0 || N <= 0) return -1;
    const long long grid_x = ((long long)M + ROWS_PER_CTA - 1) / ROWS_PER_CTA;
    if (grid_x > 2147483647LL) return -1;
    const int plan[7] = {(int)grid_x, 1, 1, THREADS, 1, 1, 0};
    if (cap >= 1)
        for (int j = 0; j < 7; ++j) out[j] = plan[j];
    return 1;
}

// Returns a cudaError_t (0 = success); launches on `stream`. x and y may start at any element (a caller's
// view, x[1:]): each row's head is found from its own address; the write pass vectorizes only where x and y share
// their phase.
extern "C" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {
    int plan[7];
    if (softmax_plan(M, N, flags, plan, 1) != 1) return (int)cudaErrorInvalidValue;
    softmax_kernel<<<dim3(plan[0], plan[1], plan[2]), dim3(plan[3], plan[4], plan[5]), plan[6], stream>>>(
        static_cast<const __half*>(x), static_cast<__half*>(y), M, N);
    return (int)cudaGetLastError();
}
