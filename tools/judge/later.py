"""compute-sanitizer's checks on a library, run in a judge child of their own while the agent goes on (issue 66).

Why: beside a keep's confirmation, racecheck holds the card for seconds at a time (one call of attention's S=333 shape
took 2.3 s under it on an H200), and every small synchronizing step of parity waits for its slice: the confirmation's
checks took 8.6-9.0 s beside it and 5.5-6.4 s without (BENCHMARKS.md, issue 66 slice 13). Run after the keep, while
the model proposes and nvcc builds, its seconds are off the keep's path; a confirmation's job then names it in
`later` (tools/judge/judge.py evaluate leaves it out) and the loop starts it here as the keep ends.

The agent's side: `Later(task, lib, checks, scratch_root)` starts `python -m tools.judge.judge sanitize` at once, in
a scratch directory of its own, with the confirmation child's guarantees (tools/isolation/sandbox.py Prestarted: its
own session, its group killed at its budget or with the agent); a thread waits for it. `held`: the child
prestart_later() started before the keep (agent/evaluation/spares.py holds it), its hosts already up under the tool:
racecheck's start there was 4.3-5.8 s of its 5.5-10.8 s after a keep on an H200 (BENCHMARKS.md, session 34), paid by
the iteration after the keep where its proposal came sooner (the heuristic's at once). `done` says whether it has
answered; `results()` waits for it and returns one SanitizerResult a check: a child that failed, timed out or
answered garbage is an `error` for each check (a check that did not run is not a pass: tools/judge/sanitize.py
unchecked). `close()` ends it where it is.

The judge's side: `sanitize_job`, the checks of tools/judge/sanitize.py (each in a host of its own under the tool:
the one the held child started before its job came, `--sanitize-early`, else one started with the job; Sanitizing) on
the job's library and seed.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

from tools.backends.jitcache import judge_env
from tools.isolation.sandbox import ProcStatus, child_json, prestart_python
from tools.judge.candidate import WarmChild
from tools.judge.sanitize import TIMEOUT_S, Sanitizing
from tools.results import SanitizerResult

START_S = 120.0      # the child's own start-up (torch, a CUDA context) on top of the checks' budgets


def sanitize_job(task, mod, job: dict, early: dict | None = None) -> dict:
    """{"sanitizers": [SanitizerResult fields, one a check of job["checks"], in that order]}, all begun now, each
    in the host `early` (start_hosts: `--sanitize-early`) holds for it, else in one started now."""
    checks = tuple(job.get("checks") or ())
    if not checks:
        raise ValueError("no check named (memcheck, racecheck)")
    beside = Sanitizing(task, mod, job, checks, early)
    try:
        return {"sanitizers": [f.result() for f in beside.futures]}
    finally:
        beside.stop()


def prestart_later(task, checks: tuple[str, ...], scratch_root: Path | None = None) -> WarmChild:
    """The judge child of a Later, started now with compute-sanitizer's hosts for `checks` (--sanitize-early), waiting
    for its library on stdin: pass it to Later as `held`, or close() it."""
    args = ["sanitize", "--task", str(task.root), "--job-stdin", f"--sanitize-early={','.join(checks)}"]
    return WarmChild(task, prestart_python("tools.judge.judge", args, scratch_root, env=judge_env()))


class Later:
    """The checks `checks` of library `lib`, started now in a judge child (module docstring): `held`'s, where it still
    serves the task (WarmChild.serves: alive, unused, the task's files unchanged), else one started now."""

    def __init__(self, task, lib: Path, checks: tuple[str, ...] = ("racecheck",), scratch_root: Path | None = None,
                 seed: int | None = None, held: WarmChild | None = None):
        self.checks, self.lib, self.t0 = tuple(checks), Path(lib), time.monotonic()
        self.seed = secrets.randbits(31) if seed is None else seed
        self.timeout = START_S + TIMEOUT_S * len(self.checks)
        self.warm = held is not None and held.serves(task)
        if held is not None and not self.warm:
            held.close()
        self._child = held.proc if self.warm else \
            prestart_python("tools.judge.judge", ["sanitize", "--task", str(task.root), "--job-stdin"], scratch_root,
                            env=judge_env())
        job = json.dumps({"lib": str(self.lib.resolve()), "seed": self.seed, "checks": list(self.checks)})
        self._proc, self._ended = None, ""
        self._thread = threading.Thread(target=self._wait, args=(job,), daemon=True, name="sanitize-later")
        self._thread.start()

    def _wait(self, job: str) -> None:
        try:
            self._proc = self._child.run(job, self.timeout)
        except (OSError, ValueError) as e:   # close() ended the child under its pipes: results() says it did not run
            self._ended = f"{type(e).__name__}: {e}"

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def results(self) -> list[SanitizerResult]:
        """Each check's result, waited for (at most the child's budget)."""
        self._thread.join()
        proc, took = self._proc, time.monotonic() - self.t0
        data = child_json(proc.stdout) if proc is not None and proc.status == ProcStatus.ok else None
        try:
            got = [SanitizerResult.model_validate(r) for r in data["sanitizers"]]
            if [r.tool for r in got] == list(self.checks):
                return got
            why = f"it answered {[r.tool for r in got]} for {list(self.checks)}"
        except (KeyError, TypeError, ValueError) as e:
            why = (f"the judge child ended {proc.status.value}: {proc.reason()}" if proc is not None and
                   proc.status != ProcStatus.ok else f"the judge child was ended ({self._ended})" if self._ended
                   else f"the judge child answered no result ({type(e).__name__})")
            if isinstance(data, dict) and data.get("error"):
                why = f"the judge child could not run them: {data['error']}"
        return [SanitizerResult(tool=c, status="error", seconds=took, message=f"{c} after the keep did not run: {why}")
                for c in self.checks]

    def close(self) -> None:
        """Ends the child where it is (its answer no longer wanted); idempotent."""
        self._child.close()
        self._thread.join(timeout=30)

