"""A task's kernel back into KernelBench's format: the solution's Python (model_new.py) with its load_inline
call's source argument (cuda_sources, or cpp_sources for a CPU solution) replaced by the kernel file's text,
one self-contained file KernelBench's evaluator loads as it loads any solution.

Where the argument is a module-level name bound once to a string (`cuda_src = \"\"\"...\"\"\"`, then
`cuda_sources=cuda_src`), that string is replaced, so the file reads as its author wrote it; otherwise the
argument itself. Everything else in the file is left byte for byte."""

from __future__ import annotations

import ast

# load_inline's positional parameters, in order (torch.utils.cpp_extension.load_inline)
POSITIONAL = ["name", "cpp_sources", "cuda_sources", "sycl_sources", "functions"]


class ExportError(Exception):
    pass


def literal(text: str) -> str:
    """A Python string literal for `text`: raw triple-quoted where that reads back the same, else repr."""
    for q in ('"""', "'''"):
        cand = f"r{q}{text}{q}"
        try:
            if q not in text and not text.endswith("\\") and ast.literal_eval(cand) == text:
                return cand
        except (SyntaxError, ValueError):
            pass
    return repr(text)


def _is_load_inline(node: ast.AST) -> bool:
    f = getattr(node, "func", None)
    return isinstance(node, ast.Call) and ((isinstance(f, ast.Name) and f.id == "load_inline")
                                           or (isinstance(f, ast.Attribute) and f.attr == "load_inline"))


def _argument(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    i = POSITIONAL.index(name)
    return call.args[i] if i < len(call.args) else None


def _bound_once(tree: ast.Module, name: str) -> ast.Constant | None:
    """The string a module-level name is bound to, where it is bound exactly once, at the top level."""
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
             and any(isinstance(t, ast.Name) and t.id == name
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if len(found) == 1 and found[0] in tree.body and isinstance(found[0].value, ast.Constant) \
            and isinstance(found[0].value.value, str):
        return found[0].value
    return None


def _offset(lines: list[bytes], lineno: int, col: int) -> int:
    return sum(len(x) for x in lines[:lineno - 1]) + col


def splice(model_new: str, argument: str, source: str, header: str = "") -> str:
    """model_new.py's text with its load_inline call's `argument` ("cuda_sources" / "cpp_sources") set to `source`."""
    tree = ast.parse(model_new)
    calls = [n for n in ast.walk(tree) if _is_load_inline(n)]
    if len(calls) != 1:
        raise ExportError(f"model_new.py: load_inline: called {len(calls)} times (one is what the import took)")
    node = _argument(calls[0], argument)
    if node is None:
        raise ExportError(f"model_new.py: load_inline: no {argument} argument to put the kernel in")
    if isinstance(node, ast.Name):
        node = _bound_once(tree, node.id) or node
    data = model_new.encode()
    lines = data.splitlines(keepends=True)
    a = _offset(lines, node.lineno, node.col_offset)
    b = _offset(lines, node.end_lineno, node.end_col_offset)
    out = (data[:a] + literal(source).encode() + data[b:]).decode()
    return header + out
