// The Python face of the attention kernel, as a PyTorch CUDA extension:
//     forward(q, k, v, is_causal=False) -> o        q, k, v: (B, H, S, 64) contiguous fp16 on one GPU
// torch's headers make this the slow file to compile (15-25 s); it is not editable, so a run compiles
// it once and each candidate recompiles only attention.cu (no torch header) and links.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

extern "C" long long attention_fwd_workspace_bytes(int B, int H, int S, int D, int flags);
extern "C" int attention_fwd_run(const void* q, const void* k, const void* v, void* o, void* workspace,
                                 long long workspace_bytes, int B, int H, int S, int D, int flags,
                                 cudaStream_t stream);

torch::Tensor forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool is_causal) {
    TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "forward: q, k, v must be CUDA tensors");
    TORCH_CHECK(q.scalar_type() == torch::kHalf && k.scalar_type() == torch::kHalf && v.scalar_type() == torch::kHalf,
                "forward: q, k, v must be float16");
    TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
                "forward: q, k, v must be (B, H, S, D) of one shape");
    auto Q = q.contiguous(), K = k.contiguous(), V = v.contiguous();
    const int B = (int)q.size(0), H = (int)q.size(1), S = (int)q.size(2), D = (int)q.size(3);
    const int flags = is_causal ? 1 : 0;
    const long long ws_bytes = attention_fwd_workspace_bytes(B, H, S, D, flags);
    TORCH_CHECK(ws_bytes >= 0, "forward: unsupported shape (head dim must be 64), got D = ", D);
    auto o = torch::empty_like(Q);
    torch::Tensor ws;   // the KV-split workspace, from torch's caching allocator
    if (ws_bytes > 0) ws = torch::empty({ws_bytes}, q.options().dtype(torch::kUInt8));
    const int err = attention_fwd_run(Q.data_ptr(), K.data_ptr(), V.data_ptr(), o.data_ptr(),
                                      ws_bytes > 0 ? ws.data_ptr() : nullptr, ws_bytes, B, H, S, D, flags,
                                      at::cuda::getCurrentCUDAStream(q.get_device()).stream());
    TORCH_CHECK(err == 0, "attention_fwd_run: ", cudaGetErrorString((cudaError_t)err));
    return o;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "FlashAttention-style forward pass, fp16 in/out, head dim 64",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("is_causal") = false);
}
