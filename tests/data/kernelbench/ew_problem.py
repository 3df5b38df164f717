# KernelBench-format problem (elementwise fused multiply-add), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Reference: out = x * y + y, elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return x * y + y


batch_size = 256
dim = 8192


def get_inputs():
    x = torch.rand(batch_size, dim)
    y = torch.rand(batch_size, dim)
    return [x, y]


def get_init_inputs():
    return []
