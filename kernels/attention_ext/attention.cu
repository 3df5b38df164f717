// FlashAttention-style forward pass: O = softmax(Q K^T / sqrt(D) [+ causal mask]) V.
//
// Q, K, V, O: (B, H, S, D) contiguous fp16, D = 64; fp32 accumulation and softmax statistics.
// One CTA owns BLOCK_M query rows of one (batch, head). It keeps its Q tile in shared memory and
// streams K/V tiles of BLOCK_N rows through shared memory, updating an online softmax (running
// row max m, running sum l, unnormalized output o) per tile.
// With KV_SPLITS > 1 the KV loop of each query tile is split across KV_SPLITS CTAs (flash-decoding
// style): each writes (m, l, unnormalized o) to an fp32 workspace and a second kernel combines them.
//
// This is kernels/attention_fwd's kernel in the form a PyTorch user has it: a CUDA extension whose
// Python face, forward(q, k, v, is_causal), lives in binding.cpp (torch headers, compiled once per
// run); this file holds no torch header, so a one-line edit recompiles this file alone.
//
// The knobs below are moved by the agent; every combination allowed by task.toml's restrictions
// must compile and be correct. The committed values are honest and untuned: scalar FMA path,
// no padding (bank conflicts on the K tile), no KV split.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define BLOCK_M 64            // query rows per CTA
#define BLOCK_N 64            // KV rows per tile
#define NUM_WARPS 4           // warps per CTA
#define KV_SPLITS 1           // CTAs sharing one query tile's KV loop (>1 adds a combine kernel)
#define SMEM_PAD 0            // extra halves per shared-memory row (Q/K/V/P) and floats (S/O)
#define USE_TENSOR_CORES 0    // 1: WMMA (fp16 x fp16 -> fp32) for Q K^T and P V; needs SMEM_PAD % 8 == 0

#if USE_TENSOR_CORES
#include <mma.h>          // only when used: it costs a fifth of the rebuild time
#endif

#define HEAD_DIM 64
#define THREADS (NUM_WARPS * 32)
#define LDH (HEAD_DIM + SMEM_PAD)   // halves per row of the Q, K, V tiles
#define LDS (BLOCK_N + SMEM_PAD)    // floats per row of the score tile (raw scores, then P)
#define LDP (BLOCK_N + SMEM_PAD)    // halves per row of the fp16 P tile (tensor-core path)
#define LDO (HEAD_DIM + SMEM_PAD)   // floats per row of the O accumulator tile (tensor-core path)
#define ROWS_PER_WARP (BLOCK_M / NUM_WARPS)
#define COMBINE_ROWS 4              // rows per CTA of the combine kernel (HEAD_DIM threads per row)

static_assert(BLOCK_M % 16 == 0 && BLOCK_N % 16 == 0, "tiles are multiples of 16 rows");
static_assert(BLOCK_M % NUM_WARPS == 0, "each warp owns BLOCK_M / NUM_WARPS query rows");
static_assert(THREADS <= 1024, "at most 1024 threads per CTA");
static_assert(SMEM_PAD % 2 == 0, "rows must stay 4-byte aligned (half2 access)");
static_assert(!USE_TENSOR_CORES || SMEM_PAD % 8 == 0, "WMMA needs 16-byte aligned rows");
static_assert(USE_TENSOR_CORES || ROWS_PER_WARP <= 32, "scalar path keeps 2 * ROWS_PER_WARP accumulators per thread");

