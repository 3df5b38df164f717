"""Apply a proposal's edits to the task's editable files: all or nothing.

Each search/replace block must match exactly once; failing an exact match, it may match once when
leading/trailing whitespace per line and blank lines are ignored. A block that matches nowhere is
answered with the closest actual lines of the file (aider's "did you mean"), a block that matches
several times with the count. Edits outside the task's `editable` files are refused, as are
absolute paths, `..` and symlinks. If any block fails, no file is changed.
"""

from __future__ import annotations

import difflib
import os
from enum import Enum
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from agent.proposal import Edit

CLOSEST_MAX_LINES = 12


class PatchStatus(str, Enum):
    ok = "ok"
    did_not_apply = "did_not_apply"          # a block matched nowhere or more than once
    outside_editable = "outside_editable"    # a path the task does not allow
    no_change = "no_change"                  # every block applied, but the files are as they were


class PatchResult(BaseModel):
    ok: bool
    status: PatchStatus
    files_changed: list[str] = []
    applied: list[int] = []                  # indices of the blocks that applied (or would have)
    fuzzy: list[int] = []                    # those that needed the whitespace-tolerant match
    message: str                             # one paragraph for the proposer (closest lines on a miss)
    diff: str = ""                           # unified diff of every changed file


class _BlockFailed(Exception):
    pass


def apply_edits(edits: list[Edit], task_root: Path, editable: list[str]) -> PatchResult:
    """Apply `edits` to files under `task_root`; only files named in `editable` may change."""
    root = Path(task_root).resolve()
    allowed = {_norm(f) for f in editable}
    for i, e in enumerate(edits):
        why = _refuse_path(e.file, root, allowed)
        if why:
            return PatchResult(ok=False, status=PatchStatus.outside_editable, message=(
                f"edit {i + 1} refused: {why}. The editable files are: {', '.join(sorted(allowed))}. "
                "No file was changed."))

    before: dict[str, str] = {}
    after: dict[str, str] = {}
    applied, fuzzy, failures = [], [], []
    for i, e in enumerate(edits):
        name = _norm(e.file)
        if name not in after:
            p = root / name
            before[name] = p.read_text() if p.exists() else ""
            after[name] = before[name]
        try:
            after[name], was_fuzzy = _apply_one(e, after[name], name)
        except _BlockFailed as f:
            failures.append(f"block {i + 1} ({name}) did not apply: {f}")
            continue
        applied.append(i)
        if was_fuzzy:
            fuzzy.append(i)

    if failures:
        ok_part = (f"Blocks {', '.join(str(i + 1) for i in applied)} would apply; "
                   if applied else "No block applied; ")
        return PatchResult(ok=False, status=PatchStatus.did_not_apply, applied=applied, fuzzy=fuzzy,
                           message="\n\n".join(failures) + f"\n\n{ok_part}no file was changed. "
                           "Send all the blocks again, with search text copied exactly from the file.")

    changed = [n for n in after if after[n] != before[n]]
    if not changed:
        return PatchResult(ok=False, status=PatchStatus.no_change, applied=applied, fuzzy=fuzzy,
                           message="every block applied but no file changed (replace equals search)")
    _write_all({n: after[n] for n in changed}, root)
    note = f" ({len(fuzzy)} matched ignoring whitespace)" if fuzzy else ""
    return PatchResult(ok=True, status=PatchStatus.ok, files_changed=changed, applied=applied, fuzzy=fuzzy,
                       message=f"applied {len(applied)} block(s){note} to {', '.join(changed)}",
                       diff="".join(unified_diff(before[n], after[n], n) for n in changed))


