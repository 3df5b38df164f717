"""What a keep needs, started before its candidate is known (issue 66), held by the loop's Evaluator.

A candidate about to be kept waits for three start-ups that do not depend on it: its confirmation's child with
compute-sanitizer's memcheck host (5-6 s under the tool), its Nsight Compute pass's program (Python, torch, a CUDA
context under ncu: three quarters of a 5-7 s pass on an H200), and, after the keep, the child of the checks it leaves
for later with racecheck's host. Started as the keep began, the hosts' start-up ran beside the confirmation's parity
checks and slowed them (BENCHMARKS.md, issue 66 slice 6). Here each is started early and held until a keep takes it:
the confirmation's child (tools/judge/candidate.py prestart_candidate, sanitize_early) and the pass
(tools/profile/warm.py), each with the run's first candidate and again as each keep's confirmation ends
(agent/evaluation/keep.py; the later checks' child as the keep's Later takes the one held: agent/optimize/revoke.py
Pending.start), so that their start-up runs while the next candidate is proposed (a model's seconds), never beside a
confirmation's bench. The pass waits with torch imported and no CUDA context until a keep begins (prepare_pass: the
context is made beside the confirmation, and the pass runs after it): a program waiting under ncu with its context
made slowed the two-thread calls of every bench beside it threefold (issue 66 slice 9).

What is held runs no kernel until its job comes, but for the step it takes while the loop says the card is idle (idle():
the model proposes, nvcc builds): the confirmation's child then makes its values draws' search (tools/measure/warmup.py
while_idle), and stops at its next draw once told the card is busy. Made as the child started, such steps landed beside
a bench, a confirmation's re-bench or a profile pass of the loop's (issue 66 slices 8 and 12 measured such company
doubling a bench's time). A child serves only a task whose files are unchanged since it started (WarmChild.serves; else
the keep starts one as before). Where the confirmation leaves checks for after the keep (Evaluator.later: racecheck by
default), their judge child is held too, its hosts started under the tool (tools/judge/later.py prestart_later), and
the keep's Later takes it (agent/optimize/revoke.py Pending.start): racecheck after a keep then no longer waits 4-6 s
for its host to start. `tier` is the loop's profile tier: None (every other caller of Evaluator: sweep, gate,
candidates) starts nothing. AGENT_NO_PRESTART=1 starts nothing early.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.judge.candidate import WarmChild, prestart_candidate
from tools.profile.warm import WarmPass, start_pass


class Spares:
    def __init__(self) -> None:
        self.tier: int | None = None
        self.pass_: WarmPass | None = None
        self.confirming: WarmChild | None = None
        self.later: WarmChild | None = None      # the checks after a keep: their judge child, hosts started

    def _wanted(self, ev) -> bool:
        return self.tier is not None and ev.task.backend.gpu and os.environ.get("AGENT_NO_PRESTART") != "1"

    def ensure(self, ev) -> None:
        """Each held from now on (started where not held)."""
        self.ensure_pass(ev)
        self.ensure_confirmation(ev)
        self.ensure_later(ev)

    def ensure_pass(self, ev) -> None:
        """A pass held from now on, where the machine's ncu can take one (a dead one replaced)."""
        if self.pass_ is not None and not self.pass_.child.alive:
            self.drop_pass()
        if self.pass_ is None and self._wanted(ev) and ev.no_ncu is None and ev.limits is not None \
                and ev.limits.source == "device":
            self.pass_ = start_pass(ev.task, self.tier)

    def prepare_pass(self) -> None:
        """A keep has begun: the held pass makes its CUDA context now, beside the confirmation."""
        if self.pass_ is not None:
            self.pass_.prepare()

    def drop_pass(self) -> None:
        """The held pass ended (one a keep prepared and did not use: its context would stay beside the next benches)."""
        if self.pass_ is not None:
            self.pass_.close()
            self.pass_ = None

    def ensure_confirmation(self, ev) -> None:
        """A confirmation's child (its sanitizer hosts with it) held from now on (one that no longer serves the task
        replaced)."""
        if self.confirming is not None and not self.confirming.serves(ev.task):
            self.confirming.close()
            self.confirming = None
        if self.confirming is None and self._wanted(ev):
            self.confirming = prestart_candidate(ev.task, ev.scratch_root, sanitize_early=True, later=ev.later)

    def ensure_later(self, ev) -> None:
        """The judge child of the checks a keep leaves for after it (ev.later), held from now on, with their hosts."""
        if self.later is not None and not self.later.serves(ev.task):
            self.later.close()
            self.later = None
        if self.later is None and self._wanted(ev) and ev.later:
            from tools.judge.later import prestart_later
            self.later = prestart_later(ev.task, ev.later, ev.scratch_root)

    def take_later(self):
        """The held child of the checks after a keep (tools/judge/later.py Later takes it, or starts one where it no
        longer serves), or None."""
        held, self.later = self.later, None
        return held

    def idle(self, now: bool) -> None:
        """The loop's word on the card: idle from now (its model proposes, nvcc builds) or busy (a candidate's checks
        and bench, a re-bench, a keep, a profile pass). The held confirmation's child is told where that changes: idle,
        it makes its values draws' search (tools/measure/warmup.py while_idle), once; busy, it stops at its next draw.
        Told idle before its start-up has ended, it begins after it (a model's seconds cover that; a heuristic's may
        not, and its search then meets the candidate's own checks, which are not timed)."""
        held = self.confirming
        if held is not None and held.idle != now and held.proc.tell(json.dumps({"idle": now})):
            held.idle = now

    def take_confirmation(self, task) -> WarmChild | None:
        """The confirmation's child held, where it serves `task` (the caller closes it); else None."""
        held, self.confirming = self.confirming, None
        if held is not None and not held.serves(task):
            held.close()
            return None
        return held

    def profile(self, task, lib: Path, tier: int, out_dir: Path):
        """profile_task's whole-call pass of `tier` over `lib` into `out_dir`, in the pass held where it is that pass
        (the same command line: another tier's is not)."""
        from tools.profile.ncu import profile_task
        held, self.pass_ = self.pass_, None
        try:
            return profile_task(task, lib, tier=tier, out_dir=out_dir, whole_call=True, fallback=False, warm=held)
        finally:
            if held is not None:
                held.close()

    def close(self) -> None:
        """The run's end: what is held is ended."""
        for held in (self.pass_, self.confirming, self.later):
            if held is not None:
                held.close()
        self.pass_ = self.confirming = self.later = None
