"""matmul_ext_cpu: inputs and reference. No `run`: the extension's forward(A, B) is called and its
answer checked and copied into the output (tools/backends/backend.py)."""

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
    """The truth for parity, accumulated in float64."""
    return (a.double() @ b.double()).float()


def timing_reference(shape, a, b):
    """What "vs reference" times: the call a PyTorch user makes."""
    return a @ b


def empty_output(shape, a, b):
    return torch.empty(shape["M"], shape["N"], dtype=torch.float32, device=a.device)


def hidden_shapes(rng: random.Random):
    return [{"M": rng.randint(33, 200), "N": rng.randint(33, 200), "K": rng.randint(17, 150)} for _ in range(2)]
