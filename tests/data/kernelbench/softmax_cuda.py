# KernelBench-format CUDA solution for softmax_problem (naive one block per row, three passes with shared-memory reductions, via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_cuda_source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cmath>

// THREADS: block size, a power of two from 32 to 1024.
// VEC: consecutive elements each thread handles per step of the strided loops.
#define THREADS 128
#define VEC 1

static_assert(THREADS >= 1 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "THREADS must be a power of two no larger than 1024");
static_assert(VEC >= 1, "VEC must be at least 1");

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out,
                               int64_t rows, int64_t cols) {
    __shared__ float red[THREADS];
    const int64_t row = blockIdx.x;
    if (row >= rows) {
        return;  // same for every thread of the block, so no barrier is skipped by only some
    }
    const float* row_in = x + row * cols;
    float* row_out = out + row * cols;
    const int tid = threadIdx.x;
    const int64_t start = static_cast<int64_t>(tid) * VEC;
    const int64_t step = static_cast<int64_t>(THREADS) * VEC;

    // Pass 1: row maximum. Thread tid owns elements [base, base + VEC) of every
    // step-sized chunk; the per-element check covers any cols, odd ones included.
    float local_max = -INFINITY;
    for (int64_t base = start; base < cols; base += step) {
        for (int v = 0; v < VEC; ++v) {
            const int64_t c = base + v;
            if (c < cols) {
                local_max = fmaxf(local_max, row_in[c]);
            }
        }
    }
    red[tid] = local_max;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) {
            red[tid] = fmaxf(red[tid], red[tid + stride]);
        }
        __syncthreads();
    }
    const float row_max = red[0];
    __syncthreads();  // every thread has read red[0] before red is reused

    // Pass 2: sum of exp(x - max).
    float local_sum = 0.0f;
    for (int64_t base = start; base < cols; base += step) {
        for (int v = 0; v < VEC; ++v) {
            const int64_t c = base + v;
            if (c < cols) {
                local_sum += expf(row_in[c] - row_max);
            }
        }
    }
    red[tid] = local_sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) {
            red[tid] += red[tid + stride];
        }
        __syncthreads();
    }
    const float row_sum = red[0];

    // Pass 3: write exp(x - max) / sum.
    for (int64_t base = start; base < cols; base += step) {
        for (int v = 0; v < VEC; ++v) {
            const int64_t c = base + v;
            if (c < cols) {
                row_out[c] = expf(row_in[c] - row_max) / row_sum;
            }
        }
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "softmax_forward: input must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_forward: input must be float32");
    TORCH_CHECK(x.dim() == 2, "softmax_forward: input must be 2-D");
    x = x.contiguous();

    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    TORCH_CHECK(rows <= 2147483647LL, "softmax_forward: too many rows for one block per row");
    auto out = torch::empty_like(x);
    if (rows == 0 || cols == 0) {
        return out;
    }
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    softmax_kernel<<<static_cast<unsigned int>(rows), THREADS, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "softmax_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

softmax_cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

softmax_module = load_inline(
    name="kb_test_softmax_cuda",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_cuda_source,
    functions=["softmax_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = softmax_module

    def forward(self, x):
        return self.softmax.softmax_forward(x)