// Shared-memory layout (bytes), each region 128-byte aligned.
__host__ __device__ constexpr int align128(int x) { return (x + 127) / 128 * 128; }
constexpr int SM_Q = 0;
constexpr int SM_K = SM_Q + align128(BLOCK_M * LDH * 2);
constexpr int SM_V = SM_K + align128(BLOCK_N * LDH * 2);
constexpr int SM_S = SM_V + align128(BLOCK_N * LDH * 2);
constexpr int SM_P = SM_S + align128(BLOCK_M * LDS * 4);
constexpr int SM_O = SM_P + (USE_TENSOR_CORES ? align128(BLOCK_M * LDP * 2) : 0);
constexpr int SM_STATS = SM_O + (USE_TENSOR_CORES ? align128(BLOCK_M * LDO * 4) : 0);
constexpr int SMEM_BYTES = SM_STATS + align128(3 * BLOCK_M * 4);   // m, l, alpha per row

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Copy rows [row0, row0 + ROWS) of one head (HEAD_DIM halves each) into a padded shared tile;
// rows at or past S are zero-filled.
template <int ROWS>
__device__ __forceinline__ void load_tile(__half* __restrict__ dst, const __half* __restrict__ src, int row0, int S) {
    constexpr int CHUNKS = HEAD_DIM / 8;   // 16-byte chunks per row
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < S) val = *reinterpret_cast<const uint4*>(src + (size_t)(row0 + r) * HEAD_DIM + ch * 8);
        __half* d = dst + r * LDH + ch * 8;
#if SMEM_PAD % 8 == 0
        *reinterpret_cast<uint4*>(d) = val;
#else
        uint32_t* d32 = reinterpret_cast<uint32_t*>(d);   // padded rows are only 4-byte aligned
        d32[0] = val.x; d32[1] = val.y; d32[2] = val.z; d32[3] = val.w;
#endif
    }
}

__global__ void __launch_bounds__(THREADS, 1)
attention_fwd_kernel(const __half* __restrict__ Q, const __half* __restrict__ K, const __half* __restrict__ V,
                     __half* __restrict__ O, float* __restrict__ ws_o, float* __restrict__ ws_ml,
                     int S, int causal, float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem[];
    __half* Qs = reinterpret_cast<__half*>(smem + SM_Q);
    __half* Ks = reinterpret_cast<__half*>(smem + SM_K);
    __half* Vs = reinterpret_cast<__half*>(smem + SM_V);
    float* Ss = reinterpret_cast<float*>(smem + SM_S);
    float* m_s = reinterpret_cast<float*>(smem + SM_STATS);   // running max (log2 domain)
    float* l_s = m_s + BLOCK_M;                                // running sum of exp2(s - m)
    float* a_s = l_s + BLOCK_M;                                // this tile's rescale factor alpha
#if USE_TENSOR_CORES
    __half* Ps = reinterpret_cast<__half*>(smem + SM_P);
    float* Os = reinterpret_cast<float*>(smem + SM_O);
#endif

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_qt = (S + BLOCK_M - 1) / BLOCK_M;
    const int qt = blockIdx.x % n_qt;
    const int bh = blockIdx.x / n_qt;           // batch * H + head
    const int num_bh = gridDim.x / n_qt;
    const int q0 = qt * BLOCK_M;
    const int split = blockIdx.z, num_splits = gridDim.z;
    const size_t head_off = (size_t)bh * S * HEAD_DIM;

    // The KV tiles this CTA visits: causal rows never look past their own index.
    const int kv_end = causal ? min(S, q0 + BLOCK_M) : S;
    const int n_kv_tiles = (kv_end + BLOCK_N - 1) / BLOCK_N;
    const int tiles_per_split = (n_kv_tiles + num_splits - 1) / num_splits;
    const int t_begin = split * tiles_per_split;
    const int t_end = min(n_kv_tiles, t_begin + tiles_per_split);

    load_tile<BLOCK_M>(Qs, Q + head_off, q0, S);
    for (int r = tid; r < BLOCK_M; r += THREADS) { m_s[r] = -INFINITY; l_s[r] = 0.f; }
#if USE_TENSOR_CORES
    for (int e = tid; e < BLOCK_M * HEAD_DIM; e += THREADS) Os[(e / HEAD_DIM) * LDO + e % HEAD_DIM] = 0.f;
#else
    // Warp w owns rows w, w + NUM_WARPS, ...; lane owns output columns 2*lane and 2*lane + 1.
    float2 o[ROWS_PER_WARP];
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) o[i] = make_float2(0.f, 0.f);
#endif
    __syncthreads();

    for (int t = t_begin; t < t_end; ++t) {
        const int kv0 = t * BLOCK_N;
        load_tile<BLOCK_N>(Ks, K + head_off, kv0, S);
        load_tile<BLOCK_N>(Vs, V + head_off, kv0, S);
        __syncthreads();

        // 1. Raw scores Ss = Q K^T for the tile.
#if USE_TENSOR_CORES
        {
            using namespace nvcuda;
            constexpr int TN = BLOCK_N / 16;
            for (int tile = warp; tile < (BLOCK_M / 16) * TN; tile += NUM_WARPS) {
                const int tm = tile / TN, tn = tile % TN;
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::fill_fragment(acc, 0.f);
#pragma unroll
                for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;   // K^T
                    wmma::load_matrix_sync(a, Qs + tm * 16 * LDH + kk * 16, LDH);
                    wmma::load_matrix_sync(b, Ks + tn * 16 * LDH + kk * 16, LDH);
                    wmma::mma_sync(acc, a, b, acc);
                }
                wmma::store_matrix_sync(Ss + tm * 16 * LDS + tn * 16, acc, LDS, wmma::mem_row_major);
            }
        }
