# Bad KernelBench-format problem (defines Model and get_init_inputs but no get_inputs), written for this project's tests in KernelBench's format.
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


def get_init_inputs():
    return []
