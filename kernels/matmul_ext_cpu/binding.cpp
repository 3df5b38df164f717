// The Python face of the kernel, as a PyTorch C++ extension: forward(A, B) -> C.
// torch's headers make this the slow file to compile (about 25 s); it is not editable, so a run
// compiles it once and each candidate recompiles only matmul.cpp (about 1 s).
#include <torch/extension.h>

void matmul(const float* A, const float* B, float* C, int M, int N, int K);   // matmul.cpp

torch::Tensor forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "forward: need A[M,K] and B[K,N]");
    TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat, "forward: float32 only");
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "forward: CPU tensors only");
    auto A = a.contiguous(), B = b.contiguous();
    auto C = torch::empty({a.size(0), b.size(1)}, a.options());
    matmul(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(),
           (int)a.size(0), (int)b.size(1), (int)a.size(1));
    return C;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "C = A @ B in float32 on the CPU");
}
