# KernelBench-format problem (Linear followed by ReLU, two-op fusion with weights), written for this project's tests in KernelBench's format.
import torch
import torch.nn as nn


class Model(nn.Module):
    """Reference: out = relu(x @ W^T + b) using nn.Linear(in_features, out_features)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = 128
in_features = 512
out_features = 256


def get_inputs():
    x = torch.rand(batch_size, in_features)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
