"""The iteration prompt's content: sources, knobs, profile, history, within a context budget.

The sources are never truncated (a prompt without the code cannot produce a patch): if they do not
fit, the call fails with the sizes. The history gives way first, oldest iterations dropped first.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from agent.llm.costs import CHARS_PER_TOKEN, estimate_tokens
from agent.llm.prompts import render
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
        if k.file in ctx.rewritten:     # task.toml's words describe the file as shipped (issue 63)
            said = knob_comment(ctx.sources.get(k.file, ""), k.name)
            desc += (f" [task.toml's description, of the file as the task shipped it; iteration {ctx.rewritten[k.file]} "
                     f"rewrote {k.file}: what {k.name} does now is what the code says"
                     + (f"; its #define's comment now: {said}" if said else "") + "]")
        lines.append(f"- {k.name} = {cur} (allowed: {', '.join(map(str, k.values))}) in {k.file}{desc}")
    if spec.restrictions:
        stale = sorted({k.file for k in spec.knobs if k.file in ctx.rewritten})
        lines.append(f"- restrictions: {'; '.join(spec.restrictions)}" + (
            f" [task.toml's, written for {', '.join(stale)} as the task shipped it, rewritten since: `agent sweep` "
            f"still keeps to them; what the code needs now is what it says]" if stale else ""))
    return "\n".join(lines)


def knob_comment(text: str, name: str) -> str:
    """The trailing comment of the knob's #define line in the file now ("" if none)."""
    m = re.search(rf"(?m)^\s*#\s*define\s+{re.escape(name)}\b[^\n]*?(?://|/\*)\s*(.*?)\s*(?:\*/)?$", text)
    return m.group(1) if m else ""


DIFF_ITEMS = 3        # the latest iterations shown with their diff
DIFF_LINES = 14       # changed lines shown of each
LINE_CHARS = 160


def short_diff(patch: str) -> str:
    """A diff's changed lines only (no headers, no context), cut to DIFF_LINES lines of LINE_CHARS characters."""
    changed = [ln for ln in patch.splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()]
    shown = [ln if len(ln) <= LINE_CHARS else ln[:LINE_CHARS] + " ..." for ln in changed[:DIFF_LINES]]
    more = [f"  ... {len(changed) - DIFF_LINES} more changed lines"] if len(changed) > DIFF_LINES else []
    return "\n".join(shown + more)


def format_history_item(h: HistoryItem, with_diff: bool = False) -> str:
    """One earlier iteration: the hypothesis; the speedup predicted and the one measured against the best of the time
    (with its 95% interval) and the candidate's time; the repairs it went through; why it ended; its diff."""
    measured = ""
    if h.speedup is not None:
        ci = f" [{h.interval[0]:.3f}, {h.interval[1]:.3f}]" if h.interval else ""
        measured = f"measured {h.speedup:.3f}x{ci} vs the best of the time"
    if h.ms is not None:
        measured += (", " if measured else "measured ") + f"{h.ms:.4f} ms on the main shape"
    predicted = f"predicted {h.predicted:.2f}x" if h.predicted is not None else ""
    knobs = f" knobs {h.knobs}" if h.knobs else ""
    lines = [f"- iteration {h.iteration} [{h.outcome}]{knobs}: {' '.join(h.hypothesis.split())}"]
    if predicted or measured:
        lines.append("  " + "; ".join(x for x in (predicted, measured) if x))
    if h.resources:
        lines.append(f"  build and launch plan: {h.resources}")
    if h.profile:
        lines.append(f"  its own profile: {h.profile}")
    lines += [f"  repair {n}: {' '.join(r.split())[:300]}" for n, r in enumerate(h.repairs, 1)]
    lines.append(f"  result: {' '.join(h.reason.split())}")
    diff = short_diff(h.patch) if with_diff else ""
    if diff:
        lines.append("  diff:\n" + "\n".join("    " + ln for ln in diff.splitlines()))
    return "\n".join(lines)


