"""attention_fwd: inputs, the fp32 SDPA reference and the ctypes calls into the compiled library.

Library ABI (attention.cu):
    int       attention_fwd_run(q, k, v, o, workspace, workspace_bytes, B, H, S, D, flags, stream)
    int       attention_fwd_plan(B, H, S, D, flags, int* out, int cap)      # 7 ints per launch
    long long attention_fwd_workspace_bytes(B, H, S, D, flags)              # fp32 split workspace
flags bit 0 = causal. The workspace (KV_SPLITS > 1) is allocated here through torch, never inside
the library, so the caching allocator owns it and nothing leaks between calls.
"""

import ctypes
import random

import torch

HEAD_DIM = 64
KERNELS = ["attention_fwd_kernel", "attention_fwd_combine"]   # launch order in attention_fwd_plan


def _dims(shape):
    return shape["B"], shape["H"], shape["S"], shape["D"], 1 if shape["causal"] else 0


def _bind(lib):
    """Declare the C signatures once per loaded library."""
    if getattr(lib, "_attention_fwd_bound", False):
        return lib
    i, p = ctypes.c_int, ctypes.c_void_p
    lib.attention_fwd_run.argtypes = [p, p, p, p, p, ctypes.c_longlong, i, i, i, i, i, p]
    lib.attention_fwd_run.restype = i
    lib.attention_fwd_plan.argtypes = [i, i, i, i, i, ctypes.POINTER(i), i]
    lib.attention_fwd_plan.restype = i
    lib.attention_fwd_workspace_bytes.argtypes = [i, i, i, i, i]
    lib.attention_fwd_workspace_bytes.restype = ctypes.c_longlong
    lib._attention_fwd_bound = True
    return lib


def make_inputs(shape, seed, device, dist):
    """q, k, v as (B, H, S, D) contiguous fp16. 'large' scales q and k by 3 (scores with std ~9)
    so that the running max moves by large steps and the online rescaling is exercised."""
    b, h, s, d, _ = _dims(shape)
    g = torch.Generator(device=device).manual_seed(seed)
    size = (b, h, s, d)
    if dist == "normal":
        q, k, v = (torch.randn(size, generator=g, device=device) for _ in range(3))
    elif dist == "uniform":
        q, k, v = (torch.rand(size, generator=g, device=device) * 2 - 1 for _ in range(3))
    elif dist == "large":
        q, k, v = (torch.randn(size, generator=g, device=device) for _ in range(3))
        q, k = q * 3, k * 3
    else:
        raise ValueError(f"unknown distribution {dist!r} (have normal, uniform, large)")
    return tuple(t.to(torch.float16).contiguous() for t in (q, k, v))


REF_SCORES = 1 << 28   # fp32 scores the reference holds at once (1 GiB)


def reference(shape, q, k, v):
    """fp32 SDPA on the upcast inputs, math backend (plain fp32 matmuls and softmax; no TF32). The math backend
    holds all B*H*S*S scores at once (16 GiB at [dims]' longest S): past REF_SCORES it runs a group of heads, or a
    block of query rows (the causal mask then given as rows >= columns), at a time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d, causal = _dims(shape)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.MATH):
        if b * h * s * s <= REF_SCORES:
            return sdpa(q.float(), k.float(), v.float(), is_causal=bool(causal))
        qf, kf, vf = (t.reshape(b * h, s, d) for t in (q, k, v))
        out = torch.empty((b * h, s, d), dtype=torch.float32, device=q.device)
        heads, rows = max(1, REF_SCORES // (s * s)), min(s, max(1, REF_SCORES // s))
        for h0 in range(0, b * h, heads):
            kc, vc = kf[h0:h0 + heads].float(), vf[h0:h0 + heads].float()
            for r0 in range(0, s, rows):
                qc = qf[h0:h0 + heads, r0:r0 + rows].float()
                mask = None
                if causal:
                    mask = (torch.arange(r0, r0 + qc.shape[1], device=q.device)[:, None]
                            >= torch.arange(s, device=q.device)[None, :])
                out[h0:h0 + heads, r0:r0 + rows] = sdpa(qc, kc, vc, attn_mask=mask)
        return out.view(b, h, s, d)


def timing_reference(shape, q, k, v):
    """What a PyTorch user would call: fp16 SDPA (FlashAttention-2 / cuDNN / efficient backend)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(shape["causal"]))


def empty_output(shape, q, k, v):
    return torch.empty_like(q)


def run(lib, shape, out, q, k, v):
    _bind(lib)
    b, h, s, d, flags = _dims(shape)
    nbytes = lib.attention_fwd_workspace_bytes(b, h, s, d, flags)
    if nbytes < 0:
        raise ValueError(f"attention_fwd does not support shape {shape} (head dim must be {HEAD_DIM})")
    ws = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes > 0 else None
    stream = torch.cuda.current_stream(q.device).cuda_stream
    err = lib.attention_fwd_run(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                ws.data_ptr() if ws is not None else None, nbytes, b, h, s, d, flags,
                                ctypes.c_void_p(stream))
    if err != 0:
        raise RuntimeError(f"attention_fwd_run returned CUDA error {err}")


def launch_plan(lib, shape):
    _bind(lib)
    cap = len(KERNELS)
    buf = (ctypes.c_int * (7 * cap))()
    n = lib.attention_fwd_plan(*_dims(shape), buf, cap)
    if n < 0:
        raise ValueError(f"attention_fwd_plan rejected shape {shape}")
    if n > cap:
        raise ValueError(f"attention_fwd_plan reports {n} launches; this task knows {cap}")
    return [{"kernel": KERNELS[i], "grid": tuple(buf[7 * i:7 * i + 3]), "block": tuple(buf[7 * i + 3:7 * i + 6]),
             "smem_dynamic_bytes": buf[7 * i + 6]} for i in range(n)]


def hidden_shapes(rng: random.Random):
    """Shapes the proposer never sees: odd lengths, both masks."""
    return [{"B": rng.randint(1, 3), "H": rng.randint(1, 12), "S": 2 * rng.randint(8, 400) + 1, "D": HEAD_DIM,
             "causal": c} for c in (0, 1)]
