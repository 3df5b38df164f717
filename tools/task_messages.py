"""The lines a task's author reads when task.toml or task.py breaks the contract (docs/TASKS.md section 6).

pydantic's own first error is often not the one to act on: a misspelt `defualt` in a knob is reported
as `knobs.0.default: Field required`, the typo last and the knob by its position. Here the unknown key
comes first, with the known key it is closest to, and a knob is named by its name.
"""

from __future__ import annotations

import difflib
import threading
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

_DRAWING = threading.RLock()   # make_inputs: one draw at a time in a process


def validation_message(e: ValidationError, raw: dict, model: type[BaseModel]) -> tuple[str, str]:
    """The field and the message of the error to act on first, of those `model.model_validate(raw)` raised."""
    errors = e.errors()
    # a misspelt key also leaves the key it meant missing: the typo is the cause, report it first
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = err["loc"]
    if err["type"] != "extra_forbidden":   # our validators' messages, without pydantic's "Value error, "
        return _field(loc, raw), err["msg"].removeprefix("Value error, ")
    known = list(_model_at(model, loc[:-1]).model_fields)
    table = _value_at(raw, loc[:-1])
    unset = [k for k in known if not (isinstance(table, dict) and k in table)]
    near = difflib.get_close_matches(str(loc[-1]), unset, 1) or difflib.get_close_matches(str(loc[-1]), known, 1)
    if near:
        return _field(loc, raw), f"unknown key: did you mean {near[0]!r}?"
    where = "[[knobs]]" if loc[0] == "knobs" else f"[{'.'.join(map(str, loc[:-1]))}]" if loc[:-1] else "the top level"
    return _field(loc, raw), f"unknown key (a typo?); {where} takes {', '.join(known)}"


def _field(loc: tuple, raw: dict) -> str:
    """`knobs "BLOCK_M".default` for what pydantic calls knobs.1.default: the author knows knobs by name."""
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i == 1 and loc[0] == "knobs" and isinstance(part, int):
            name = _value_at(raw, ("knobs", part, "name"))
            if isinstance(name, str):
                parts[-1] = f'knobs "{name}"'
                continue
        parts.append(str(part))
    return ".".join(parts) or "-"


def _value_at(raw: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The model of the table at loc: through a field into the model inside its annotation (list[Knob],
    dict[str, Tolerance], ExtensionSpec | None), past the index or key that picks an item."""
    for part in loc:
        if isinstance(part, str) and part in model.model_fields:
            model = _inner(model.model_fields[part].annotation) or model
    return model


def _inner(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_inner, typing.get_args(annotation))), None)


def shape_keys_differ(shapes: list[dict]) -> str | None:
    """Why the shapes do not all have the first one's keys: task.py and the formulas read every shape
    with the same keys, and a shape that lacks one fails late with a bare KeyError."""
    first = list(shapes[0])
    for i, s in enumerate(shapes[1:], 1):
        if set(s) != set(first):
            return (f"shape {i} {_toml(s)} has the keys {', '.join(s)} but shape 0 {_toml(shapes[0])} has "
                    f"{', '.join(first)}: give every shape the same keys")
    return None


def hidden_keys_differ(shapes: list[dict], hidden: list) -> str | None:
    """Why a shape task.py's hidden_shapes returned is not one the task can run (checked as parity
    draws them: they are made at random, never in task.toml)."""
    first = list(shapes[0])
    for s in hidden:
        if not isinstance(s, dict):
            return f"task.py's hidden_shapes returned {type(s).__name__} {str(s)[:80]!r} among its shapes: each is a dict"
        if set(s) != set(first):
            return (f"task.py's hidden_shapes returned {_toml(s)} with the keys {', '.join(map(str, s))}, but "
                    f"task.toml's shapes have {', '.join(first)}: give hidden shapes the same keys")
    return None


def _toml(shape: dict) -> str:
    return "{ " + ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in shape.items()) + " }"


def make_inputs(mod: Any, shape: dict, seed: int, device: str, dist: str) -> tuple:
    """task.py's make_inputs, called, its answer checked: the harness spreads it into empty_output, run and
    reference, so a bare tensor would be taken apart row by row (`empty_output() takes 2 positional
    arguments but 17 were given`). One call at a time in a process: the judge draws inputs for parity and for the
    sanitizers' hosts from threads at once, and a task.py may seed torch's global generator (KernelBench's does): each
    draw is still the one its seed names."""
    with _DRAWING:
        got = mod.make_inputs(shape, seed, device, dist)
    if isinstance(got, (tuple, list)):
        return tuple(got)
    what = "None" if got is None else f"a {type(got).__name__}"
    if hasattr(got, "shape") and hasattr(got, "dtype"):
        what += f" ({str(got.dtype).removeprefix('torch.')} {list(got.shape)})"
    raise TypeError(f"task.py's make_inputs returned {what}; it must return a tuple or list of the inputs "
                    "(tensors): return a, b; or return (x,) for one")
