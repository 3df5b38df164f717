"""Structured proposals: the JSON schema sent to the endpoint, and reading a Proposal from a reply.

The schema is derived from agent/proposal.py (never written twice) and made portable: references
inlined, every property required (optional ones nullable), no keywords that strict mode or local
grammar engines reject; pydantic checks the rest after the reply. Replies in plain text are read
from the whole text, a ```json fence, or the first balanced {...}.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import ValidationError

from agent.proposal import Proposal

# filled by the loop or the heuristic proposer, never by the model
_LOOP_FIELDS = ("proposer", "knobs")
_DROP_KEYS = {"default", "title", "minLength", "maxLength", "exclusiveMinimum", "minimum", "minItems"}


class ReplyInvalid(Exception):
    """The reply is not a valid Proposal; the message is the exact problem, for the model to fix."""


def proposal_schema() -> dict[str, Any]:
    raw = Proposal.model_json_schema()
    defs = raw.pop("$defs", {})
    for f in _LOOP_FIELDS:
        raw["properties"].pop(f, None)
    return _portable(raw, defs)


def _portable(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_portable(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _portable(copy.deepcopy(defs[node["$ref"].split("/")[-1]]), defs)
    out = {k: _portable(v, defs) for k, v in node.items() if k not in _DROP_KEYS}
    if out.get("type") == "object" and "properties" in out:
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


def extract_json(text: str) -> Any:
    """The JSON value in a reply: the whole text, else a ```json fence, else the first balanced {...}."""
    stripped = text.strip()
    if not stripped:
        raise ReplyInvalid("the reply is empty; answer with one JSON object")
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as e:
        first_error = e
    for m in re.finditer(r"```(?:json|JSON)?\s*\n(.*?)```", text, re.S):
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError as e:
            first_error = e
            break
    obj = _first_balanced_object(text)
    if obj is not None:
        try:
            return json.loads(obj)
        except json.JSONDecodeError as e:
            first_error = e
    raise ReplyInvalid(f"the reply is not valid JSON: {first_error.msg} at line {first_error.lineno} column "
                       f"{first_error.colno}; answer with one JSON object and nothing else")


def _first_balanced_object(text: str) -> str | None:
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i + 1]
        start = text.find("{", start + 1)
    return None


def parse_proposal(text: str) -> Proposal:
    data = extract_json(text)
    if not isinstance(data, dict):
        raise ReplyInvalid(f"the reply is JSON but a {type(data).__name__}, not an object with the Proposal fields")
    for f in _LOOP_FIELDS:
        data.pop(f, None)
    try:
        return Proposal.model_validate(data)
    except ValidationError as e:
        raise ReplyInvalid(validation_problem(e)) from None


def validation_problem(e: ValidationError) -> str:
    """pydantic's errors, one line each: where (field path) and the exact message."""
    lines = []
    for err in e.errors(include_url=False):
        where = ".".join(str(x) for x in err["loc"]) or "(the object)"
        lines.append(f"- {where}: {err['msg']}")
    return f"the JSON does not match the Proposal schema ({e.error_count()} error(s)):\n" + "\n".join(lines)
