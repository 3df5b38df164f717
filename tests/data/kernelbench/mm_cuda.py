# KernelBench-format CUDA solution for mm_problem (naive one-thread-per-output-element matmul via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_cuda_source = """
#include <torch/extension.h>

#define THREADS 256

__global__ void matmul_kernel(const float* __restrict__ A, const float* __restrict__ B,
                              float* __restrict__ C, int64_t M, int64_t K, int64_t N) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= M * N) {
        return;
    }
    const int64_t row = idx / N;
    const int64_t col = idx % N;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        acc += A[row * K + k] * B[k * N + col];
    }
    C[idx] = acc;
}

torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "matmul_forward: inputs must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "matmul_forward: inputs must be float32");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2, "matmul_forward: inputs must be 2-D");
    TORCH_CHECK(A.size(1) == B.size(0), "matmul_forward: inner dimensions must match");
    A = A.contiguous();
    B = B.contiguous();

    const int64_t M = A.size(0);
    const int64_t K = A.size(1);
    const int64_t N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    const int64_t total = M * N;
    if (total == 0) {
        return C;
    }
    const int64_t blocks = (total + THREADS - 1) / THREADS;
    matmul_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(
        A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, K, N);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "matmul_kernel launch failed: ", cudaGetErrorString(err));
    return C;
}
"""

matmul_cpp_source = "torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B);"

matmul_module = load_inline(
    name="kb_test_mm_cuda",
    cpp_sources=matmul_cpp_source,
    cuda_sources=matmul_cuda_source,
    functions=["matmul_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.matmul = matmul_module

    def forward(self, A, B):
        return self.matmul.matmul_forward(A, B)