#else
        for (int e = tid; e < BLOCK_M * BLOCK_N; e += THREADS) {
            const int r = e / BLOCK_N, j = e % BLOCK_N;
            const __half2* q = reinterpret_cast<const __half2*>(Qs + r * LDH);
            const __half2* k = reinterpret_cast<const __half2*>(Ks + j * LDH);
            float acc = 0.f;
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 2; ++d) {
                const float2 a = __half22float2(q[d]), b = __half22float2(k[d]);
                acc = fmaf(a.x, b.x, acc);
                acc = fmaf(a.y, b.y, acc);
            }
            Ss[r * LDS + j] = acc;
        }
#endif
        __syncthreads();

        // 2. Online softmax, one warp per row: scale, mask, new max, P = exp2(s - m_new), rescale.
        for (int r = warp; r < BLOCK_M; r += NUM_WARPS) {
            const int qi = q0 + r;
            float* srow = Ss + r * LDS;
            float mx = -INFINITY;
            for (int j = lane; j < BLOCK_N; j += 32) {
                const int kj = kv0 + j;
                float s = srow[j] * scale_log2;
                if (kj >= S || (causal && kj > qi)) s = -INFINITY;
                srow[j] = s;
                mx = fmaxf(mx, s);
            }
            mx = warp_max(mx);
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, mx);
            // Every key so far masked: P = 0 and alpha = 0 (l and o are still 0), never exp2(-inf + inf).
            const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
            float sum = 0.f;
            for (int j = lane; j < BLOCK_N; j += 32) {
                const float p = exp2f(srow[j] - m_use);
                srow[j] = p;
#if USE_TENSOR_CORES
                Ps[r * LDP + j] = __float2half(p);
#endif
                sum += p;
            }
            sum = warp_sum(sum);
            const float alpha = exp2f(m_old - m_use);
#if USE_TENSOR_CORES
            for (int d = lane; d < HEAD_DIM; d += 32) Os[r * LDO + d] *= alpha;
#endif
            __syncwarp();
            if (lane == 0) {
                m_s[r] = m_new;
                l_s[r] = l_s[r] * alpha + sum;
                a_s[r] = alpha;
            }
        }
        __syncthreads();

        // 3. o = o * alpha + P V.
