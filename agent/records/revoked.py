"""A keep revoked, as the records hold it: a check run after the keep refused the kept kernel (issue 66, slice 18).
The act (git, then these records, then the state): agent/optimize/revoke.py.

Why there is such a thing: beside a keep's confirmation, compute-sanitizer's racecheck holds the card and parity's
checks wait for it (+2.2-3 s of attention's kept iteration on an H200, BENCHMARKS.md slice 13). Run after the keep,
while the model proposes (tools/judge/later.py), its verdict comes after the iteration was recorded kept. Where it
refuses the kernel, the keep is undone (agent/optimize/revoke.py), as a reject is, and the log says what happened:

1. the kept commit is copied with a message that says it was revoked and why (a commit object of the same tree and
   parent; its title is no kept commit's, so nothing that rebuilds keeps from commits follows it again) and kept
   under refs/agent/RUN/revoked/N, reviewable as a rejected one is;
2. its record is rewritten in place (agent/records/store.py rewrite_iteration): decision `revoked`, outcome
   `refused_after_keep`, the sanitizer's result in its parity, its reason when kept in `kept_reason`. Every reader
   (report, show, cherry-pick, the proposer's history) then reads it as a rejected iteration;
3. the run's state goes back to what it was before the keep (the best's fields; the run's progress stays);
4. the branch goes back to the best before it.

In that order: a kill after 2 and before 3 leaves a state naming the revoked commit, which `agent resume` mends
(agent/records/recover.py: the best's record says revoked, the state before the keep is in its iteration's folder,
state-before.json); a kill after 3 and before 4 leaves the branch's tip at the revoked keep, which resume parks and
resets as it does any tip the state does not name.
"""

from __future__ import annotations

from pathlib import Path

from agent.records.schema import Decision, IterationRecord, Outcome, RunState
from tools.results import ParityStatus, SanitizerResult

# the state's fields that describe the best (what a keep changed); the others are the run's progress and stay
BEST_FIELDS = ("best_sha", "best_iteration", "best_ms", "chain_vs_initial", "confirmed_sha", "confirmed_vs_initial",
               "confirmed_vs_initial_low", "confirmed_vs_initial_high", "confirmed_vs_reference",
               "confirmed_vs_reference_low", "confirmed_vs_reference_high", "confirmed_ms", "kept_sha",
               "kept_vs_reference", "kept_vs_reference_low", "kept_vs_reference_high", "kept_ms")
BEFORE = "state-before.json"     # in the kept iteration's folder: the state as the keep found it


def save_before(run_dir: Path, iteration: int, state: RunState) -> None:
    """The state as a keep of `iteration` finds it, kept in the iteration's folder (written atomically) before the keep
    changes it: what a revocation goes back to, and what `agent resume` restores after a kill mid-revocation."""
    from agent.records.store import write_json_atomic
    d = run_dir / f"iter-{iteration}"
    d.mkdir(parents=True, exist_ok=True)
    write_json_atomic(d / BEFORE, state)


def state_before(run_dir: Path, rec: IterationRecord, records: list[IterationRecord], now: RunState) -> RunState:
    """The state `rec`'s keep found: its folder's state-before.json, else rebuilt from the records (the last keep
    before it, the chain of the kept steps' speedups; the figures a confirmation measured are then unknown)."""
    p = run_dir / f"iter-{rec.iteration}" / BEFORE
    try:
        return RunState.model_validate_json(p.read_text())
    except (OSError, ValueError):
        pass
    kept = [r for r in records if r.decision == Decision.kept and r.iteration < rec.iteration and r.commit_sha]
    chain = None
    for r in kept:
        chain = (chain or 1.0) * r.speedup_vs_best if r.speedup_vs_best else chain
    last = kept[-1] if kept else None
    return RunState(best_sha=rec.parent_sha, best_iteration=last.iteration if last else None,
                    best_ms=last.best_ms if last else now.initial_ms, chain_vs_initial=chain)


def restored(now: RunState, before: RunState) -> RunState:
    """`now` with the best's fields as they were in `before`."""
    return now.model_copy(update={k: getattr(before, k) for k in BEST_FIELDS})


def revoked_record(rec: IterationRecord, found: list[SanitizerResult], sha: str, ref: str) -> IterationRecord:
    """`rec` (kept) as revoked by the failed checks of `found`: their results in its parity."""
    bad = [r for r in found if r.status != "ok"]
    why = "; ".join(r.message for r in bad) or "a check after the keep did not pass"
    par = rec.parity
    if par is not None:
        status = ParityStatus.race if any(r.tool == "racecheck" and r.status == "failed" for r in bad) else \
            ParityStatus.invalid_access if any(r.status == "failed" for r in bad) else ParityStatus.unchecked
        par = par.model_copy(update={**{r.tool: r for r in found}, "status": status,
                                     "message": f"{par.message}; after the keep: {why}"})
    return rec.model_copy(update={"decision": Decision.revoked, "outcome": Outcome.refused_after_keep,
                                  "reason": f"revoked after the keep: {why}", "kept_reason": rec.reason,
                                  "parity": par, "commit_sha": sha, "rejected_ref": ref})
