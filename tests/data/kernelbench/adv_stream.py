# Adversarial KernelBench-format CUDA solution for ew_problem (correct kernel launched on a private non-blocking stream, never synchronized), written for this project's tests in KernelBench's format.
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
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "fma_forward: inputs must be contiguous");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");

    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) {
        return out;
    }
    const int64_t blocks = (n + THREADS - 1) / THREADS;

    // A private stream that does not synchronize with the legacy default stream:
    // events recorded on the default stream around this call do not wait for it.
    cudaStream_t s;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    TORCH_CHECK(err == cudaSuccess, "cudaStreamCreateWithFlags failed: ", cudaGetErrorString(err));
    fma_kernel<<<static_cast<unsigned int>(blocks), THREADS, 0, s>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "fma_kernel launch failed: ", cudaGetErrorString(err));
    // Returns immediately; queued work still runs. No synchronization here.
    cudaStreamDestroy(s);
    return out;
}
"""

fma_cpp_source = "torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y);"

fma_module = load_inline(
    name="kb_test_adv_stream",
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
