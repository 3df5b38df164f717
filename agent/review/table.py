"""`agent runs`: one row per run, newest first, as a rich table or JSON."""

from __future__ import annotations

from pydantic import BaseModel
from rich import box
from rich.table import Table
from rich.text import Text

from agent.review.runs import Run, Unreadable


class RunRow(BaseModel):
    id: str
    readable: bool = True
    reason: str = ""                   # why it cannot be read (readable=False)
    task: str = ""
    started: str = ""
    proposer: str = ""
    iterations: int = 0
    iters_max: int = 0
    kept: int = 0
    baseline: str = ""                 # what --target was measured against
    target: float | None = None
    best_vs_initial: float | None = None
    best_vs_reference: float | None = None
    confirmed: bool = False            # the speedups come from the interleaved confirmation bench
    status: str = ""
    stop_reason: str = ""


def row(r: Run | Unreadable) -> RunRow:
    if isinstance(r, Unreadable):
        return RunRow(id=r.id, readable=False, reason=r.reason, status="unreadable")
    vi, vr = r.best_speedup("initial"), r.best_speedup("reference")
    proposer = r.cfg.proposer + (f"/{r.cfg.model}" if r.cfg.model else "")
    return RunRow(id=r.id, task=r.cfg.task, started=r.cfg.started, proposer=proposer,
                  iterations=len(r.records), iters_max=r.cfg.iters, kept=len(r.kept()), baseline=r.cfg.baseline,
                  target=r.cfg.target, best_vs_initial=vi.value if vi else None,
                  best_vs_reference=vr.value if vr else None, confirmed=bool(vi and vi.confirmed),
                  status=r.state.status, stop_reason=r.state.stop_reason)


_STATUS_STYLE = {"done": "green", "running": "cyan", "interrupted": "yellow", "failed": "red", "unreadable": "red",
                 "unknown": "yellow"}


def runs_table(rows: list[RunRow], title: str) -> Table:
    # no vertical rules, no edges and one space between columns: 20 characters more for the cells
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False, pad_edge=False)
    # at 80 columns every column keeps a readable width: text folds onto more lines instead of being cut
    # to one character and an ellipsis; the start is shown as month-day hour:minute (UTC). Fixed widths,
    # 79 columns with the separators (the status takes what is left): rich's own sharing of a narrow
    # terminal cut the status column short
    fold = {"overflow": "fold"}
    for c, kw in (("run", {**fold, "width": 11}), ("task", {**fold, "width": 10}), ("started", {**fold, "width": 7}),
                  ("proposer", {**fold, "width": 10}), ("iters", {"justify": "right", "width": 5}),
                  ("kept", {"justify": "right", "width": 4}), ("vs initial", {"justify": "right", "width": 7}),
                  ("vs ref", {"justify": "right", "width": 6}), ("status", {**fold, "min_width": 11})):
        t.add_column(c, **kw)
    for r in rows:
        if not r.readable:
            reason = r.reason.split(": ", 1)[1] if r.reason.startswith("/") and ": " in r.reason else r.reason
            t.add_row(r.id, "", "", "", "", "", "", "", Text(f"unreadable: {reason}", style="red"))
            continue
        mark = "" if r.confirmed else " (est.)"
        t.add_row(r.id, r.task, _short_time(r.started), r.proposer,
                  f"{r.iterations}/{r.iters_max}", str(r.kept),
                  (f"{r.best_vs_initial:.2f}x{mark}" if r.best_vs_initial is not None else "-"),
                  (f"{r.best_vs_reference:.2f}x" if r.best_vs_reference is not None else "-"),
                  f"[{_STATUS_STYLE.get(r.status, 'white')}]{r.status}[/]")
    return t


def _short_time(iso: str) -> str:
    """2026-11-25T07:46:12+00:00 -> 11-25 07:46 (the year and seconds say little in a list of runs)."""
    date, _, time = iso.partition("T")
    return f"{date[5:]} {time[:5]}".strip() if time else iso
