"""Finding and loading runs for review: one folder per run under runs/, read through agent/runlog.py.

A folder that is not a run (sweep-*, stray files) is skipped; a run whose log this agent cannot read
(another schema version, a damaged file) is returned as `Unreadable` with the reason, never misread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agent.figures import Figure, best_figure
from agent.runlog import (Decision, IterationRecord, LogError, RunConfig, RunState, read_config, read_iterations,
                          read_state)


@dataclass
class Run:
    dir: Path
    cfg: RunConfig
    state: RunState
    records: list[IterationRecord]

    @property
    def id(self) -> str:
        return self.cfg.run_id

    def kept(self) -> list[IterationRecord]:
        return [r for r in self.records if r.decision == Decision.kept]

    def record(self, n: int) -> IterationRecord:
        for r in self.records:
            if r.iteration == n:
                return r
        have = f"1-{len(self.records)}" if self.records else "none logged"
        raise LogError(f"run {self.id} has no iteration {n} (iterations: {have})")

    def best_speedup(self, which: str) -> Figure | None:
        """The best's speedup over "initial" or "reference", as every view shows it (agent/figures.py)."""
        return best_figure(self.state, which)


@dataclass
class Unreadable:
    dir: Path
    reason: str

    @property
    def id(self) -> str:
        return self.dir.name


def load_run(run_dir: Path) -> Run:
    """Read a run's config, state and iterations. Raises LogError with the reason when it cannot."""
    try:
        cfg = read_config(run_dir)
        state = read_state(run_dir)
        records = read_iterations(run_dir)
    except json.JSONDecodeError as e:
        raise LogError(f"{run_dir}: a log file is not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise LogError(f"{run_dir}: the log does not match this agent's schema ({where}: {err['msg']})") from None
    except OSError as e:
        raise LogError(f"{run_dir}: cannot read the log: {e.strerror}") from None
    return Run(run_dir, cfg, state, records)


def list_runs(runs_dir: Path) -> list[Run | Unreadable]:
    """Every run folder under runs_dir, newest first. Folders without a run.json are not runs."""
    if not runs_dir.is_dir():
        return []
    out: list[Run | Unreadable] = []
    for d in runs_dir.iterdir():
        if not d.is_dir() or not (d / "run.json").exists():
            continue
        try:
            out.append(load_run(d))
        except LogError as e:
            out.append(Unreadable(d, str(e)))
    return sorted(out, key=_started, reverse=True)


def _started(r: Run | Unreadable) -> str:
    if isinstance(r, Run):
        return r.cfg.started
    try:
        started = json.loads((r.dir / "run.json").read_text()).get("started")
        return started if isinstance(started, str) else ""
    except (OSError, ValueError, AttributeError):
        return ""


def resolve_run(runs_dir: Path, ref: str) -> Path:
    """A run folder from an id, a unique id prefix, or a path to the folder."""
    p = Path(ref)
    if (p / "run.json").exists():
        return p
    d = runs_dir / ref
    if (d / "run.json").exists():
        return d
    matches = sorted(q for q in runs_dir.glob(f"{ref}*") if (q / "run.json").exists()) if runs_dir.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LogError(f"no run {ref!r} under {runs_dir} (see `agent runs`)")
    raise LogError(f"run id {ref!r} is ambiguous: {', '.join(p.name for p in matches)}")
