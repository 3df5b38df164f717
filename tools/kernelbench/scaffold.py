"""A starting solution for a KernelBench problem given without one (`agent import kernelbench PROBLEM.py`): correct
and naive, for the loop and a model to take from there. Run inside the probe's child.

The problem's forward is captured with torch.export (every dimension of every input dynamic, so no size is baked in)
and written as one C++ function of ATen calls, `forward(parameters..., inputs...)`: the file the agent edits, where
each call is a place for a kernel. model_new.py holds the problem file itself (so `ModelNew(Model)` builds the same
parameters in the same order: KernelBench's seeded construction makes them equal) and a forward that passes the
parameters and the inputs to the extension.
"""

from __future__ import annotations

import operator
from pathlib import Path

import torch

from tools.kernelbench.export import literal

SCALAR_TYPES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool", torch.int8: "Char", torch.uint8: "Byte"}


class ScaffoldError(Exception):
    pass


def _value(v, names: dict) -> str:
    if isinstance(v, torch.fx.Node):
        return names[v]
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"int64_t({v})"
    if isinstance(v, float):
        if v != v:
            return "std::numeric_limits<double>::quiet_NaN()"
        if abs(v) == float("inf"):
            return ("-" if v < 0 else "") + "std::numeric_limits<double>::infinity()"
        return repr(v)
    if v is None:
        return "::std::nullopt"
    if isinstance(v, str) and v.isidentifier():
        return f'"{v}"'

    if isinstance(v, torch.dtype) and v in SCALAR_TYPES:
        return f"at::ScalarType::{SCALAR_TYPES[v]}"
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, torch.fx.Node)) and not isinstance(x, bool) for x in v):
        return "std::vector<int64_t>{" + ", ".join(_value(x, names) for x in v) + "}"
    raise ScaffoldError(f"an argument of kind {type(v).__name__} ({v!r:.60})")


def _call(node: torch.fx.Node, names: dict) -> str:
    t = node.target
    if t is operator.getitem:
        return f"std::get<{node.args[1]}>({names[node.args[0]]})"
    if t in (operator.mul, operator.add, operator.sub, operator.floordiv):
        op = {operator.mul: "*", operator.add: "+", operator.sub: "-", operator.floordiv: "/"}[t]
        return f"({_value(node.args[0], names)} {op} {_value(node.args[1], names)})"
    schema = getattr(t, "_schema", None)
    if schema is None or not schema.name.startswith("aten::"):
        raise ScaffoldError(f"the call {t} (not an ATen op)")
    if schema.name == "aten::sym_size":
        return f"{names[node.args[0]]}.size({node.args[1]})"
    given = list(node.args)
    args = []
    for i, a in enumerate(schema.arguments):
        if i < len(given):
            args.append(given[i])
        elif a.name in node.kwargs:
            args.append(node.kwargs[a.name])
        elif any(b.name in node.kwargs for b in schema.arguments[i + 1:]):
            args.append(a.default_value)
        else:
            break
    return f"at::{schema.name.split('::', 1)[1]}({', '.join(_value(a, names) for a in args)})"


def forward_source(ep) -> tuple[str, list[tuple[str, str]]]:
    """(the C++ forward, [(kind, name)] of its arguments in order: "parameter"/"buffer" with its module path, or
    "input" with the placeholder's name)."""
    sig = {s.arg.name: s for s in ep.graph_signature.input_specs}
    names, params, lines, out = {}, [], [], None
    for n in ep.graph.nodes:
        cname = "v_" + n.name
        if n.op == "placeholder":
            spec = sig[n.name]
            kind = spec.kind.name
            if kind not in ("PARAMETER", "BUFFER", "USER_INPUT"):
                raise ScaffoldError(f"a lifted {kind.lower()} ({n.name})")
            if kind == "USER_INPUT" and not isinstance(n.meta.get("val"), torch.Tensor):
                raise ScaffoldError(f"a forward argument that is not a tensor ({n.name})")
            names[n] = cname
            params.append(({"PARAMETER": "parameter", "BUFFER": "buffer"}.get(kind, "input"), spec.target or n.name))
        elif n.op == "call_function":
            names[n] = cname
            lines.append(f"    auto {cname} = {_call(n, names)};")
        elif n.op == "output":
            outs = n.args[0]
            if len(outs) != 1 or not isinstance(outs[0], torch.fx.Node):
                raise ScaffoldError("a forward with more than one output")
            out = names[outs[0]]
        else:
            raise ScaffoldError(f"a graph node of kind {n.op}")
    head = ", ".join(f"torch::Tensor {names[n]}" for n in ep.graph.nodes if n.op == "placeholder")
    body = "\n".join(lines)
    return (f"torch::Tensor forward({head}) {{\n{body}\n    return {out};\n}}\n", params)


