# KernelBench-format CPU solution for ew_problem (C++ loop manually unrolled by UNROLL with a tail loop, via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cpp_source = """
#include <torch/extension.h>

// UNROLL: elements handled per step of the main loop (any value >= 1).
#define UNROLL 1

static_assert(UNROLL >= 1, "UNROLL must be at least 1");

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "fma_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "fma_forward: inputs must be contiguous");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");

    auto out = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t n = x.numel();
    const int64_t main_end = n - n % UNROLL;
    // Main loop: UNROLL elements per step.
    for (int64_t i = 0; i < main_end; i += UNROLL) {
        for (int u = 0; u < UNROLL; ++u) {
            op[i + u] = xp[i + u] * yp[i + u] + yp[i + u];
        }
    }
    // Tail: the remaining n % UNROLL elements.
    for (int64_t i = main_end; i < n; ++i) {
        op[i] = xp[i] * yp[i] + yp[i];
    }
    return out;
}
"""

fma_module = load_inline(
    name="kb_test_ew_cpu_unroll",
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
