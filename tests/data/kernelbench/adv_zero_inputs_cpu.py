# Adversarial KernelBench-format CPU solution for ew_problem (computes the right output, then zeroes x and y in place), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cpp_source = """
#include <torch/extension.h>

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "fma_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "fma_forward: inputs must be contiguous");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");

    auto out = torch::empty_like(x);
    float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float xv = xp[i];
        const float yv = yp[i];
        op[i] = xv * yv + yv;
        // Clobber the inputs in place.
        xp[i] = 0.0f;
        yp[i] = 0.0f;
    }
    return out;
}
"""

fma_module = load_inline(
    name="kb_test_adv_zero_inputs_cpu",
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
