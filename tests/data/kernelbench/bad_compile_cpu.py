# Bad KernelBench-format CPU solution for ew_problem (its C++ fails to compile: undeclared identifier), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cpp_source = """
#include <torch/extension.h>

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    auto out = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        op[i] = xp[i] * yp[i] + y_bias[i];  // y_bias is never declared
    }
    return out;
}
"""

fma_module = load_inline(
    name="kb_test_bad_compile_cpu",
    cpp_sources=fma_cpp_source,
    functions=["fma_forward"],
    extra_cflags=["-O3", "-march=native"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fma = fma_module

    def forward(self, x, y):
        return self.fma.fma_forward(x, y)
