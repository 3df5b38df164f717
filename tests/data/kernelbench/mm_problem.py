# KernelBench-format problem (dense matrix multiply C = A @ B), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Reference: C = A @ B with A of shape (M, K) and B of shape (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


M = 256
K = 384
N = 320


def get_inputs():
    A = torch.rand(M, K)
    B = torch.rand(K, N)
    return [A, B]


def get_init_inputs():
    return []