def format_history(items: list[HistoryItem], dropped: int) -> str:
    if not items and not dropped:
        return "(none yet: this is the first proposal)"
    lines = [f"({dropped} earlier iteration(s) omitted to fit the context budget)"] if dropped else []
    return "\n".join(lines + [format_history_item(h, with_diff=n >= len(items) - DIFF_ITEMS)
                               for n, h in enumerate(items)])


def _si(v: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def format_standing(ctx: Context) -> str:
    """Where the best stands: its time, its speedups over the reference and the initial kernel (each saying which
    measurement it comes from, agent/records/figures.py), and the task's work on the main shape with the throughput the best
    achieves and its share of the device's peak."""
    spec = ctx.task.spec
    when = f" ({ctx.times_from})" if ctx.times_from and ctx.reference_ms else ""
    lines = [f"- Current best on the main shape ({shape_label(spec.main)}): {_ms(ctx.best_ms)}; the PyTorch reference: "
             f"{_ms(ctx.reference_ms)}{when}"]
    if (doc := timing_doc(ctx.task)) is not None:
        lines.append(f"- The reference as timed: {doc}")
    if ctx.noise:
        lines.append(f"- Noise: {ctx.noise}")
    for name, f in (("the PyTorch reference", ctx.vs_reference), ("the initial kernel", ctx.vs_initial)):
        if f is not None and (f.confirmed or abs(f.value - 1.0) > 1e-9 or name.endswith("reference")):
            lines.append(f"- The best against {name}: {f.text()} ({f.source})")
    flops, nbytes = spec.flops(spec.main), spec.bytes(spec.main)
    work = []
    if flops:
        work.append(f"{_si(flops, 'FLOP')} (`{spec.metrics.flops}`)")
    if nbytes:
        work.append(f"{_si(nbytes, 'B')} moved at least (`{spec.metrics.bytes}`)")
    if work:
        lines.append(f"- Work on the main shape: {', '.join(work)}")
    if work and ctx.best_ms:
        s = ctx.best_ms / 1e3
        rates = []
        for v, unit, peak in ((flops, "FLOP/s", ctx.peak.tflops * 1e12 if ctx.peak else None),
                              (nbytes, "B/s", ctx.peak.gbps * 1e9 if ctx.peak else None)):
            if v:
                rates.append(_si(v / s, unit) + (f" = {100 * v / s / peak:.1f}% of peak" if peak else ""))
        of = (f" (peaks: {ctx.peak.label}, {_si(ctx.peak.tflops * 1e12, 'FLOP/s')}, {_si(ctx.peak.gbps * 1e9, 'B/s')})"
              if ctx.peak else "")
        lines.append(f"- The best achieves {', '.join(rates)}{of}")
    return "\n".join(lines)


def timing_doc(task) -> str | None:
    """The docstring of the task's timing_reference, read from task.py's source, not imported (the agent never imports
    a task module): what the figures against the reference are figures against (issue 63: the model read "compared
    with SDPA on fp32-upcast inputs", the parity reference, while the timed one ran fp16 at 340 TFLOP/s)."""
    import ast
    try:
        tree = ast.parse(task.path(task.spec.module).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "timing_reference"), None)
    doc = ast.get_docstring(fn) if fn is not None else None
    if doc:
        return (f"(task.py timing_reference) {' '.join(doc.split()).rstrip('.')}; correctness is checked against "
                f"task.py's reference")
    sig = task.spec.signature
    if sig is None:
        return None
    ins = ", ".join(f"{a.name} {a.dtype}" for a in sig.args if a.kind == "input")
    return (f"`{sig.reference}` (task.toml [signature] reference, an `agent init` task), called as a user calls it on "
            f"the inputs as drawn ({ins}), on the task's device; correctness is checked against the same function run "
            f"in float64 where it runs so")


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
                  standing=format_standing(ctx),
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
