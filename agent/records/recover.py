"""A kept iteration whose record a kill cut (issue 42), rebuilt on `agent resume` from its commit.

A keep amends the candidate's commit with the kept message (tools' measured figures, the Agent-Run,
Agent-Iteration and Speedup trailers: agent/optimize/gitops.py kept_message), then appends the record, then rewrites
state.json. A kill between the amend and the end of the record's write leaves the kept commit at the tip of the
run's branch, its record torn (moved aside by agent.records.store.mend_tail) and state.json naming the parent as the
best. Without this the resumed run would put the commit aside and do the iteration again. The commit's message is
written only after every check passed, so it is evidence of the keep: its record is rebuilt from it (the
hypothesis, the prediction, the measured median and speedup, the diff and whole-file edits of the changed files),
says that it was rebuilt, and the run's state follows it.

Issue 61: a power cut can also leave state.json naming a best whose record never reached the disk (a finished run
included). `missing_kept` finds every kept commit on the best's line with no record; the review commands show them
rebuilt (agent/review/runs.py, not saved), `agent resume` and `agent resume --repair` save them (`repair`).
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.records.schema import Decision, IterationRecord, Outcome, RunConfig, RunState
from agent.records.store import LogError, check_version, log_bytes, write_atomic
from tools.results import BenchResult, ParityResult

_TRAILER = re.compile(r"^([A-Za-z][\w-]*): (.+)$")
_PREDICTED = re.compile(r"^Predicted: (\S+) (up|down), ([\d.]+)x\.?$", re.M)
_MEDIAN = re.compile(r"^Measured on [^:]+: ([\d.]+) us median", re.M)
_SPEEDUP = re.compile(r"^([\d.]+)x")


def trailers(message: str) -> dict[str, str]:
    """The trailers of a commit message: the `Key: value` lines of its last paragraph."""
    last = message.strip().split("\n\n")[-1]
    return {m.group(1): m.group(2).strip() for m in (_TRAILER.match(ln) for ln in last.splitlines()) if m}


def _message(commit) -> str:
    m = commit.message
    return m if isinstance(m, str) else m.decode(errors="replace")


def is_kept_commit(cfg: RunConfig, commit, iteration: int | None = None) -> int | None:
    """The iteration a commit is this run's kept commit of (its kept message's trailers), or None: a candidate under
    evaluation, a rejected one, another run's, the user's. With `iteration`, only that one."""
    message = _message(commit)
    t, title = trailers(message), (message.splitlines()[0] if message else "")
    n = t.get("Agent-Iteration", "")
    if (t.get("Agent-Run") != cfg.run_id or not n.isdigit() or "Speedup" not in t or not title.startswith("agent: ")
            or "(under evaluation)" in title or (iteration is not None and int(n) != iteration)):
        return None
    return int(n)


def _artifact(run_dir: Path | None, iteration: int, name: str, model):
    """A typed result the iteration wrote to runs/RUN/iter-N/ (agent/optimize/best.py dump_results), or None."""
    if run_dir is None:
        return None
    try:
        return model.model_validate_json((run_dir / f"iter-{iteration}" / name).read_text())
    except (OSError, ValueError):
        return None


def record_from_commit(cfg: RunConfig, repo, commit, iteration: int, when_said: str,
                       run_dir: Path | None = None) -> IterationRecord:
    """The record of a kept iteration rebuilt from its commit on the run's branch (its message holds the hypothesis,
    the prediction and the measured median and speedup; its diff the edits) and from the bench, confirmation and
    parity results the iteration left in runs/RUN/iter-N/ where they are whole; the reason says it was rebuilt and
    `when_said` (on resume, by a repair)."""
    message = _message(commit)
    t, title = trailers(message), (message.splitlines()[0] if message else "")
    parent = commit.parents[0].hexsha if commit.parents else ""
    speedup = _SPEEDUP.match(t.get("Speedup", ""))
    body = message.split("\n\n")
    hypothesis = body[1].strip() if len(body) > 2 else title.removeprefix("agent: ")
    pred = _PREDICTED.search(message)
    predicted = PredictedEffect(metric=pred.group(1), direction=pred.group(2), speedup=float(pred.group(3))) if pred \
        else PredictedEffect(metric="time.median_ms", direction="down", speedup=float(speedup.group(1)) if speedup else 1.0)
    prefix = cfg.task_dir.rstrip("/") + "/"
    changed = [d.b_path for d in commit.parents[0].diff(commit) if d.b_path and d.b_path.startswith(prefix)] \
        if commit.parents else []
    edits = [Edit(file=p.removeprefix(prefix), content=(commit.tree / p).data_stream.read().decode(errors="replace"))
             for p in changed]
    median = _MEDIAN.search(message)
    when = datetime.fromtimestamp(commit.committed_date, tz=timezone.utc).isoformat(timespec="seconds")
    found = {k: _artifact(run_dir, iteration, name, model) for k, name, model in
             (("bench", "bench.json", BenchResult), ("confirm", "confirm-bench.json", BenchResult),
              ("parity", "parity.json", ParityResult))}
    files = [name for k, name in (("bench", "bench.json"), ("confirm", "confirm-bench.json"), ("parity", "parity.json"))
             if found[k] is not None]
    return IterationRecord(
        run_id=cfg.run_id, iteration=iteration, started=when, finished=when, **found,
        proposal=Proposal(hypothesis=hypothesis, predicted=predicted, edits=edits or [Edit(file="-", content="")],
                          proposer="rebuilt from the kept commit's message"),
        patch=repo.git.diff(parent, commit.hexsha, "--", cfg.task_dir) if parent else "", parent_sha=parent,
        commit_sha=commit.hexsha, decision=Decision.kept, outcome=Outcome.kept,
        reason=(f"kept: {t.get('Speedup', '?')} over the parent (record rebuilt {when_said} from commit "
                f"{commit.hexsha[:10]}'s message" + (f" and iter-{iteration}/{', '.join(files)}" if files else "")
                + ": the original was cut or lost; the other stage details are in the commit message only)"),
        speedup_vs_best=float(speedup.group(1)) if speedup else None,
        best_ms=float(median.group(1)) / 1e3 if median else None)


def kept_record(cfg: RunConfig, state: RunState, iteration: int, rgit,
                run_dir: Path | None = None) -> IterationRecord | None:
    """The record of `iteration` rebuilt from the run branch's tip, where the tip is that iteration's kept commit
    on top of the recorded best; None otherwise (nothing to rebuild: the tip is the best, a candidate not yet
    decided, a rejected one, or another run's)."""
    head = rgit.head()
    if not head or head == state.best_sha:
        return None
    commit = rgit.repo.commit(head)
    if is_kept_commit(cfg, commit, iteration) is None or [p.hexsha for p in commit.parents] != [state.best_sha]:
        return None
    return record_from_commit(cfg, rgit.repo, commit, iteration, "on resume", run_dir)


def missing_kept(cfg: RunConfig, best_sha: str, have: set[int], repo, when_said: str,
                 run_dir: Path | None = None) -> list[IterationRecord]:
    """The kept iterations on the best's line of the run's branch (its first parents, down to the user's commit the
    run started from) that have no record in `have`, each rebuilt from its commit (issue 61: a power cut can leave
    state.json naming a best whose record never reached the disk). Oldest first."""
    out: list[IterationRecord] = []
    if not best_sha or best_sha == cfg.base_sha:
        return out
    commit = repo.commit(best_sha)
    for _ in range(cfg.iters + 1):   # a kept commit per iteration at most
        if commit.hexsha == cfg.base_sha or not commit.parents:
            break
        n = is_kept_commit(cfg, commit)
        if n is not None and n not in have:
            out.append(record_from_commit(cfg, repo, commit, n, when_said, run_dir))
        commit = commit.parents[0]
    return out[::-1]


def follow_kept(state: RunState, rec: IterationRecord) -> RunState:
    """The state after `rec`'s keep, as the loop leaves it (agent.optimize.best.Best.advance, then the keep's own fields)."""
    from agent.records.figures import estimate
    before = estimate(state, "initial")
    chain = (before.value if before else 1.0) * rec.speedup_vs_best if rec.speedup_vs_best else state.chain_vs_initial
    return state.model_copy(update={"best_sha": rec.commit_sha, "best_iteration": rec.iteration,
                                    "iterations_done": rec.iteration, "chain_vs_initial": chain,
                                    "best_ms": rec.best_ms if rec.best_ms is not None else state.best_ms})


def recover(run_dir, cfg: RunConfig, state: RunState, rgit) -> tuple[RunState, str] | None:
    """On resume, a keep a kill interrupted after its commit: the state follows the kept commit at the branch's
    tip, and where its record is missing (cut by the kill, or never written) it is rebuilt from the commit
    (kept_record). Returns the new state (written) and what to tell the user, or None where there was nothing."""
    from agent.records.revoked import restored, state_before
    from agent.records.store import append_iteration, read_iterations, write_json_atomic
    records = read_iterations(run_dir)
    best = next((r for r in records if r.iteration == state.best_iteration), None)
    if best is not None and best.decision == Decision.revoked:   # the kill came mid-revocation (agent/records/revoked.py)
        new = restored(state, state_before(run_dir, best, records, state))
        write_json_atomic(run_dir / "state.json", new)
        return new, (f"iteration {best.iteration}'s keep was revoked ({best.reason}), but the kill came before the "
                     f"run's state was saved: the best is {new.best_sha[:10]} again, as before that keep")
    head = rgit.head()
    if not head or head == state.best_sha:
        return None
    last = records[-1] if records else None
    if last is not None and last.decision == Decision.kept and last.commit_sha == head \
            and last.parent_sha == state.best_sha:
        rec, said = last, (f"iteration {last.iteration} was kept and recorded, but the kill came before the run's "
                           f"state was saved: the best is its commit {head[:10]} again")
    elif (rec := kept_record(cfg, state, max((r.iteration for r in records), default=0) + 1, rgit, run_dir)) \
            is not None:
        append_iteration(run_dir, rec)
        said = (f"iteration {rec.iteration} was kept (commit {head[:10]}) but the kill cut its record: rebuilt from the "
                "commit's message, and the best is that commit")
    else:
        return None
    new = follow_kept(state, rec)
    write_json_atomic(run_dir / "state.json", new)
    return new, said


def set_aside_damaged(run_dir: Path) -> tuple[Path, list[int]] | None:
    """Every whole line of iterations.jsonl that is not a readable record moved to iterations.jsonl.damaged-N, the
    file rewritten (synced, renamed) with the readable ones: `agent resume --repair`. Returns (where, the line
    numbers), or None where every line reads."""
    p = run_dir / "iterations.jsonl"
    if (raw := log_bytes(p)) is None:
        return None
    keep, bad = [], []
    for i, line in enumerate(raw.splitlines(keepends=True), 1):
        try:
            data = json.loads(line)
            check_version(data, "")
            IterationRecord.model_validate(data)
            keep.append(line)
        except (ValueError, LogError, TypeError, AttributeError):
            bad.append((i, line))
    if not bad:
        return None
    n = 1
    while (aside := run_dir / f"iterations.jsonl.damaged-{n}").exists():
        n += 1
    with open(aside, "wb") as f:
        f.write(b"".join(line if line.endswith(b"\n") else line + b"\n" for _, line in bad))
        f.flush()
        os.fsync(f.fileno())
    write_atomic(p, b"".join(keep))
    return aside, [i for i, _ in bad]


def repair(run_dir: Path, cfg: RunConfig, state: RunState, repo) -> list[str]:
    """`agent resume RUN --repair`, and `agent resume` before anything else, a finished run included: a torn last
    record and damaged lines set aside (agent/records/store.py), then every kept iteration on the best's line of the run's
    branch that has no record rebuilt from its commit and appended. What was done, a line each."""
    from agent.records.store import append_iteration, mend_tail, read_iterations
    said = []
    if (torn := mend_tail(run_dir)) is not None:
        said.append(f"the last record was cut short by the kill ({torn[1]} bytes): moved to {torn[0]}, the records go "
                    "on from the last whole one")
    if (bad := set_aside_damaged(run_dir)) is not None:
        said.append(f"damaged records (lines {', '.join(map(str, bad[1]))} of iterations.jsonl) moved to {bad[0]}")
    have = {r.iteration for r in read_iterations(run_dir)}
    try:
        rebuilt = missing_kept(cfg, state.best_sha, have, repo, "by a repair", run_dir)
    except Exception as e:   # noqa: BLE001 - BadName (a ValueError): the commit is gone; a git error: its object is
        # damaged (a power cut before git's own writes reached the disk): said, the rest of the repair stands
        return [*said, f"the best commit {state.best_sha[:10]} is not in {cfg.repo} ({type(e).__name__}): kept "
                       "records that are missing cannot be rebuilt"]
    for rec in rebuilt:
        append_iteration(run_dir, rec)
        said.append(f"iteration {rec.iteration} was kept (commit {rec.commit_sha[:10]}) but its record was missing: "
                    "rebuilt from the commit and the iteration's result files")
    return said


def mend_records(run_dir: Path, cfg: RunConfig, state: RunState, repo, rgit=None) -> tuple[RunState, list[str]]:
    """What `agent resume` and `agent resume --repair` mend before anything else, in this order: the records
    (repair), then, given the run's git (`rgit`: a run that will go on, not a finished one), a keep the kill
    interrupted after its commit (recover). The state after it, and what was done, a line each."""
    said = repair(run_dir, cfg, state, repo)
    if rgit is not None and (got := recover(run_dir, cfg, state, rgit)) is not None:
        state = got[0]
        said.append(got[1])
    return state, said