#if USE_TENSOR_CORES
        {
            using namespace nvcuda;
            constexpr int TD = HEAD_DIM / 16;
            for (int tile = warp; tile < (BLOCK_M / 16) * TD; tile += NUM_WARPS) {
                const int tm = tile / TD, tn = tile % TD;
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::load_matrix_sync(acc, Os + tm * 16 * LDO + tn * 16, LDO, wmma::mem_row_major);
#pragma unroll
                for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                    wmma::load_matrix_sync(a, Ps + tm * 16 * LDP + kk * 16, LDP);
                    wmma::load_matrix_sync(b, Vs + kk * 16 * LDH + tn * 16, LDH);
                    wmma::mma_sync(acc, a, b, acc);
                }
                wmma::store_matrix_sync(Os + tm * 16 * LDO + tn * 16, acc, LDO, wmma::mem_row_major);
            }
        }
#else
#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; ++i) {
            const int r = warp + i * NUM_WARPS;
            const float alpha = a_s[r];
            const float* prow = Ss + r * LDS;
            float2 acc = make_float2(o[i].x * alpha, o[i].y * alpha);
            for (int j = 0; j < BLOCK_N; ++j) {
                const float p = prow[j];
                const float2 v = __half22float2(reinterpret_cast<const __half2*>(Vs + j * LDH)[lane]);
                acc.x = fmaf(p, v.x, acc.x);
                acc.y = fmaf(p, v.y, acc.y);
            }
            o[i] = acc;
        }
#endif
        __syncthreads();   // the next tile overwrites Ks, Vs and Ss
    }

    // Epilogue: normalized fp16 output, or this split's partial (m, l, unnormalized o) in fp32.
#if USE_TENSOR_CORES
    for (int e = tid; e < BLOCK_M * (HEAD_DIM / 2); e += THREADS) {
        const int r = e / (HEAD_DIM / 2), c = e % (HEAD_DIM / 2);
        const float2 acc = make_float2(Os[r * LDO + 2 * c], Os[r * LDO + 2 * c + 1]);
#else
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) {
        const int r = warp + i * NUM_WARPS, c = lane;
        const float2 acc = o[i];
#endif
        const int qi = q0 + r;
        if (qi < S) {
            if (num_splits == 1) {
                const float l = l_s[r];
                const float inv = l > 0.f ? 1.f / l : 0.f;
                reinterpret_cast<__half2*>(O + head_off + (size_t)qi * HEAD_DIM)[c] =
                    __floats2half2_rn(acc.x * inv, acc.y * inv);
            } else {
                const size_t row = ((size_t)split * num_bh + bh) * S + qi;
                reinterpret_cast<float2*>(ws_o + row * HEAD_DIM)[c] = acc;
                if (c == 0) {
                    ws_ml[row * 2 + 0] = m_s[r];
                    ws_ml[row * 2 + 1] = l_s[r];
                }
            }
        }
    }
}

// Combine the KV splits of each row: m = max m_z, l = sum l_z 2^(m_z - m), O = sum o_z 2^(m_z - m) / l.
__global__ void __launch_bounds__(COMBINE_ROWS * HEAD_DIM)
attention_fwd_combine(const float* __restrict__ ws_o, const float* __restrict__ ws_ml, __half* __restrict__ O,
                      long long rows, int num_splits) {
    const long long row = (long long)blockIdx.x * COMBINE_ROWS + threadIdx.x / HEAD_DIM;
    const int d = threadIdx.x % HEAD_DIM;
    if (row >= rows) return;
    float m = -INFINITY;
    for (int z = 0; z < num_splits; ++z) m = fmaxf(m, ws_ml[(z * rows + row) * 2]);
    float l = 0.f, acc = 0.f;
    for (int z = 0; z < num_splits; ++z) {
        const float mz = ws_ml[(z * rows + row) * 2];
        const float w = (mz == -INFINITY) ? 0.f : exp2f(mz - m);   // an empty split contributes nothing
        l += w * ws_ml[(z * rows + row) * 2 + 1];
        acc += w * ws_o[(z * rows + row) * HEAD_DIM + d];
    }
    O[row * HEAD_DIM + d] = __float2half(l > 0.f ? acc / l : 0.f);
}

