# KernelBench-format CUDA solution for ew_problem (naive one-thread-per-element kernel via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cuda_source = """
#include <torch/extension.h>

#define THREADS 256

__global__ void fma_kernel(const float* __restrict__ x, const float* __restrict__ y,
                           float* __restrict__ out, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * y[i] + y[i];
    }
}

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "fma_forward: inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");
    x = x.contiguous();
    y = y.contiguous();

    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) {
        return out;
    }
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    fma_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "fma_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

fma_cpp_source = "torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y);"

fma_module = load_inline(
    name="kb_test_ew_cuda",
    cpp_sources=fma_cpp_source,
    cuda_sources=fma_cuda_source,
    functions=["fma_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fma = fma_module

    def forward(self, x, y):
        return self.fma.fma_forward(x, y)
