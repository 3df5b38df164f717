"""Prompt templates live in the top-level prompts/*.md, beside AGENT.md; this renders them strictly.

Those are the only copies. A checkout and an editable install read them in place; a wheel carries them
under agent/_shipped/ (setup.py's build step copies them there) and they are read from the installed
package through importlib.resources, so `pip install .` into a fresh environment renders the same prompts.

A placeholder is `{{name}}`. A placeholder with no value is an error, and so is a value that the
template never uses (a variable the code computes for nothing is a prompt that drifted). Values are
inserted once, never re-scanned, so source code with braces in it is safe.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

SHIPPED = ("AGENT.md", "prompts")     # setup.py copies the same two into the wheel


def shipped(name: str) -> Traversable:
    """NAME (one of SHIPPED) from the installed package, else from the top of the source tree."""
    packaged = resources.files("agent") / "_shipped" / name
    if packaged.is_file() or packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / name


PROMPTS_DIR = shipped("prompts")
AGENT_RULES = shipped("AGENT.md")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class PromptError(Exception):
    pass


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))


def render_text(template: str, values: dict[str, object], name: str = "<template>") -> str:
    wanted = placeholders(template)
    missing = sorted(wanted - values.keys())
    unused = sorted(values.keys() - wanted)
    if missing:
        raise PromptError(f"prompt {name}: no value for {', '.join(missing)}")
    if unused:
        raise PromptError(f"prompt {name}: values never used by the template: {', '.join(unused)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def render(name: str, prompts_dir: Traversable | None = None, **values: object) -> str:
    """Render prompts/NAME.md with exactly these values."""
    path = (prompts_dir or PROMPTS_DIR) / f"{name}.md"
    if not path.is_file():
        raise PromptError(f"prompt {name}: no template {path}")
    return render_text(path.read_text(), values, name)


def agent_rules(device: str) -> str:
    """AGENT.md as the model of a `device` ("gpu" or "cpu") task reads it in its system prompt (rules_for)."""
    if not AGENT_RULES.is_file():
        raise PromptError(f"{AGENT_RULES} is missing: the agent's operating rules belong in the system prompt")
    return rules_for(AGENT_RULES.read_text(), device)


_MARK = re.compile(r"<!-- (/?)(gpu|cpu|people) -->\s*")


def rules_for(text: str, device: str) -> str:
    """The rules' text for one device: the blocks between `<!-- gpu -->` and `<!-- /gpu -->` (or cpu) kept for that
    device only, the note for people (`<!-- people -->`) for no model, the marker lines themselves never sent (issue
    63: a CPU task read GPU rules and metric names, and a note addressed to people). A marker out of place is an
    error: a block that never closed would silently take the rest of the rules with it."""
    if device not in ("gpu", "cpu"):
        raise PromptError(f"AGENT.md: no rules for device {device!r} (gpu, cpu)")
    out, inside = [], None
    for line in text.splitlines(keepends=True):
        m = _MARK.fullmatch(line)
        if m is None:
            if inside in (None, device):
                out.append(line)
            continue
        closing, kind = bool(m.group(1)), m.group(2)
        if closing != (inside == kind) or (not closing and inside is not None):
            raise PromptError(f"AGENT.md: {line.strip()} where {'<!-- ' + inside + ' -->' if inside else 'no block'} "
                              "is open")
        inside = None if closing else kind
    if inside is not None:
        raise PromptError(f"AGENT.md: <!-- {inside} --> is never closed")
    return "".join(out).strip()
