# KernelBench-format CPU solution for mm_problem (naive triple-loop C++ matmul via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_cpp_source = """
#include <torch/extension.h>

torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.device().is_cpu() && B.device().is_cpu(), "matmul_forward: inputs must be CPU tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "matmul_forward: inputs must be float32");
    TORCH_CHECK(A.is_contiguous() && B.is_contiguous(), "matmul_forward: inputs must be contiguous");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2, "matmul_forward: inputs must be 2-D");
    TORCH_CHECK(A.size(1) == B.size(0), "matmul_forward: inner dimensions must match");

    const int64_t M = A.size(0);
    const int64_t K = A.size(1);
    const int64_t N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    const float* a = A.data_ptr<float>();
    const float* b = B.data_ptr<float>();
    float* c = C.data_ptr<float>();
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                acc += a[i * K + k] * b[k * N + j];
            }
            c[i * N + j] = acc;
        }
    }
    return C;
}
"""

matmul_module = load_inline(
    name="kb_test_mm_cpu",
    cpp_sources=matmul_cpp_source,
    functions=["matmul_forward"],
    extra_cflags=["-O3", "-march=native"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.matmul = matmul_module

    def forward(self, A, B):
        return self.matmul.matmul_forward(A, B)
