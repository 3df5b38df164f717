"""`agent runs`: one row per run, newest first, as a rich table or JSON."""

from __future__ import annotations

from pydantic import BaseModel
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
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
    notes: list[str] = []              # what could not be read (a torn or lost record, a damaged state): the rest is


def row(r: Run | Unreadable) -> RunRow:
    if isinstance(r, Unreadable):
        return RunRow(id=r.id, readable=False, reason=r.reason, status="unreadable")
    vi, vr = r.best_speedup("initial"), r.best_speedup("reference")
    proposer = r.cfg.proposer + (f"/{r.cfg.model}" if r.cfg.model else "")
    return RunRow(id=r.id, task=r.cfg.task, started=r.cfg.started, proposer=proposer,
                  iterations=len(r.records), iters_max=r.cfg.iters, kept=len(r.kept()), baseline=r.cfg.baseline,
                  target=r.cfg.target, best_vs_initial=vi.value if vi else None,
                  best_vs_reference=vr.value if vr else None, confirmed=bool(vi and vi.confirmed),
                  status=r.state.status, stop_reason=r.state.stop_reason, notes=r.notes)


_STATUS_STYLE = {"done": "green", "running": "cyan", "interrupted": "yellow", "failed": "red", "unreadable": "red",
                 "unknown": "yellow"}

# (header, justify, floor): the narrowest a column is folded to where the width is short; None: never
# folded (a run id is copied into `agent show`, and the numbers are short)
_COLUMNS = (("run", "left", None), ("task", "left", 6), ("started", "left", 7), ("proposer", "left", 6),
            ("iters", "right", None), ("kept", "right", None), ("vs initial", "right", 7), ("vs ref", "right", 5),
            ("status", "left", 11))


class RunsTable:
    """`agent runs`' table, laid out for the width it is printed at: every column at its natural width
    where that fits (piped output is never folded), else the widest foldable columns folded first,
    down to their floors. Rich's own sharing of 80 columns cut the status to 'don' once the task and
    proposer had their minimum widths, and folded run ids over two lines (`20261126-14` / `1337-f958`)."""

    def __init__(self, rows: list[RunRow], title: str):
        self.title = title
        self.cells = [_cells(r) for r in rows]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # no vertical rules, no edges and one space between columns: 20 characters more for the cells
        t = Table(title=escape(self.title), box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False, pad_edge=False)
        room = options.max_width - (len(_COLUMNS) - 1)
        for (head, justify, floor), w in zip(_COLUMNS, _widths(self.cells, room)):
            # a column with no floor is never folded (where even the ids do not fit, rich cuts them: an ellipsis)
            fit = {"no_wrap": True} if floor is None else {"overflow": "fold"}
            t.add_column(head, justify=justify, width=w, **fit)
        for cells in self.cells:
            t.add_row(*cells)
        yield t


def runs_table(rows: list[RunRow], title: str) -> RunsTable:
    return RunsTable(rows, title)


def _cells(r: RunRow) -> list[Text]:
    """One row's cells as text: ids, names and reasons are printed as written, never read as markup."""
    if not r.readable:
        reason = r.reason.split(": ", 1)[1] if r.reason.startswith("/") and ": " in r.reason else r.reason
        return [Text(r.id), *(Text() for _ in range(7)), Text(f"unreadable: {reason}", style="red")]
    mark = "" if r.confirmed else " (est.)"
    return [Text(r.id), Text(r.task), Text(_short_time(r.started)), Text(r.proposer),
            Text(f"{r.iterations}/{r.iters_max}"), Text(str(r.kept)),
            Text(f"{r.best_vs_initial:.2f}x{mark}" if r.best_vs_initial is not None else "-"),
            Text(f"{r.best_vs_reference:.2f}x" if r.best_vs_reference is not None else "-"),
            Text(r.status, style=_STATUS_STYLE.get(r.status, "white"))]


def _widths(rows: list[list[Text]], room: int) -> list[int]:
    """Each column's natural width (its header or its longest cell), less one character at a time from
    the widest column that may fold, until the whole fits the room: down to the floors first, then, on
    a very narrow terminal, below them (folded thin, but no character lost and no id cut)."""
    widths = [max([cell_len(head)] + [r[i].cell_len for r in rows]) for i, (head, _, _) in enumerate(_COLUMNS)]
    floors = [w if floor is None else min(w, floor) for w, (_, _, floor) in zip(widths, _COLUMNS)]
    thinnest = [w if floor is None else 1 for w, (_, _, floor) in zip(widths, _COLUMNS)]
    for low in (floors, thinnest):
        while sum(widths) > room:
            shrinkable = [i for i, w in enumerate(widths) if w > low[i]]
            if not shrinkable:
                break
            widths[max(shrinkable, key=widths.__getitem__)] -= 1
    return widths


def _short_time(iso: str) -> str:
    """2026-11-25T07:46:12+00:00 -> 11-25 07:46 (the year and seconds say little in a list of runs)."""
    date, _, time = iso.partition("T")
    return f"{date[5:]} {time[:5]}".strip() if time else iso
