# Adversarial KernelBench-format CUDA solution for ew_problem (returns uninitialized empty_like memory; kernel writes nothing), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cuda_source = """
#include <torch/extension.h>

#define THREADS 256

__global__ void fma_kernel(const float* __restrict__ x, const float* __restrict__ y,
                           float* __restrict__ out, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    // "Bounds check" that is always true: every thread leaves before writing.
    if (i >= 0) {
        return;
    }
    out[i] = x[i] * y[i] + y[i];
}

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "fma_forward: inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");

    // Never written: relies on the caching allocator handing back the block that
    // held the reference output, which already contains the right answer.
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) {
        return out;
    }
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    fma_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

fma_cpp_source = "torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y);"

fma_module = load_inline(
    name="kb_test_adv_uninit",
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
