# KernelBench-format CUDA solution for fuse_problem (naive fused linear + ReLU, one thread per output, via load_inline), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

linear_relu_cuda_source = """
#include <torch/extension.h>

#define THREADS 256

__global__ void linear_relu_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                   const float* __restrict__ bias, float* __restrict__ out,
                                   int64_t batch, int64_t in_f, int64_t out_f) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= batch * out_f) {
        return;
    }
    const int64_t b = idx / out_f;
    const int64_t o = idx % out_f;
    float acc = bias[o];
    for (int64_t k = 0; k < in_f; ++k) {
        acc += x[b * in_f + k] * weight[o * in_f + k];
    }
    out[idx] = acc > 0.0f ? acc : 0.0f;
}

torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "linear_relu_forward: inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "linear_relu_forward: inputs must be float32");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1, "linear_relu_forward: bad ranks");
    TORCH_CHECK(x.size(1) == weight.size(1), "linear_relu_forward: in_features mismatch");
    TORCH_CHECK(bias.size(0) == weight.size(0), "linear_relu_forward: out_features mismatch");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();

    const int64_t batch = x.size(0);
    const int64_t in_f = x.size(1);
    const int64_t out_f = weight.size(0);
    auto out = torch::empty({batch, out_f}, x.options());
    const int64_t total = batch * out_f;
    if (total == 0) {
        return out;
    }
    const int64_t blocks = (total + THREADS - 1) / THREADS;
    linear_relu_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
        batch, in_f, out_f);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "linear_relu_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

linear_relu_cpp_source = "torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

linear_relu_module = load_inline(
    name="kb_test_fuse_cuda",
    cpp_sources=linear_relu_cpp_source,
    cuda_sources=linear_relu_cuda_source,
    functions=["linear_relu_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.linear_relu = linear_relu_module

    def forward(self, x):
        return self.linear_relu.linear_relu_forward(x, self.linear.weight, self.linear.bias)
