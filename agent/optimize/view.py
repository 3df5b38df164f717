"""What the user sees while a run goes on: a rich live table (one row per iteration: hypothesis,
current stage, speedup, decision) under a progress bar; plain lines when not on a terminal.
`message` takes markup: its callers escape what they quote (a path, a reason, a hypothesis)."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agent.records.schema import Decision, IterationRecord, RunConfig, RunState
from tools.console import make_console

_STYLE = {Decision.kept: "green", Decision.reverted: "red", Decision.skipped: "yellow", Decision.interrupted: "magenta",
          Decision.revoked: "red"}


class View(Protocol):
    def start(self, cfg: RunConfig, state: RunState) -> None: ...
    def stage(self, iteration: int, stage: str, hypothesis: str | None = None) -> None: ...
    def done(self, rec: IterationRecord, state: RunState) -> None: ...
    def message(self, text: str) -> None: ...
    def close(self) -> None: ...


def make_view(console: Console | None = None, quiet: bool = False) -> View:
    console = console or make_console(stderr=True)
    if quiet:
        return PlainView(console, quiet=True)
    return RichView(console) if console.is_terminal else PlainView(console)


def _fmt_speedup(rec: IterationRecord) -> str:
    b = rec.bench.speedup_vs_baseline if rec.bench else None
    if b is None:
        return "-"
    return f"{b.median:.3f}x [{b.low:.3f}, {b.high:.3f}]"


class PlainView:
    def __init__(self, console: Console, quiet: bool = False):
        self.console, self.quiet, self.total = console, quiet, 0

    def start(self, cfg: RunConfig, state: RunState) -> None:
        self.total = cfg.iters

    def stage(self, iteration: int, stage: str, hypothesis: str | None = None) -> None:
        pass

    def done(self, rec: IterationRecord, state: RunState) -> None:
        if self.quiet:
            return
        hyp = rec.proposal.summary() if rec.proposal else (rec.proposal_error or "-")
        # the model's hypothesis and the compiler's or parity's reason: printed as written, never as markup
        self.console.print(f"iter {rec.iteration:>3}/{self.total} {rec.decision.value:<11} {_fmt_speedup(rec):<28} "
                           f"{hyp[:70]}  -- {rec.reason[:100]}", highlight=False, soft_wrap=True, markup=False)

    def message(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False, soft_wrap=True)

    def close(self) -> None:
        pass


class RichView:
    def __init__(self, console: Console):
        self.console = console
        self.rows: dict[int, list[str | Text]] = {}   # the hypothesis and the reason as Text: never markup
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self.bar = None
        self.live: Live | None = None
        self.best = ""

    def start(self, cfg: RunConfig, state: RunState) -> None:
        self.bar = self.progress.add_task(escape(f"{cfg.task} {cfg.run_id}"), total=cfg.iters,
                                          completed=state.iterations_done)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _render(self):
        t = Table(expand=True, show_edge=False, pad_edge=False)
        t.add_column("#", justify="right", width=4)
        t.add_column("hypothesis", ratio=3, overflow="ellipsis", no_wrap=True)
        t.add_column("stage", width=12)
        t.add_column("speedup vs best [CI]", width=28)
        t.add_column("decision", width=11)
        t.add_column("reason", ratio=2, overflow="ellipsis", no_wrap=True)
        for i in sorted(self.rows)[-25:]:
            t.add_row(str(i), *self.rows[i])
        return Group(t, self.progress, self.best)

    def _refresh(self) -> None:
        if self.live:
            self.live.update(self._render())

    def stage(self, iteration: int, stage: str, hypothesis: str | None = None) -> None:
        row = self.rows.setdefault(iteration, ["…", stage, "", "", ""])
        row[1] = stage
        if hypothesis:
            row[0] = Text(hypothesis)
        self._refresh()

    def done(self, rec: IterationRecord, state: RunState) -> None:
        hyp = rec.proposal.summary() if rec.proposal else (rec.proposal_error or "-")
        style = _STYLE.get(rec.decision, "white")
        self.rows[rec.iteration] = [Text(hyp), "done", _fmt_speedup(rec), f"[{style}]{rec.decision.value}[/]",
                                    Text(rec.reason)]
        if self.bar is not None:
            self.progress.update(self.bar, completed=state.iterations_done)
        if state.best_ms:
            self.best = f"best: {state.best_ms * 1e3:.1f} us (iteration {state.best_iteration or 'initial'})"
        self._refresh()

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def close(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

