"""Repair inside the iteration (issue 43): a candidate that does not compile (or that the source scan refuses), that
the launch check refuses, that fails parity, or that edits a file it may not goes back to the model in the same
conversation, with what it changed and why it failed, at most `--repairs` times (default 2). Every peer that drives a
model at kernels does this (KernelAgent's refinement rounds, GEAK's reflector, Kevin's multi-turn repair); without it
one typo costs the whole iteration.

The loop (agent/optimize/loop.py `_attempts`) sets a failed attempt aside here: its commit stays under a rejected ref, its
summary (hypothesis, outcome, reason, diff, tokens) goes into the iteration's record (`attempts`), and the attempt's
stage results are cleared for the next one. The iteration's verdict is its last attempt's. A proposer that cannot
repair (the heuristic, replay) gets no repairs: each of its proposals is an iteration of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.evaluation.attempt import Attempt
from agent.evaluation.ended import IterationEnded
from agent.records.schema import Outcome, RepairAttempt, Usage

REPAIRABLE = (Outcome.compile_failed, Outcome.launch_rejected, Outcome.parity_failed, Outcome.edit_outside_editable)
ERRORS_SHOWN = 3         # compiler errors quoted, each with the code around its line
AROUND = 2               # lines of code either side of an error's line
DIFF_LINES = 120         # the failed diff, cut to this many lines
PARITY_SHOWN = 8         # failing parity checks listed
# nvcc: "softmax.cu(123): error: ..."; gcc, clang: "matmul.cpp:12:5: error: ..."
_ERROR = re.compile(r"^(?P<file>[^\s:()]+?)(?:\((?P<l1>\d+)\)|:(?P<l2>\d+)(?::\d+)?):\s*(?:fatal\s+)?error\b.*$", re.M)


def repairable(e: IterationEnded) -> bool:
    return e.outcome in REPAIRABLE


def compiler_errors(log: str, src_dir: Path) -> str:
    """The first ERRORS_SHOWN errors of a build log, each with the numbered code around its line (read from the
    candidate's own file, as it was built), or the log's first lines where no error line is recognised."""
    out = []
    for m in list(_ERROR.finditer(log))[:ERRORS_SHOWN]:
        out.append(m.group(0).strip().replace(m.group("file"), Path(m.group("file")).name, 1))   # no scratch paths
        line = int(m.group("l1") or m.group("l2"))
        src = src_dir / Path(m.group("file")).name
        try:
            lines = src.read_text(errors="replace").splitlines()
        except OSError:
            continue
        lo, hi = max(1, line - AROUND), min(len(lines), line + AROUND)
        out.extend(f"{'>' if n == line else ' '} {n:5d} | {lines[n - 1]}" for n in range(lo, hi + 1))
        out.append("")
    if not out:
        out = [ln for ln in log.splitlines() if ln.strip()][:30]
    return "\n".join(out).strip()


def parity_failures(a: Attempt) -> list[str]:
    """Every failing parity check (one per shape: where, how many elements, the worst one's place, expected and got,
    the errors), and the shapes that passed: a failure on odd shapes only, or on long rows only, shows as such."""
    checks = a.parity.checks if a.parity is not None else []
    bad = [c for c in checks if not c.ok]
    if not bad:
        return []
    listed = "\n".join(f"- {' '.join(c.message.split())[:500]}" for c in bad[:PARITY_SHOWN])
    more = f"\n- ... {len(bad) - PARITY_SHOWN} more" if len(bad) > PARITY_SHOWN else ""
    failed = {c.label for c in bad}
    passed = list(dict.fromkeys(c.label.strip() for c in checks if c.ok and c.label not in failed))
    out = [f"The failing checks ({len(bad)}):\n{listed}{more}"]
    if passed:
        out.append("These shapes passed: " + "; ".join(passed))
    return out


def feedback(e: IterationEnded, a: Attempt, src_dir: Path) -> str:
    """What the model is told of its failed attempt: the error (for a build, its first errors with the code around
    each line), then the diff it made. Built before the candidate is reverted (the code is read from it)."""
    errors = compiler_errors(a.build.log, src_dir) if (
        e.outcome == Outcome.compile_failed and a.build is not None and a.build.log) else ""
    # the reason's first line where the errors follow in full (it quotes them too)
    parts = [f"({e.outcome.value}) {e.reason.strip().splitlines()[0] if errors else e.reason.strip()}"]
    if errors:
        parts.append("The compiler's first errors, with the code around each line:\n\n```\n" + errors + "\n```")
    if e.outcome == Outcome.parity_failed and a.parity is not None:
        parts.extend(parity_failures(a))
    if a.patch.strip():
        lines = a.patch.splitlines()
        cut = "\n".join(lines[:DIFF_LINES]) + (f"\n... ({len(lines) - DIFF_LINES} more lines)" if len(lines) > DIFF_LINES else "")
        parts.append("Your candidate was reverted: the files are again as shown at the start. The change you made "
                     "was:\n\n```diff\n" + cut + "\n```")
    return "\n\n".join(parts)


def set_aside(a: Attempt, e: IterationEnded, rejected_ref: str | None, usage_before: Usage, seconds: float) -> None:
    """Record the failed attempt in `a.attempts` and clear its stage results for the next attempt (the times and
    usage add up across attempts; the proposal, patch and results become the next attempt's)."""
    hyp = a.proposal.hypothesis if a.proposal is not None else ""
    u, b = a.usage, usage_before
    spent = Usage(calls=u.calls - b.calls, prompt_tokens=u.prompt_tokens - b.prompt_tokens,
                  completion_tokens=u.completion_tokens - b.completion_tokens, cost_usd=u.cost_usd - b.cost_usd)
    a.attempts.append(RepairAttempt(attempt=len(a.attempts) + 1, hypothesis=hyp, outcome=e.outcome, reason=e.reason,
                                    patch="\n".join(a.patch.splitlines()[:DIFF_LINES]), rejected_ref=rejected_ref,
                                    usage=spent, seconds=round(seconds, 2)))
    for name in ("proposal", "proposal_error", "commit_sha", "rejected_ref", "build", "launch", "parity", "bench",
                 "confirm", "confirm_error"):
        setattr(a, name, None)
    a.bench_undecided, a.confirm_undecided = [], []
    a.patch, a.patch_message = "", ""
