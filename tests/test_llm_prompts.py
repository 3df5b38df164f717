"""Strict prompt rendering, the prompt files themselves, and reading proposals from replies."""

import json

import pytest

from agent.llm.structured import ReplyInvalid, extract_json, parse_proposal, proposal_schema
from agent.prompts import PROMPTS_DIR, PromptError, placeholders, render, render_text

TEMPLATES = ["system", "iteration", "bootstrap", "repair_patch", "repair_compile", "repair_parity",
             "repair_launch", "repair_schema"]


def test_missing_variable_is_an_error():
    with pytest.raises(PromptError, match="no value for b"):
        render_text("{{a}} and {{ b }}", {"a": 1})


def test_unused_variable_is_an_error():
    with pytest.raises(PromptError, match="never used by the template: c"):
        render_text("{{a}}", {"a": 1, "c": 2})


def test_values_are_not_rescanned():
    code = "template<int N> struct S { int x[N]; }; // {{not_a_var}}"
    assert render_text("```\n{{code}}\n```", {"code": code}) == f"```\n{code}\n```"


def test_every_template_exists_and_renders_with_exactly_its_variables():
    for name in TEMPLATES:
        text = (PROMPTS_DIR / f"{name}.md").read_text()
        names = placeholders(text)
        out = render(name, **{n: f"<{n}>" for n in names})
        assert all(f"<{n}>" in out for n in names)
    assert placeholders((PROMPTS_DIR / "system.md").read_text()) == {"agent_rules", "role"}


def test_unknown_template():
    with pytest.raises(PromptError, match="no template"):
        render("nope")


def test_schema_is_portable():
    s = json.dumps(proposal_schema())
    assert "$ref" not in s and "$defs" not in s and '"default"' not in s
    assert "proposer" not in proposal_schema()["properties"]

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                assert node["additionalProperties"] is False
                assert set(node["required"]) == set(node["properties"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(proposal_schema())


def test_extract_json_forms():
    obj = {"a": "x } { y", "b": [1, {"c": "\"}"}]}
    assert extract_json(json.dumps(obj)) == obj
    assert extract_json("text\n```json\n" + json.dumps(obj) + "\n```\nmore") == obj
    assert extract_json("Sure! " + json.dumps(obj) + " Hope it helps {") == obj
    with pytest.raises(ReplyInvalid, match="the reply is empty"):
        extract_json("   ")
    with pytest.raises(ReplyInvalid, match="not valid JSON"):
        extract_json("no braces at all")


def test_parse_proposal_drops_loop_fields_and_rejects_non_objects():
    good = {"hypothesis": "h", "evidence": [], "predicted": {"metric": "t", "direction": "down", "speedup": 1.1},
            "edits": [{"file": "k.cu", "content": "x"}], "proposer": "forged", "knobs": {"A": 1}}
    p = parse_proposal(json.dumps(good))
    assert p.proposer == "" and p.knobs is None
    with pytest.raises(ReplyInvalid, match="a list, not an object"):
        parse_proposal("[1, 2]")
    with pytest.raises(ReplyInvalid, match=r"- edits: List should have at least 1 item"):
        parse_proposal(json.dumps(dict(good, edits=[])))
