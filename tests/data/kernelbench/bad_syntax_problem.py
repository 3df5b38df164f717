# Bad KernelBench-format problem (contains a Python syntax error), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y)
        return x * y + y


batch_size = 256
dim = 8192


def get_inputs():
    return [torch.rand(batch_size, dim), torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
