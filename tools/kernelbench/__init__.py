"""KernelBench's format in and out (issue 45).

A KernelBench *problem* is one Python file: `class Model(nn.Module)` whose forward is the reference,
`get_inputs()`, `get_init_inputs()` and module-level sizes those two read. A *solution* is a file with
`class ModelNew` that builds its CUDA (or C++) with `torch.utils.cpp_extension.load_inline`.

- probe: run in a child (the user's files are code: they never run in the agent's process): what the
  problem's sizes, inputs and output are, which shapes the model takes, and the solution's load_inline call.
- task_py: the task.py every imported task gets (the reference is the problem's Model, the call is the
  solution's ModelNew with its load_inline answered by the build under test).
- writer: the task folder (task.toml, binding.cpp, the editable kernel, problem.py, model_new.py).
- scaffold: without a solution, the forward as ATen calls (torch.export) and a ModelNew(Model) calling them.
- export: the best kernel back into one self-contained ModelNew file KernelBench's evaluator loads; evalkb: such a
  file checked in a fresh process as KernelBench's evaluator checks one.
"""