def unified_diff(before: str, after: str, path: str, context: int = 3) -> str:
    """A git-style unified diff of one file (a/PATH, b/PATH); empty when nothing changed."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=context)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# --- paths ---------------------------------------------------------------------------------
def _norm(rel: str) -> str:
    return PurePosixPath(rel.replace("\\", "/")).as_posix()


def _refuse_path(rel: str, root: Path, allowed: set[str]) -> str | None:
    """Why `rel` may not be edited, or None if it may."""
    p = PurePosixPath(rel.replace("\\", "/"))
    if p.is_absolute() or (rel[1:2] == ":"):
        return f"{rel!r} is an absolute path (paths are relative to the task folder)"
    if ".." in p.parts:
        return f"{rel!r} leaves the task folder ('..')"
    name = p.as_posix()
    if name not in allowed:
        return f"{rel!r} is not an editable file of this task"
    full = root / name
    walk = root
    for part in p.parts:
        walk = walk / part
        if walk.is_symlink():
            return f"{rel!r} goes through a symlink ({walk.relative_to(root)})"
    if full.exists() and root not in full.resolve().parents:
        return f"{rel!r} resolves outside the task folder"
    return None


def _write_all(texts: dict[str, str], root: Path) -> None:
    """Write every file to a temporary sibling first, then rename them all into place."""
    tmps = []
    try:
        for name, text in texts.items():
            tmp = root / (name + ".agent-tmp")
            tmp.write_text(text)
            tmps.append((tmp, root / name))
        for tmp, dest in tmps:
            os.replace(tmp, dest)
    finally:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)


# --- one block -----------------------------------------------------------------------------
def _apply_one(e: Edit, text: str, name: str) -> tuple[str, bool]:
    if e.content is not None:
        return e.content, False
    search, replace = e.search or "", e.replace or ""
    n = text.count(search)
    if n == 1:
        return text.replace(search, replace, 1), False
    if n > 1:
        raise _BlockFailed(f"the search text matches {n} times; include more surrounding lines so it "
                           "matches exactly once")
    return _apply_tolerant(search, replace, text, name), True


def _apply_tolerant(search: str, replace: str, text: str, name: str) -> str:
    lines = text.splitlines(keepends=True)
    file_nb = [(i, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    want = [ln.strip() for ln in search.splitlines() if ln.strip()]
    if not want:
        raise _BlockFailed("the search text is only whitespace")
    m = len(want)
    hits = [k for k in range(len(file_nb) - m + 1)
            if [s for _, s in file_nb[k:k + m]] == want]
    if len(hits) > 1:
        raise _BlockFailed(f"the search text matches {len(hits)} times (ignoring whitespace); include more "
                           "surrounding lines so it matches exactly once")
    if not hits:
        raise _BlockFailed("the search text is not in the file.\n" + closest_lines(search, text))
    first, last = file_nb[hits[0]][0], file_nb[hits[0] + m - 1][0]
    new = _reindent(replace, search, lines[first])
    if lines[last].endswith("\n") and not new.endswith("\n"):
        new += "\n"
    return "".join(lines[:first]) + new + "".join(lines[last + 1:])


def _reindent(replace: str, search: str, first_file_line: str) -> str:
    """If the file's block is indented by a uniform extra prefix over the search, indent the replacement too."""
    first_search = next((ln for ln in search.splitlines() if ln.strip()), "")
    have = first_file_line[:len(first_file_line) - len(first_file_line.lstrip())]
    said = first_search[:len(first_search) - len(first_search.lstrip())]
    if not have.endswith(said) or have == said:
        return replace
    extra = have[:len(have) - len(said)]
    return "".join(extra + ln if ln.strip() else ln for ln in replace.splitlines(keepends=True))


def closest_lines(search: str, text: str) -> str:
    """The window of the file most similar to `search`, with line numbers (difflib ratio)."""
    lines = text.splitlines()
    want = search.strip("\n").splitlines()
    if not lines:
        return "The file is empty."
    size = max(1, min(len(want), len(lines)))
    target = "\n".join(ln.strip() for ln in want)
    best, best_at = -1.0, 0
    sm = difflib.SequenceMatcher(autojunk=False)
    sm.set_seq2(target)
    for start in range(0, len(lines) - size + 1):
        sm.set_seq1("\n".join(ln.strip() for ln in lines[start:start + size]))
        if sm.real_quick_ratio() <= best or sm.quick_ratio() <= best:
            continue
        r = sm.ratio()
        if r > best:
            best, best_at = r, start
    shown = lines[best_at:best_at + min(size, CLOSEST_MAX_LINES)]
    body = "\n".join(f"{best_at + 1 + j:5d} | {ln}" for j, ln in enumerate(shown))
    more = f"\n      ... ({size - len(shown)} more lines)" if size > len(shown) else ""
    return (f"Did you mean these lines ({best_at + 1}-{best_at + size}, {best:.0%} similar)?\n"
            f"{body}{more}")
