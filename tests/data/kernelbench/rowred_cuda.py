# KernelBench-format CUDA solution for rowred_problem (one block per row, shared-memory tree sum, via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

row_rms_cuda_source = """
#include <torch/extension.h>

#define THREADS 256  // must be a power of two for the tree reduction

__global__ void row_rms_kernel(const float* __restrict__ x, float* __restrict__ out,
                               int64_t rows, int64_t cols) {
    __shared__ float partial[THREADS];
    const int64_t row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* row_ptr = x + row * cols;

    // Each thread accumulates a strided slice of the row, so any cols works.
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = row_ptr[c];
        acc += v * v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();

    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }

    if (threadIdx.x == 0) {
        out[row] = sqrtf(partial[0] / static_cast<float>(cols));
    }
}

torch::Tensor row_rms_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "row_rms_forward: input must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_rms_forward: input must be float32");
    TORCH_CHECK(x.dim() == 2, "row_rms_forward: input must be 2-D");
    x = x.contiguous();

    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    auto out = torch::empty({rows}, x.options());
    if (rows == 0) {
        return out;
    }
    row_rms_kernel<<<static_cast<unsigned int>(rows), THREADS>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "row_rms_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

row_rms_cpp_source = "torch::Tensor row_rms_forward(torch::Tensor x);"

row_rms_module = load_inline(
    name="kb_test_rowred_cuda",
    cpp_sources=row_rms_cpp_source,
    cuda_sources=row_rms_cuda_source,
    functions=["row_rms_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.row_rms = row_rms_module

    def forward(self, x):
        return self.row_rms.row_rms_forward(x)
