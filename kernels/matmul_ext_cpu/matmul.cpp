// Blocked float32 matmul, C[M,N] = A[M,K] @ B[K,N], all row-major: the kernel of the extension
// The knobs below are moved by the agent; every value in task.toml must compile and be correct.
#include <cstddef>

#define LOOP_ORDER 0
#define BLOCK_M 16
#define BLOCK_N 16
#define BLOCK_K 16

static inline int min_int(int a, int b) { return a < b ? a : b; }

void matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
            int M, int N, int K) {
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[(size_t)i * N + j] = 0.0f;

    for (int i0 = 0; i0 < M; i0 += BLOCK_M) {
        const int i1 = min_int(i0 + BLOCK_M, M);
        for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
            const int k1 = min_int(k0 + BLOCK_K, K);
            for (int j0 = 0; j0 < N; j0 += BLOCK_N) {
                const int j1 = min_int(j0 + BLOCK_N, N);
#if LOOP_ORDER == 0
                for (int i = i0; i < i1; ++i)
                    for (int j = j0; j < j1; ++j) {
                        float acc = C[(size_t)i * N + j];
                        for (int k = k0; k < k1; ++k) acc += A[(size_t)i * K + k] * B[(size_t)k * N + j];
                        C[(size_t)i * N + j] = acc;
                    }
#else
                for (int i = i0; i < i1; ++i)
                    for (int k = k0; k < k1; ++k) {
                        const float a = A[(size_t)i * K + k];
                        const float* __restrict__ b = B + (size_t)k * N;
                        float* __restrict__ c = C + (size_t)i * N;
                        for (int j = j0; j < j1; ++j) c[j] += a * b[j];
                    }
#endif
            }
        }
    }
}
