"""matmul_cpu: inputs, reference and the call into the compiled library."""

import ctypes
import random

import torch


def make_inputs(shape, seed, device, dist):
    g = torch.Generator().manual_seed(seed)
    m, n, k = shape["M"], shape["N"], shape["K"]
    if dist == "normal":
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    elif dist == "uniform":
        a, b = torch.rand(m, k, generator=g) * 2 - 1, torch.rand(k, n, generator=g) * 2 - 1
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return a.to(device).contiguous(), b.to(device).contiguous()


def reference(shape, a, b):
    """The truth for parity: accumulated in float64, so that the tolerance measures the kernel's error."""
    return (a.double() @ b.double()).float()


def timing_reference(shape, a, b):
    """What "vs reference" times: the call a PyTorch user makes (float32 torch.matmul, on the threads
    torch is given), not the float64 truth above, which is several times slower."""
    return a @ b


def empty_output(shape, a, b):
    return torch.empty(shape["M"], shape["N"], dtype=torch.float32, device=a.device)


def run(lib, shape, out, a, b):
    lib.matmul(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(out.data_ptr()),
               ctypes.c_int(shape["M"]), ctypes.c_int(shape["N"]), ctypes.c_int(shape["K"]))


def hidden_shapes(rng: random.Random):
    """Shapes the proposer never sees: parity also runs on these (special-casing the listed shapes fails)."""
    return [{"M": rng.randint(33, 200), "N": rng.randint(33, 200), "K": rng.randint(17, 150)} for _ in range(2)]
