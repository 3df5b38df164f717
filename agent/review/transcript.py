"""One iteration's conversation with the model, as the model saw it, rendered from the run's records.

`agent show RUN --iter N --transcript` prints it as markdown: runs/RUN/iter-N/prompt-K.json (the messages of call K,
agent/llm/proposer.py) and response-K.json (the reply as received), every message once and in order: a repair's
request repeats the whole conversation, and only what it adds is shown. Each reply is shown field by field (its
edits as code, not as JSON strings), then what the harness made of each attempt (the record's `attempts`) and the
iteration's verdict. docs/TRANSCRIPT.md is this output for a real run on a GPU (tests/test_transcript.py renders it
again from the run's records kept in tests/fixtures/repair_run/ and compares).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.records.schema import IterationRecord
from agent.records.store import LogError

FENCE = "````"   # a message's own ``` fences stay inside


def _calls(d: Path) -> list[int]:
    ks = sorted(int(p.stem.split("-", 1)[1]) for p in d.glob("prompt-*.json") if p.stem.split("-", 1)[1].isdigit())
    return ks


def _read(p: Path) -> dict[str, Any]:
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LogError(f"{p}: cannot be read ({type(e).__name__})") from None


def _reply_text(resp: dict[str, Any]) -> str | None:
    body = resp.get("body")
    try:
        data = json.loads(body) if isinstance(body, str) else body
        return data["choices"][0]["message"]["content"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


def _reply(text: str) -> list[str]:
    """A reply shown field by field where it is a proposal; as it came otherwise."""
    try:
        p = json.loads(text)
    except json.JSONDecodeError:
        p = None
    if not isinstance(p, dict) or "edits" not in p:
        return [FENCE + "text", text.rstrip(), FENCE]
    out = [f"**hypothesis**: {p.get('hypothesis', '')}", ""]
    for ev in p.get("evidence") or []:
        out.append(f"- evidence: `{ev.get('metric')}` = {ev.get('value')}")
    pred = p.get("predicted") or {}
    out += [f"- predicted: `{pred.get('metric')}` {pred.get('direction')}, {pred.get('speedup')}x", ""]
    for n, e in enumerate(p.get("edits") or [], 1):
        if e.get("content") is not None:
            out += [f"edit {n}: `{e.get('file')}`, the whole file:", "", FENCE, e["content"].rstrip(), FENCE, ""]
        else:
            out += [f"edit {n}: `{e.get('file')}`, search:", "", FENCE, (e.get("search") or "").rstrip(), FENCE,
                    "", "replace:", "", FENCE, (e.get("replace") or "").rstrip(), FENCE, ""]
    return out


def transcript(run_dir: Path, run_id: str, rec: IterationRecord) -> str:
    d = run_dir / f"iter-{rec.iteration}"
    calls = _calls(d)
    if not calls:
        raise LogError(f"iteration {rec.iteration} of run {run_id} has no saved prompts ({d}/prompt-K.json): its "
                       "proposer was not the LLM")
    first = _read(d / f"prompt-{calls[0]}.json")
    out = [f"# Run `{run_id}`, iteration {rec.iteration}: the conversation as the model saw it", "",
           f"Model `{first.get('model')}` at `{first.get('base_url')}`; {len(calls)} call(s); the verdict: "
           f"**{rec.outcome.value}** ({' '.join(rec.reason.split())}).", ""]
    if rec.attempts:
        out += ["| attempt | outcome | seconds | tokens (prompt + completion) |", "|---|---|---|---|"]
        for a in rec.attempts:
            secs = f"{a.seconds:.1f}" if a.seconds is not None else "-"
            out.append(f"| {a.attempt} | {a.outcome.value} | {secs} | {a.usage.prompt_tokens} + "
                       f"{a.usage.completion_tokens} |")
        last = (rec.wall_s or 0.0) - sum(a.seconds or 0.0 for a in rec.attempts)
        spent = rec.usage
        before = [sum(getattr(a.usage, f) for a in rec.attempts) for f in ("prompt_tokens", "completion_tokens")]
        out += [f"| {len(rec.attempts) + 1} | {rec.outcome.value} | {last:.1f} | {spent.prompt_tokens - before[0]} + "
                f"{spent.completion_tokens - before[1]} |", ""]
    seen: list[dict[str, str]] = []
    for k in calls:
        prompt = _read(d / f"prompt-{k}.json")
        msgs = prompt.get("messages") or []
        new = msgs[len(seen):] if msgs[:len(seen)] == seen else msgs
        resp = _read(d / f"response-{k}.json") if (d / f"response-{k}.json").exists() else {}
        where = {"response_format": "as the request's response format (json_schema)",
                 "system message": "appended to the system message by the client"}.get(resp.get("schema_in", ""))
        out += [f"## Call {k}", ""]
        if where:
            out += [f"(The proposal's JSON schema went {where}; not shown.)", ""]
        for m in new:
            if m.get("role") == "assistant":   # the previous call's reply, shown there
                continue
            out += [f"### {m.get('role')}", "", FENCE + "markdown", str(m.get("content", "")).rstrip(), FENCE, ""]
        text = _reply_text(resp) if resp else None
        out += [f"### the model's reply (call {k})", ""]
        if text is None:
            out += [f"(no reply: {resp.get('error', 'not recorded')})", ""]
        else:
            u = resp.get("usage") or {}
            out += _reply(text) + [f"({u.get('prompt_tokens', '?')} + {u.get('completion_tokens', '?')} tokens, "
                                   f"finish_reason {resp.get('finish_reason')})", ""]
        seen = msgs + ([{"role": "assistant", "content": text}] if text is not None else [])
    out += ["## The verdict", "", f"**{rec.outcome.value}**: {' '.join(rec.reason.split())}", ""]
    return "\n".join(out)
