"""Finding and loading runs for review: one folder per run under runs/, read through agent/records/store.py.

A folder that is not a run (sweep-*, stray files) is skipped; a run whose log this agent cannot read
(another schema version, a damaged file) is returned as `Unreadable` with the reason, never misread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from agent.records.figures import Figure, best_figure
from agent.records.schema import Decision, IterationRecord, RunConfig, RunState
from agent.records.store import LogError, read_config, read_iterations, read_state


@dataclass
class Run:
    dir: Path
    cfg: RunConfig
    state: RunState
    records: list[IterationRecord]
    notes: list[str] = field(default_factory=list)   # what could not be read, a line each: shown, then the rest

    @property
    def id(self) -> str:
        return self.cfg.run_id

    def kept(self) -> list[IterationRecord]:
        return [r for r in self.records if r.decision == Decision.kept]

    def find(self, n: int) -> IterationRecord | None:
        return next((r for r in self.records if r.iteration == n), None)

    def record(self, n: int) -> IterationRecord:
        if (r := self.find(n)) is not None:
            return r
        have = f"1-{len(self.records)}" if self.records else "none logged"
        raise LogError(f"run {self.id} has no iteration {n} (iterations: {have})")

    def best_speedup(self, which: str) -> Figure | None:
        """The best's speedup over "initial" or "reference", as every view shows it (agent/records/figures.py)."""
        return best_figure(self.state, which)


@dataclass
class Unreadable:
    dir: Path
    reason: str

    @property
    def id(self) -> str:
        return self.dir.name


def load_run(run_dir: Path) -> Run:
    """Read a run's config, state and iterations. Raises LogError with the reason where the run cannot be read at all
    (no readable run.json, another schema). What is damaged or missing past that (issue 61: a torn or lost record, a
    damaged state.json) goes into `notes`, a line each, and the rest is read: a damaged line is left out, a damaged
    state is taken from the records, a kept iteration with no record is shown rebuilt from its commit (not saved:
    `agent resume RUN --repair` saves it)."""
    notes: list[str] = []
    try:
        cfg = read_config(run_dir)
        records = read_iterations(run_dir, notes)
    except json.JSONDecodeError as e:
        raise LogError(f"{run_dir}: a log file is not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise LogError(f"{run_dir}: the log does not match this agent's schema ({where}: {err['msg']})") from None
    except OSError as e:
        raise LogError(f"{run_dir}: cannot read the log: {e.strerror}") from None
    try:
        state = read_state(run_dir)
    except LogError as e:
        if "written by log schema version" in str(e):
            raise
        state, where = _state_from_branch(cfg, _state_from_records(records),
                                            {r.iteration for r in records if r.decision == Decision.revoked})
        notes.append(f"{e}".split("; the run cannot be read")[0] + ": its status and figures are unknown; the best "
                     f"is taken from {where}")
    records = _with_lost_kept(run_dir, cfg, state, records, notes)
    return Run(run_dir, cfg, state, records, notes)


def _state_from_records(records: list[IterationRecord]) -> RunState:
    kept = [r for r in records if r.decision == Decision.kept and r.commit_sha]
    last = kept[-1] if kept else None
    return RunState(status="unknown", iterations_done=max((r.iteration for r in records), default=0),
                    best_sha=last.commit_sha if last else (records[0].parent_sha if records else ""),
                    best_iteration=last.iteration if last else None, best_ms=last.best_ms if last else None)


def _state_from_branch(cfg: RunConfig, state: RunState, revoked: set[int] = frozenset()) -> tuple[RunState, str]:
    """A state rebuilt from the records, moved to the run branch's tip where the tip is a kept commit of this run above
    the last recorded keep (its record lost with the state: a power cut): then _with_lost_kept finds every keep
    between them; not where the records say that keep was revoked (`revoked`: a kill before the branch went back,
    agent/records/revoked.py). Said: where the best was taken from."""
    try:
        import git
        from agent.records.recover import is_kept_commit
        repo = git.Repo(cfg.repo)
        tip = repo.commit(cfg.branch)
        n = is_kept_commit(cfg, tip)
        if n is None or n in revoked or tip.hexsha == state.best_sha or \
                not repo.is_ancestor(state.best_sha or cfg.base_sha, tip.hexsha):
            return state, "the records"
    except Exception:   # noqa: BLE001 - the repository moved, the branch deleted: the records are what there is
        return state, "the records"
    return state.model_copy(update={"best_sha": tip.hexsha, "best_iteration": n,
                                    "iterations_done": max(state.iterations_done, n)}), \
        f"the run's branch {cfg.branch} (its kept iteration {n})"


def _with_lost_kept(run_dir: Path, cfg: RunConfig, state: RunState, records: list[IterationRecord],
                    notes: list[str]) -> list[IterationRecord]:
    """The records, with every kept iteration the state's best line holds and the log lacks rebuilt from its commit
    (agent/records/recover.py), and a note for each iteration that has no record."""
    have = {r.iteration for r in records}
    missing = sorted(set(range(1, state.iterations_done + 1)) - have)
    if state.best_iteration is not None and state.best_iteration not in have and state.best_iteration not in missing:
        missing.append(state.best_iteration)
    if not missing:
        return records
    rebuilt: list[IterationRecord] = []
    try:
        import git
        from agent.records.recover import missing_kept
        rebuilt = missing_kept(cfg, state.best_sha, have, git.Repo(cfg.repo), "for this view", run_dir)
        why = ""
    except Exception as e:   # noqa: BLE001 - the repository moved, the branch deleted, the commit gone: said, not raised
        why = f" (its commit could not be read from {cfg.repo}: {type(e).__name__})"
    found = {r.iteration for r in rebuilt}
    for n in missing:
        if n in found:
            notes.append(f"iteration {n} has no record in {run_dir / 'iterations.jsonl'}: shown rebuilt from its kept "
                         f"commit; `agent resume {cfg.run_id} --repair` saves it")
        else:
            notes.append(f"iteration {n} has no record in {run_dir / 'iterations.jsonl'}"
                         + (why or " and is not a kept commit on the run's branch: left out"))
    return sorted(records + rebuilt, key=lambda r: r.iteration)


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
