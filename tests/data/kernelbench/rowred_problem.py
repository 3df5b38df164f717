# KernelBench-format problem (row-wise root-mean-square reduction), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Reference: out[r] = sqrt(mean(x[r, :] ** 2)); output shape (rows,)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sqrt(torch.mean(x * x, dim=1))


rows = 512
cols = 4096


def get_inputs():
    x = torch.rand(rows, cols)
    return [x]


def get_init_inputs():
    return []
