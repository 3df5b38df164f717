"""Backends: what differs between kernel forms and devices, and what this machine compiles and times
with. Everything here is below the task: it knows compilers, headers, the GPU and the clock, not
task.toml.

Entry points:
- backend.backend_for(task) -> Backend (CtypesBackend, TorchExtensionBackend): how a task's kernel is
  built, loaded, timed and synchronized on its device; the only place the code branches on the
  device's name (tests/test_architecture.py).
- toolchain: find_ninja, find_cxx, find_nvcc, find_ncu, cuda_home, takes_flag; torchpaths: torch's build folders
  without importing torch (kept per install in $AGENT_CACHE).
- device: DeviceLimits of the GPU, or a table by arch (device_limits, task_limits, gpu_arch).
- clocks: CudaClock, CpuClock (after triton's do_bench), reps, estimate_and_warm, one_torch_thread.
- pch: a precompiled torch/extension.h; torch_library: TORCH_LIBRARY namespaces renamed per load;
  cu_split (with cu_scan, which reads the file with cu_tree, tree-sitter's CUDA grammar): a one-file CUDA extension
  built as two halves.

May import: tools.results and the rooms below (tools.isolation).
"""