def export_forward(mod, model_cls_args):
    """torch.export of Model(*init) on get_inputs(), every input dimension dynamic."""
    from torch.export import Dim
    model = mod.Model(*model_cls_args)
    inputs = tuple(mod.get_inputs())
    dyn = tuple({i: Dim.AUTO for i in range(t.dim())} if isinstance(t, torch.Tensor) else None for t in inputs)
    try:
        return torch.export.export(model, inputs, dynamic_shapes=dyn)
    except Exception as e:  # noqa: BLE001 (torch.export's many refusals)
        raise ScaffoldError(f"torch.export cannot capture the forward: {type(e).__name__}: {str(e).splitlines()[0][:160]}")


def decl(cpp_fn: str) -> str:
    return cpp_fn.split("{", 1)[0].strip() + ";"


HEADER = ("// A correct, naive start (agent import kernelbench, no --solution): the problem's forward as ATen calls,\n"
          "// captured with torch.export. Each call is a place for a kernel of your own.\n"
          "#include <torch/extension.h>\n#include <limits>\n#include <vector>\n\n")


def scaffold(mod, problem: Path, init: list, cuda: bool) -> dict:
    """The load_inline arguments of the starting solution and its model_new.py text (the probe's `solution`)."""
    fn, args = forward_source(export_forward(mod, init))
    cpp, cu = (decl(fn), HEADER + fn) if cuda else (HEADER + fn, None)
    call, k = [], 0
    for kind, name in args:
        if kind == "input":
            call.append(f"inputs[{k}]")
            k += 1
        else:
            call.append(f"{'p' if kind == 'parameter' else 'b'}[{name!r}]")
    lines = [f"# A starting solution scaffolded by `agent import kernelbench` for {problem.name} (no --solution given):",
             "# the problem file itself (so that ModelNew(Model) builds Model's parameters in Model's order: KernelBench's",
             "# seeded construction makes them equal), then the extension, whose forward is the problem's forward as ATen",
             "# calls, and ModelNew, which passes it the parameters and the inputs.",
             problem.read_text().rstrip("\n"), "", "",
             "from torch.utils.cpp_extension import load_inline  # noqa: E402", "",
             f"AGENT_CPP_SOURCE = {literal(cpp)}", ""]
    if cu:
        lines += [f"AGENT_CUDA_SOURCE = {literal(cu)}", ""]
    lines += [f"agent_ext = load_inline(name=\"agent_scaffold_{problem.stem}\", cpp_sources=AGENT_CPP_SOURCE,"
              + (" cuda_sources=AGENT_CUDA_SOURCE," if cu else "")
              + ' functions=["forward"], extra_cflags=["-O3", "-march=native"], verbose=False)', "", "",
              "class ModelNew(Model):",
              "    def forward(self, *inputs):",
              "        p, b = dict(self.named_parameters()), dict(self.named_buffers())",
              f"        return agent_ext.forward({', '.join(call)})", ""]
    return {"name": f"agent_scaffold_{problem.stem}", "cpp_sources": cpp, "cuda_sources": cu, "functions": ["forward"],
            "extra_cflags": ["-O3", "-march=native"], "extra_cuda_cflags": [], "extra_ldflags": [], "extra_include_paths": [],
            "model_new": "\n".join(lines)}
