"""kernel-agent: a profile-guided, self-verifying optimization loop for CUDA kernels."""

__version__ = "0.1.0"
