"""A KernelBench problem as a task (written by `agent import kernelbench`; copied from
tools/kernelbench/task_py.py, edit that, not the copy).

problem.py is the problem file as given: `Model(*get_init_inputs())`, built after torch.manual_seed(42) as
KernelBench's evaluator builds it, is the reference. model_new.py is the solution's Python: its
`load_inline(...)` call is answered with the build under test (the task's binding.cpp and its editable
kernel file), so `ModelNew(*get_init_inputs())`, built after the same seed (its parameters then equal
Model's where it declares them in the same order), is what gets called. A shape is the problem's
module-level sizes: they are set in both modules before get_inputs/get_init_inputs are called.
"""

import importlib.util
import threading
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SEED = 42                       # KernelBench seeds torch with 42 before building Model and ModelNew
_lock = threading.RLock()       # the bench's reentrancy probe calls `run` from two threads at once
_problem = None
_refs: dict = {}                # (shape, device, float64?) -> the reference Model
_news: dict = {}                # (id(lib), shape, device) -> ModelNew built on that library
_outs: dict = {}                # (shape, the inputs' shapes and dtypes) -> the output's shape and dtype


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _key(shape):
    return tuple(sorted((k, int(v)) for k, v in shape.items()))


def _problem_for(shape):
    global _problem
    if _problem is None:
        _problem = _load("kb_problem", HERE / "problem.py")
    for k, v in shape.items():
        setattr(_problem, k, int(v))
    return _problem


def make_inputs(shape, seed, device, dist):
    """get_inputs() at this shape's sizes, drawn on the CPU from `seed` and moved (as KernelBench does)."""
    if dist != "problem":
        raise ValueError(f"unknown distribution {dist!r} (an imported problem has one: 'problem', its get_inputs)")
    with _lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inputs = list(_problem_for(shape).get_inputs())
    return tuple(t.to(device).contiguous() if isinstance(t, torch.Tensor) else t for t in inputs)


def _model(shape, device, wide):
    key = (_key(shape), str(device), wide)
    with _lock:
        if key not in _refs:
            p = _problem_for(shape)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(SEED)
                m = p.Model(*p.get_init_inputs())
            m = m.to(device)
            _refs[key] = (m.double() if wide else m).eval()
        return _refs[key]


def _wide(t):
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def timing_reference(shape, *inputs):
    """What a PyTorch user calls: the problem's Model, in its own precision."""
    with torch.no_grad():
        return _model(shape, inputs[0].device, False)(*inputs)


def reference(shape, *inputs):
    """The truth for parity: the Model in float64 where it runs so (else in its own precision)."""
    out_dtype = empty_output(shape, *inputs).dtype
    try:
        with torch.no_grad():
            return _model(shape, inputs[0].device, True)(*map(_wide, inputs)).to(out_dtype)
    except (RuntimeError, TypeError, NotImplementedError):
        return timing_reference(shape, *inputs)


def empty_output(shape, *inputs):
    """The output's shape and dtype, from one forward of the Model on copies of these inputs (once a shape: parity and
    the bench's probes ask for every call; parity computes the reference at every shape anyway). Not on torch's meta
    device: the first meta operation of a process imports torch._dynamo, 0.9 s of CPU in every judge."""
    key = (_key(shape), tuple((tuple(t.shape), t.dtype) for t in inputs if isinstance(t, torch.Tensor)))
    with _lock:
        if key not in _outs:
            with torch.no_grad():
                out = _model(shape, inputs[0].device, False)(*[t.clone() if isinstance(t, torch.Tensor) else t
                                                               for t in inputs])
            _outs[key] = (out.shape, out.dtype)
    size, dtype = _outs[key]
    return torch.empty(size, dtype=dtype, device=inputs[0].device)


def _model_new(lib, shape, device):
    key = (id(lib), _key(shape), str(device))
    with _lock:
        if key in _news:
            return _news[key][1]
        import torch.utils.cpp_extension as ext
        saved = ext.load_inline
        ext.load_inline = lambda *a, **k: lib     # the solution's build is the one under test
        try:
            sol = _load(f"kb_model_new_{id(lib)}", HERE / "model_new.py")
            for k, v in shape.items():
                setattr(sol, k, int(v))
            p = _problem_for(shape)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(SEED)
                m = sol.ModelNew(*p.get_init_inputs()).to(device).eval()
        finally:
            ext.load_inline = saved
        _news[key] = (lib, m)          # lib held: its id stays its own while cached
        return m


def run(lib, shape, out, *inputs):
    """ModelNew's forward on the inputs, its answer copied into the judge's buffer."""
    with torch.no_grad():
        got = _model_new(lib, shape, inputs[0].device)(*inputs)
    if not isinstance(got, torch.Tensor) or got.shape != out.shape or got.dtype != out.dtype:
        what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        raise ValueError(f"ModelNew returned {what}; the output is {tuple(out.shape)} {out.dtype}")
    out.copy_(got)
