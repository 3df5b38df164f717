# Adversarial KernelBench-format CPU solution for ew_problem (returns torch::empty_like(x) without ever writing it), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cpp_source = """
#include <torch/extension.h>

torch::Tensor fma_forward(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "fma_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "fma_forward: inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes(), "fma_forward: x and y must have the same shape");

    // Never written: whatever the allocator hands back is returned as the answer.
    auto out = torch::empty_like(x);
    return out;
}
"""

fma_module = load_inline(
    name="kb_test_adv_uninit_cpu",
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
