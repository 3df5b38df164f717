"""A small, safe arithmetic evaluator for task.toml's formulas ([metrics]) and knob restrictions:
arithmetic, comparisons, names, min() and max(), nothing else (no attribute, call or subscript)."""

from __future__ import annotations

import ast
import operator
from typing import Any

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"min": min, "max": max}


def compile_expr(src: str, allowed: set[str] | None) -> ast.Expression:
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"expression {src!r} does not parse: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and allowed is not None and node.id not in allowed | set(_FUNCS):
            raise ValueError(f"expression {src!r} names {node.id!r}, which is not a knob")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS):
            raise ValueError(f"expression {src!r}: only min() and max() may be called")
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Lambda, ast.comprehension)):
            raise ValueError(f"expression {src!r}: only arithmetic, comparisons and names are allowed")
    return tree


def eval_expr(src: str, env: dict[str, Any]) -> Any:
    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float, bool)):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in env:
                raise ValueError(f"expression {src!r}: {n.id!r} is not defined here (have {sorted(env)})")
            return env[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            return _BIN[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return not ev(n.operand)
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare):
            left = ev(n.left)
            for op, right_n in zip(n.ops, n.comparators):
                right = ev(right_n)
                if type(op) not in _CMP or not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.IfExp):
            return ev(n.body) if ev(n.test) else ev(n.orelse)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUNCS:
            return _FUNCS[n.func.id](*(ev(a) for a in n.args))
        raise ValueError(f"expression {src!r}: unsupported syntax {type(n).__name__}")

    return ev(compile_expr(src, allowed=None))
