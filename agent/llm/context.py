"""The iteration prompt's content: sources, knobs, profile, history, within a context budget.

The sources are never truncated (a prompt without the code cannot produce a patch): if they do not
fit, the call fails with the sizes. The history gives way first, oldest iterations dropped first.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from agent.llm.costs import CHARS_PER_TOKEN, estimate_tokens
from agent.prompts import render
from agent.proposers.base import Context, HistoryItem
from tools.profile.model import ProfileReport
from tools.task import shape_label

_FENCE = {".cu": "cuda", ".cuh": "cuda", ".cpp": "cpp", ".cc": "cpp", ".h": "cpp", ".hpp": "cpp", ".py": "python"}


class ContextTooLarge(Exception):
    pass


def compact_profile(profile: ProfileReport | None) -> str:
    """The profile without the raw metric dump; the caller may pass its own compact view instead."""
    if profile is None:
        return '{"status": "none", "message": "no profile yet"}'
    data = profile.model_dump(mode="json", exclude_none=True)
    for k in data.get("kernels", []):
        k.pop("metrics", None)
    return json.dumps(data, separators=(",", ":"))


def format_sources(sources: dict[str, str]) -> str:
    parts = []
    for name, text in sources.items():
        lang = _FENCE.get(PurePosixPath(name).suffix, "")
        body = text if text.strip() else "(empty file)\n"
        parts.append(f"### {name}\n\n```{lang}\n{body}{'' if body.endswith(chr(10)) else chr(10)}```")
    return "\n\n".join(parts)


def format_knobs(ctx: Context) -> str:
    spec = ctx.task.spec
    if not spec.knobs:
        return "(this task declares no knobs)"
    lines = []
    for k in spec.knobs:
        now = ctx.knobs.get(k.name)
        cur = "missing from the source" if now is None and k.name in ctx.knobs else (now if now is not None else k.default)
        desc = f": {k.description}" if k.description else ""
        lines.append(f"- {k.name} = {cur} (allowed: {', '.join(map(str, k.values))}) in {k.file}{desc}")
    if spec.restrictions:
        lines.append(f"- restrictions: {'; '.join(spec.restrictions)}")
    return "\n".join(lines)


def format_history_item(h: HistoryItem) -> str:
    gain = f", {h.speedup:.3f}x" if h.speedup is not None else ""
    knobs = f" knobs {h.knobs}" if h.knobs else ""
    hyp = " ".join(h.hypothesis.split())
    reason = " ".join(h.reason.split())
    return f"- iteration {h.iteration} [{h.outcome}{gain}]{knobs}: {hyp}\n  result: {reason}"


def format_history(items: list[HistoryItem], dropped: int) -> str:
    if not items and not dropped:
        return "(none yet: this is the first proposal)"
    lines = [f"({dropped} earlier iteration(s) omitted to fit the context budget)"] if dropped else []
    return "\n".join(lines + [format_history_item(h) for h in items])


def _ms(v: float | None) -> str:
    return f"{v:.4f} ms" if v is not None else "not measured yet"


def iteration_prompt(ctx: Context, profile_json: str, budget_tokens: int, machine: str = "") -> str:
    """Render agent/prompts/iteration.md within `budget_tokens` (history dropped oldest first); `machine`: the
    machine, toolchain and harness lines (agent/llm/machine.py)."""
    spec = ctx.task.spec
    empty = [f for f, t in ctx.sources.items() if not t.strip()]
    bootstrap = ""
    if empty:
        module = ctx.task.root / spec.module
        bootstrap = render("bootstrap", empty_files=", ".join(empty), module_name=spec.module,
                           module_source=module.read_text().rstrip() if module.is_file() else "(missing)")
    values = dict(iteration=ctx.iteration, task_name=spec.name, device=spec.device,
                  description=spec.description.strip() or "(no description)",
                  main_shape=shape_label(spec.main), best=_ms(ctx.best_ms), reference=_ms(ctx.reference_ms),
                  shapes="; ".join(shape_label(s) for s in spec.shapes), editable=", ".join(spec.editable),
                  knobs=format_knobs(ctx), profile=profile_json, bootstrap=bootstrap, machine=machine or "(not known)",
                  sources=format_sources(ctx.sources))
    history = list(ctx.history)
    for dropped in range(len(history) + 1):
        text = render("iteration", history=format_history(history[dropped:], dropped), **values)
        if estimate_tokens(text) <= budget_tokens:
            return text
    fixed = estimate_tokens(text)
    src = estimate_tokens(values["sources"])
    raise ContextTooLarge(
        f"the iteration prompt needs about {fixed} tokens with no history ({src} of them the editable sources, "
        f"{estimate_tokens(profile_json)} the profile), over the context budget of {budget_tokens} tokens left "
        f"after the system prompt; raise context_tokens (now about {budget_tokens * CHARS_PER_TOKEN} characters "
        "for this message) or make the editable files smaller; the sources are never truncated")
