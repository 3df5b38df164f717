"""A task's functions from the signature task.toml declares ([signature], `agent init`): no hand-written ctypes.

The generated task.py is two lines: `make_inputs, reference, timing_reference, empty_output, run = bind(__file__)`.
From [signature] (tools/taskspec.py SignatureSpec):

- make_inputs: each input from the shape's expressions, drawn from a torch.Generator seeded with `seed` (normal: randn;
  uniform: in [-1, 1); integer dtypes: -8..7; bool: 0/1), on the task's device (torch's allocations: 64-byte
  aligned at least);
- reference / timing_reference: the user's `module:function` (imported from the repository holding the task) called
  with the inputs in their declared order and each float scalar by name; the reference in float64 where the function
  runs so (the truth parity compares with), cast to the output's dtype; timing_reference as a user calls it;
- empty_output: the one output's shape and dtype;
- run: the library's function through ctypes, the arguments in the declared order (pointers, the int scalars from
  the shape, the float scalars, the current CUDA stream where a parameter is a cudaStream_t).

`prototype(text, function)` reads the function's extern "C" parameters from a source; `mismatch(spec, text)` says
where they and the declaration differ (checked before every build: a candidate that changes the ABI would be called
with the wrong arguments).
"""

from __future__ import annotations

import ctypes
import importlib
import re
import sys
import tomllib
from pathlib import Path

from tools.expr import eval_expr
from tools.taskspec import ArgSpec, SignatureSpec

# the C element types a tensor of each dtype may be declared with (void: any)
C_ELEMENT = {"float32": {"float"}, "float64": {"double"}, "float16": {"half", "__half", "uint16_t", "at::Half"},
             "bfloat16": {"__nv_bfloat16", "nv_bfloat16", "uint16_t", "at::BFloat16"}, "int32": {"int", "int32_t"},
             "int64": {"int64_t", "long", "long long"}, "int16": {"short", "int16_t"}, "int8": {"int8_t", "char"},
             "uint8": {"uint8_t", "unsigned char"}, "bool": {"bool"}}
C_SCALAR = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint,
            "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "long": ctypes.c_long,
            "long long": ctypes.c_longlong, "size_t": ctypes.c_size_t, "uint64_t": ctypes.c_uint64,
            "float": ctypes.c_float, "double": ctypes.c_double}
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct)\b")


def _parse(text: str):
    """The source's syntax tree (tree-sitter's CUDA grammar, a superset of C++'s): the prototype is read from the
    grammar's function declarators, so a parameter that is a function pointer, a comment or an attribute between the
    parameters, a default argument or a second function of the same name in a namespace reads as the compiler reads
    it (issue 65: a regular expression over `name(...)` took the first match and stopped at the first ')')."""
    from tools.backends.cu_tree import parser
    got = parser()
    if got is None:
        raise ImportError("tree-sitter and tree-sitter-cuda are not installed")
    return got.parse(text.encode()).root_node


def _find(text: str, function: str):
    """The function_declarator of `function` and the node declaring it: a definition before a declaration, and one
    with C linkage (extern "C", alone or in a block) before one without; None where the source has none."""
    found = []      # (not a definition, not extern "C", order, declarator, node)
    scopes = [(_parse(text), False)]
    while scopes:
        scope, c_linkage = scopes.pop()
        for node in scope.children:
            if node.type in ("namespace_definition", "linkage_specification"):
                body = node.child_by_field_name("body")
                value = node.child_by_field_name("value")
                linked = c_linkage or (value is not None and value.text == b'"C"')
                if body is not None and body.type == "declaration_list":
                    scopes.append((body, linked))
                elif body is not None:            # extern "C" int f(...) { ... }: the definition is the body
                    _consider(body, function, found, linked)
                continue
            _consider(node, function, found, c_linkage)
    if not found:
        return None
    found.sort(key=lambda f: f[:3])
    return found[0][3], found[0][4]


def _consider(node, function: str, found: list, c_linkage: bool) -> None:
    if node.type not in ("function_definition", "declaration"):
        return
    d = node.child_by_field_name("declarator")
    while d is not None and d.type in ("pointer_declarator", "reference_declarator"):
        d = d.child_by_field_name("declarator")
    if d is not None and d.type == "function_declarator":
        name = d.child_by_field_name("declarator")
        if name is not None and name.text.decode() == function:
            found.append((node.type != "function_definition", not c_linkage, len(found), d, node))


def _param(p) -> dict | None:
    """One parameter_declaration: {type, pointer, const, name}; None for a lone `void`."""
    tnode = p.child_by_field_name("type")
    base = tnode.text.decode() if tnode is not None else ""
    d, pointer, name = p.child_by_field_name("declarator"), False, ""
    while d is not None:
        if "pointer" in d.type or "array" in d.type:
            pointer = True
        if d.type in ("identifier", "field_identifier"):
            name = d.text.decode()
            break
        d = d.named_children[0] if d.type == "parenthesized_declarator" and d.named_children else \
            d.child_by_field_name("declarator")
    if base == "void" and not pointer and not name:
        return None
    const = any(c.type == "type_qualifier" and c.text == b"const" for c in p.children)
    return {"type": " ".join(_QUALIFIERS.sub(" ", base).split()), "pointer": pointer, "const": const, "name": name}


