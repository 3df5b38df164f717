# KernelBench-format CPU solution for fuse_problem (naive C++ fused linear + ReLU via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

linear_relu_cpp_source = """
#include <torch/extension.h>

torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu(),
                "linear_relu_forward: inputs must be CPU tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "linear_relu_forward: inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && bias.is_contiguous(),
                "linear_relu_forward: inputs must be contiguous");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1, "linear_relu_forward: bad ranks");
    TORCH_CHECK(x.size(1) == weight.size(1), "linear_relu_forward: in_features mismatch");
    TORCH_CHECK(bias.size(0) == weight.size(0), "linear_relu_forward: out_features mismatch");

    const int64_t batch = x.size(0);
    const int64_t in_f = x.size(1);
    const int64_t out_f = weight.size(0);
    auto out = torch::empty({batch, out_f}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t o = 0; o < out_f; ++o) {
            float acc = bp[o];
            for (int64_t k = 0; k < in_f; ++k) {
                acc += xp[b * in_f + k] * wp[o * in_f + k];
            }
            op[b * out_f + o] = acc > 0.0f ? acc : 0.0f;
        }
    }
    return out;
}
"""

linear_relu_module = load_inline(
    name="kb_test_fuse_cpu",
    cpp_sources=linear_relu_cpp_source,
    functions=["linear_relu_forward"],
    extra_cflags=["-O3", "-march=native"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.linear_relu = linear_relu_module

    def forward(self, x):
        return self.linear_relu.linear_relu_forward(x, self.linear.weight, self.linear.bias)
