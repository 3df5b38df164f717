# KernelBench-format CPU solution for rowred_problem (naive C++ row RMS via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

row_rms_cpp_source = """
#include <torch/extension.h>
#include <cmath>

torch::Tensor row_rms_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "row_rms_forward: input must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_rms_forward: input must be float32");
    TORCH_CHECK(x.is_contiguous(), "row_rms_forward: input must be contiguous");
    TORCH_CHECK(x.dim() == 2, "row_rms_forward: input must be 2-D");

    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    auto out = torch::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        double acc = 0.0;
        const float* row = xp + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
            acc += static_cast<double>(row[c]) * static_cast<double>(row[c]);
        }
        op[r] = static_cast<float>(std::sqrt(acc / static_cast<double>(cols)));
    }
    return out;
}
"""

row_rms_module = load_inline(
    name="kb_test_rowred_cpu",
    cpp_sources=row_rms_cpp_source,
    functions=["row_rms_forward"],
    extra_cflags=["-O3", "-march=native"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.row_rms = row_rms_module

    def forward(self, x):
        return self.row_rms.row_rms_forward(x)
