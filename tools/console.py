"""The rich consoles that `agent` and the instruments' command lines (python -m tools.build, ...) print
through. On a terminal rich's defaults stand: lines fit the window. Anywhere else (a pipe, a file, a
CI log) nothing is folded or cut: rich took its width from COLUMNS or from whichever of stdin, stdout
and stderr was a terminal, and split CI logs' lines at 80 columns (`unknown key (a` / `typo?)`), so a
line read there could not be copied or searched.

Markup is for the tool's own styling only: what a compiler, a kernel, a model, a user's file, a path
or a git ref wrote goes in as `Text` (or through `escape`), since rich reads the `[i]` of `xr[i]` as
italics and drops it."""

from __future__ import annotations

from rich.console import Console

# wider than any line the tool prints: a table is laid out at its natural width, never shrunk
UNFOLDED = 1 << 16


def make_console(stderr: bool = False, **kw) -> Console:
    """A console on stdout (or stderr) as it is now: call it when printing, not at import, so that a
    stream replaced since (pytest's capture, a redirect) is the one asked whether it is a terminal."""
    con = Console(stderr=stderr, **kw)
    if not con.is_terminal:
        con.width = UNFOLDED
        con.soft_wrap = True
    return con