def prototype(text: str, function: str) -> list[dict] | None:
    """The parameters of `function` where the source defines or declares it (extern "C", alone or in a block): each
    {type, pointer, const, name}; None where the source has no such function."""
    got = _find(text, function)
    if got is None:
        return None
    params = got[0].child_by_field_name("parameters")
    out = [_param(p) for p in (params.children if params is not None else [])
           if p.type in ("parameter_declaration", "optional_parameter_declaration")]
    return [p for p in out if p is not None]


def returns(text: str, function: str) -> str | None:
    """The return type the source gives `function` ("void", "int", "cudaError_t"), or None where it has none."""
    got = _find(text, function)
    t = got[1].child_by_field_name("type") if got is not None else None
    return t.text.decode() if t is not None else None


def mismatch(spec: SignatureSpec, text: str, file: str) -> str | None:
    """Where `file`'s extern "C" `spec.function` and [signature] disagree (one line naming the argument), or None."""
    got = prototype(text, spec.function)
    if got is None:
        return f"{file} defines no function {spec.function}( that [signature] function names"
    if len(got) != len(spec.args):
        return (f"{file}: {spec.function} takes {len(got)} parameters, [signature] args declares {len(spec.args)} "
                f"({', '.join(a.name for a in spec.args)})")
    for i, (p, a) in enumerate(zip(got, spec.args)):
        where = f"{file}: {spec.function}'s parameter {i + 1} ({p['type']}{' *' if p['pointer'] else ''} {p['name']})"
        if a.kind in ("input", "output"):
            if not p["pointer"]:
                return f"{where} is not a pointer; [signature] args {a.name} is an {a.kind}"
            if p["type"] != "void" and p["type"] not in C_ELEMENT.get(a.dtype or "", {p["type"]}):
                return f"{where} does not hold {a.dtype}, the dtype [signature] args {a.name} declares"
            if a.kind == "output" and p["const"]:
                return f"{where} is const; [signature] args {a.name} is the output"
        elif a.kind == "stream":
            if p["type"] not in ("cudaStream_t", "CUstream"):
                return f"{where} is not a cudaStream_t; [signature] args {a.name} is the stream"
        elif p["pointer"] or p["type"] not in C_SCALAR:
            return f"{where} is not a scalar of a known C type; [signature] args {a.name} is a {a.kind}"
        elif (p["type"] in ("float", "double")) != (a.kind == "float"):
            return f"{where} is {p['type']}; [signature] args {a.name} is a {a.kind}"
        elif a.ctype is not None and a.ctype != p["type"]:
            return f"{where} is {p['type']}; [signature] args {a.name} declares ctype {a.ctype}"
    return None


def _repo_root(start: Path) -> Path:
    for d in [start, *start.parents]:
        if (d / ".git").exists():
            return d
    return start


def load_reference(ref: str, task_dir: Path):
    """The user's `module:function`, imported with the repository holding the task on sys.path: last, so that a
    package of the user's named as one of this process's (a `tools/` or `agent/` folder) does not shadow it."""
    module, _, name = ref.partition(":")
    root = str(_repo_root(task_dir))
    if root not in sys.path:
        sys.path.append(root)
    return getattr(importlib.import_module(module), name)


def _dims(a: ArgSpec, shape: dict) -> list[int]:
    return [int(eval_expr(e, shape)) if isinstance(e, str) else int(e) for e in a.shape]


