"""A kept iteration whose record a kill cut (issue 42), rebuilt on `agent resume` from its commit.

A keep amends the candidate's commit with the kept message (tools' measured figures, the Agent-Run,
Agent-Iteration and Speedup trailers: agent/gitops.py kept_message), then appends the record, then rewrites
state.json. A kill between the amend and the end of the record's write leaves the kept commit at the tip of the
run's branch, its record torn (moved aside by agent.runlog.mend_tail) and state.json naming the parent as the
best. Without this the resumed run would put the commit aside and do the iteration again. The commit's message is
written only after every check passed, so it is evidence of the keep: its record is rebuilt from it (the
hypothesis, the prediction, the measured median and speedup, the diff and whole-file edits of the changed files),
says that it was rebuilt, and the run's state follows it.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.runlog import Decision, IterationRecord, Outcome, RunConfig, RunState

_TRAILER = re.compile(r"^([A-Za-z][\w-]*): (.+)$")
_PREDICTED = re.compile(r"^Predicted: (\S+) (up|down), ([\d.]+)x\.?$", re.M)
_MEDIAN = re.compile(r"^Measured on [^:]+: ([\d.]+) us median", re.M)
_SPEEDUP = re.compile(r"^([\d.]+)x")


def trailers(message: str) -> dict[str, str]:
    """The trailers of a commit message: the `Key: value` lines of its last paragraph."""
    last = message.strip().split("\n\n")[-1]
    return {m.group(1): m.group(2).strip() for m in (_TRAILER.match(ln) for ln in last.splitlines()) if m}


def kept_record(cfg: RunConfig, state: RunState, iteration: int, rgit) -> IterationRecord | None:
    """The record of `iteration` rebuilt from the run branch's tip, where the tip is that iteration's kept commit
    on top of the recorded best; None otherwise (nothing to rebuild: the tip is the best, a candidate not yet
    decided, a rejected one, or another run's)."""
    head = rgit.head()
    if not head or head == state.best_sha:
        return None
    commit = rgit.repo.commit(head)
    message = commit.message if isinstance(commit.message, str) else commit.message.decode(errors="replace")
    t = trailers(message)
    title = message.splitlines()[0] if message else ""
    if (t.get("Agent-Run") != cfg.run_id or t.get("Agent-Iteration") != str(iteration) or "Speedup" not in t
            or not title.startswith("agent: ") or "(under evaluation)" in title
            or [p.hexsha for p in commit.parents] != [state.best_sha]):
        return None
    speedup = _SPEEDUP.match(t["Speedup"])
    body = message.split("\n\n")
    hypothesis = body[1].strip() if len(body) > 2 else title.removeprefix("agent: ")
    pred = _PREDICTED.search(message)
    predicted = PredictedEffect(metric=pred.group(1), direction=pred.group(2), speedup=float(pred.group(3))) if pred \
        else PredictedEffect(metric="time.median_ms", direction="down", speedup=float(speedup.group(1)) if speedup else 1.0)
    prefix = cfg.task_dir.rstrip("/") + "/"
    changed = [d.b_path for d in commit.parents[0].diff(commit) if d.b_path and d.b_path.startswith(prefix)]
    edits = [Edit(file=p.removeprefix(prefix), content=(commit.tree / p).data_stream.read().decode(errors="replace"))
             for p in changed]
    median = _MEDIAN.search(message)
    when = datetime.fromtimestamp(commit.committed_date, tz=timezone.utc).isoformat(timespec="seconds")
    return IterationRecord(
        run_id=cfg.run_id, iteration=iteration, started=when, finished=when,
        proposal=Proposal(hypothesis=hypothesis, predicted=predicted, edits=edits or [Edit(file="-", content="")],
                          proposer="rebuilt from the kept commit's message"),
        patch=rgit.repo.git.diff(state.best_sha, head, "--", cfg.task_dir), parent_sha=state.best_sha,
        commit_sha=head, decision=Decision.kept, outcome=Outcome.kept,
        reason=(f"kept: {t['Speedup']} over the parent (record rebuilt on resume from commit {head[:10]}'s message: a "
                "kill cut the original while it was written; the stage details are in the commit message only)"),
        speedup_vs_best=float(speedup.group(1)) if speedup else None,
        best_ms=float(median.group(1)) / 1e3 if median else None)


def follow_kept(state: RunState, rec: IterationRecord) -> RunState:
    """The state after `rec`'s keep, as the loop leaves it (agent.best.Best.advance, then the keep's own fields)."""
    from agent.figures import estimate
    before = estimate(state, "initial")
    chain = (before.value if before else 1.0) * rec.speedup_vs_best if rec.speedup_vs_best else state.chain_vs_initial
    return state.model_copy(update={"best_sha": rec.commit_sha, "best_iteration": rec.iteration,
                                    "iterations_done": rec.iteration, "chain_vs_initial": chain,
                                    "best_ms": rec.best_ms if rec.best_ms is not None else state.best_ms})


def recover(run_dir, cfg: RunConfig, state: RunState, rgit) -> tuple[RunState, str] | None:
    """On resume, a keep a kill interrupted after its commit: the state follows the kept commit at the branch's
    tip, and where its record is missing (cut by the kill, or never written) it is rebuilt from the commit
    (kept_record). Returns the new state (written) and what to tell the user, or None where there was nothing."""
    from agent.runlog import append_iteration, read_iterations, write_json_atomic
    head = rgit.head()
    if not head or head == state.best_sha:
        return None
    records = read_iterations(run_dir)
    last = records[-1] if records else None
    if last is not None and last.decision == Decision.kept and last.commit_sha == head \
            and last.parent_sha == state.best_sha:
        rec, said = last, (f"iteration {last.iteration} was kept and recorded, but the kill came before the run's "
                           f"state was saved: the best is its commit {head[:10]} again")
    elif (rec := kept_record(cfg, state, len(records) + 1, rgit)) is not None:
        append_iteration(run_dir, rec)
        said = (f"iteration {rec.iteration} was kept (commit {head[:10]}) but the kill cut its record: rebuilt from the "
                "commit's message, and the best is that commit")
    else:
        return None
    new = follow_kept(state, rec)
    write_json_atomic(run_dir / "state.json", new)
    return new, said