// ---- called from binding.cpp ---------------------------------------------------------------------
// flags: bit 0 = causal. There is no launch_plan: the launch check reads the geometry from a
// profiler trace of one call (tools/measure/launch.py).

// Launch geometry, 7 ints per launch (grid xyz, block xyz, dynamic smem bytes) in launch order.
// Returns the number of launches (writes at most `cap`), or -1 for unsupported dimensions.
static int launch_geometry(int B, int H, int S, int D, int* out, int cap) {
    if (B <= 0 || H <= 0 || S <= 0 || D != HEAD_DIM) return -1;
    const long long n_qt = (S + BLOCK_M - 1) / BLOCK_M;
    const long long grid_x = n_qt * B * H;
    const long long rows = (long long)B * H * S;
    const long long combine_x = (rows + COMBINE_ROWS - 1) / COMBINE_ROWS;
    if (grid_x > 2147483647LL || combine_x > 2147483647LL) return -1;
    const int plan[2][7] = {
        {(int)grid_x, 1, KV_SPLITS, THREADS, 1, 1, SMEM_BYTES},
        {(int)combine_x, 1, 1, COMBINE_ROWS * HEAD_DIM, 1, 1, 0},
    };
    const int n = KV_SPLITS > 1 ? 2 : 1;
    for (int i = 0; i < n && i < cap; ++i)
        for (int j = 0; j < 7; ++j) out[i * 7 + j] = plan[i][j];
    return n;
}

// fp32 workspace the caller must pass to attention_fwd_run (0 when KV_SPLITS == 1).
extern "C" long long attention_fwd_workspace_bytes(int B, int H, int S, int D, int flags) {
    (void)flags;
    if (B <= 0 || H <= 0 || S <= 0 || D != HEAD_DIM) return -1;
    if (KV_SPLITS == 1) return 0;
    return (long long)KV_SPLITS * B * H * S * (HEAD_DIM + 2) * 4;
}

// Returns a cudaError_t (0 = success); launches on `stream`.
extern "C" int attention_fwd_run(const void* q, const void* k, const void* v, void* o, void* workspace,
                                 long long workspace_bytes, int B, int H, int S, int D, int flags,
                                 cudaStream_t stream) {
    int plan[14];
    const int n = launch_geometry(B, H, S, D, plan, 2);
    if (n < 1) return (int)cudaErrorInvalidValue;
    const long long need = attention_fwd_workspace_bytes(B, H, S, D, flags);
    if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return (int)cudaErrorInvalidValue;
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)o | (uintptr_t)workspace) % 16 != 0)
        return (int)cudaErrorMisalignedAddress;
    if (plan[6] > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(attention_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan[6]);
        if (e != cudaSuccess) return (int)e;
    }
    const long long rows = (long long)B * H * S;
    float* ws_o = static_cast<float*>(workspace);
    float* ws_ml = need > 0 ? ws_o + (size_t)KV_SPLITS * rows * HEAD_DIM : nullptr;
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)HEAD_DIM);
    attention_fwd_kernel<<<dim3(plan[0], plan[1], plan[2]), dim3(plan[3], plan[4], plan[5]), plan[6], stream>>>(
        static_cast<const __half*>(q), static_cast<const __half*>(k), static_cast<const __half*>(v),
        static_cast<__half*>(o), ws_o, ws_ml, S, flags & 1, scale_log2);
    if (n > 1) {
        attention_fwd_combine<<<dim3(plan[7], plan[8], plan[9]), dim3(plan[10], plan[11], plan[12]), plan[13], stream>>>(
            ws_o, ws_ml, static_cast<__half*>(o), rows, KV_SPLITS);
    }
    return (int)cudaGetLastError();
}