def bind(task_py: str) -> tuple:
    """make_inputs, reference, timing_reference, empty_output, run for the task.toml beside `task_py`."""
    import torch
    folder = Path(task_py).resolve().parent
    raw = tomllib.loads((folder / "task.toml").read_text())
    sig = SignatureSpec.model_validate(raw["signature"])
    ins = [a for a in sig.args if a.kind == "input"]
    [out_arg] = [a for a in sig.args if a.kind == "output"]
    floats = {a.name: float(a.value) for a in sig.args if a.kind == "float"}
    user = {}

    def fn():
        if "f" not in user:
            user["f"] = load_reference(sig.reference, folder)
        return user["f"]

    def make_inputs(shape, seed, device, dist):
        g = torch.Generator().manual_seed(int(seed))
        got = []
        for a in ins:
            dims, dt = _dims(a, shape), getattr(torch, a.dtype)
            if dt.is_floating_point:
                if dist not in ("normal", "uniform"):
                    raise ValueError(f"unknown distribution {dist!r}")
                v = torch.randn(dims, generator=g) if dist == "normal" else torch.rand(dims, generator=g) * 2 - 1
            else:
                v = torch.randint(0, 2, dims, generator=g) if dt == torch.bool else torch.randint(-8, 8, dims, generator=g)
            got.append(v.to(dt).to(device).contiguous())
        return tuple(got)

    def timing_reference(shape, *inputs):
        return fn()(*inputs, **floats)

    def reference(shape, *inputs):
        dt = getattr(torch, out_arg.dtype)
        try:
            wide = [x.double() if x.is_floating_point() else x for x in inputs]
            return torch.as_tensor(fn()(*wide, **floats)).to(dt)
        except (RuntimeError, TypeError, NotImplementedError):
            return torch.as_tensor(fn()(*inputs, **floats)).to(dt)

    def empty_output(shape, *inputs):
        return torch.empty(_dims(out_arg, shape), dtype=getattr(torch, out_arg.dtype), device=inputs[0].device)

    ret = next((r for f in raw.get("sources", []) if (folder / f).is_file()
                for r in [returns((folder / f).read_text(errors="replace"), sig.function)] if r), "void")
    checked = ret in ("int", "cudaError_t")     # a nonzero answer is the kernel's error (a void's is garbage)

    def run(lib, shape, out, *inputs):
        f = getattr(lib, sig.function)
        given = dict(zip((a.name for a in ins), inputs))
        args = []
        for a in sig.args:
            if a.kind == "input":
                args.append(ctypes.c_void_p(given[a.name].data_ptr()))
            elif a.kind == "output":
                args.append(ctypes.c_void_p(out.data_ptr()))
            elif a.kind == "stream":
                args.append(ctypes.c_void_p(torch.cuda.current_stream(out.device).cuda_stream))
            elif a.kind == "int":
                v = a.value if a.value is not None else a.name
                args.append(C_SCALAR[a.ctype or "int"](int(eval_expr(v, shape) if isinstance(v, str) else v)))
            else:
                args.append(C_SCALAR[a.ctype or "float"](float(a.value)))
        rc = f(*args)
        if checked and rc:
            raise RuntimeError(f"{sig.function} returned {ret} {rc}")

    return make_inputs, reference, timing_reference, empty_output, run


def task_mismatch(sig: SignatureSpec, root: Path, sources: list[str]) -> str | None:
    """mismatch() against the first of `sources` (in `root`) that has the function, or why none has it."""
    for rel in sources:
        p = Path(root) / rel
        if p.is_file() and prototype(text := p.read_text(errors="replace"), sig.function) is not None:
            return mismatch(sig, text, rel)
    return f"no source defines {sig.function}(, the function [signature] names"


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.signature TASK_DIR`: the generated functions on the smallest listed shape, in this (child)
    process: the reference imported and called, its answer held to the declared output (`agent init` runs it before
    it keeps a folder). Prints one JSON line: {ok} or {ok: false, field, error, fix}."""
    import json
    import traceback
    folder = Path((argv if argv is not None else sys.argv[1:])[0]).resolve()
    raw = tomllib.loads((folder / "task.toml").read_text())
    sig = SignatureSpec.model_validate(raw["signature"])

    def say(**kw) -> int:
        print(json.dumps(kw))
        return 0
    try:
        make_inputs, reference, _, empty_output, _ = bind(str(folder / "task.py"))
        shape = min(raw["shapes"], key=lambda s: sum(int(v) for v in s.values() if not isinstance(v, bool)))
        inputs = make_inputs(shape, 1, "cpu", raw.get("distributions", ["normal"])[0])
        try:
            load_reference(sig.reference, folder)
        except Exception as e:   # the user's module: any error it raises on import
            return say(ok=False, field="--reference", error=f"{sig.reference} does not import: {type(e).__name__}: {e}",
                       fix="give module:function importable from the repository's root (e.g. ops.ref:fma for ops/ref.py)")
        out, got = empty_output(shape, *inputs), reference(shape, *inputs)
    except Exception:
        tail = traceback.format_exc().strip().splitlines()[-1]
        return say(ok=False, field="--reference", error=f"calling {sig.reference} on the inputs failed: {tail[:300]}",
                   fix=f"it is called as {sig.reference.split(':')[1]}(" + ", ".join(
                       [a.name for a in sig.args if a.kind == "input"] + [f"{a.name}=" for a in sig.args if a.kind == "float"])
                   + ") with tensors of the declared shapes; --shape ARG=D1,D2 declares them")
    if tuple(got.shape) != tuple(out.shape):
        return say(ok=False, field="--shape", error=f"{sig.reference} answered shape {tuple(got.shape)} on {shape}, the "
                   f"declared output {tuple(out.shape)}", fix="declare the output's shape: --shape OUT=D1,D2 (the "
                   "parameter's name, then expressions over the sizes)")
    return say(ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
