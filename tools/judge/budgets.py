"""Stage budgets from measurement (issue 41): a hang costs seconds, not the task's fixed minutes.

At a run's setup the initial kernel goes through the same one-child check as every candidate (agent/optimize/best.py);
the seconds its parity and its bench took are that stage's yardstick. A candidate's stage gets FACTOR times the
initial kernel's, plus FLOOR_S, never more than the task's own timeout for it (task.toml [parity] / [bench]
timeout_s, which still bound the child as a whole). FACTOR 4 keeps an honest candidate three times slower than the
initial kernel inside: a stage's calls are at most all of its time, so they take at most 3x as long, and the
stage's fixed part (the reference, the comparisons) does not grow. FLOOR_S covers what does not scale with the kernel
on a loaded machine: a stage's clock starts at its mark, once the child has started and loaded the library, so the
child's own start is not in it. Measured over three full test runs on a busy 2-core machine (about 1,900 stages of
honest candidates, 2026-11-30), the most a stage ran past FACTOR x the initial kernel's seconds was 1.3 s; 6 s is four
times that (it was 15 s: a hung candidate cost 9 s more than it had to). The bench's rep counts follow the kernel's
cost (its budget is milliseconds of reps), so a slower kernel's bench takes about as long as the initial one's.

The child says which stage it is in by a mark on stderr (tools.isolation.capture.STAGE_MARK, tools/judge/judge.py's
mark()); StageClock reads them as they come (tools/isolation/capture.py's pump) and moves the deadline. Each stage
counts once, from its first mark: a mark the kernel prints itself cannot buy time, only end its stage early.
"""

from __future__ import annotations

import time

from tools.isolation.capture import MARK
from tools.results import StageBudget

FACTOR = 4.0
FLOOR_S = 6.0
STAGES = ("parity", "bench")


def derive(measured: dict[str, float], ceilings: dict[str, float]) -> dict[str, StageBudget]:
    """Each stage's budget from the initial kernel's seconds in it (`measured`) and the task's timeout (`ceilings`)."""
    out = {}
    for stage in STAGES:
        m, cap = measured.get(stage), ceilings.get(stage)
        if m is None or not m > 0 or cap is None:
            continue
        raw = FACTOR * m + FLOOR_S
        basis = f"{FACTOR:g} x the initial kernel's {m:.1f} s + {FLOOR_S:g} s"
        out[stage] = StageBudget(seconds=round(min(raw, cap), 1), basis=basis + (
            f", capped at the task's {cap:g} s" if raw > cap else ""))
    return out


class StageClock:
    """The deadline of the stage a child is in, from its marks (`feed`, the child's stderr as it comes)."""

    def __init__(self, budgets: dict[str, StageBudget]):
        self.budgets = budgets
        self.stage: str | None = None
        self.since: float | None = None
        self.seen: set[str] = set()
        self._rest = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()[-256:]
        for line in lines:
            if line.startswith(MARK):
                name = line[len(MARK):].strip().decode(errors="replace")
                if name not in self.seen:
                    self.seen.add(name)
                    self.stage, self.since = name, time.monotonic()

    def deadline(self) -> float | None:
        b = self.budgets.get(self.stage or "")
        return None if b is None or self.since is None else self.since + b.seconds

    def overrun(self) -> str | None:
        """Why the child was killed, where its stage's budget ran out (None otherwise)."""
        end = self.deadline()
        if end is None or time.monotonic() < end:
            return None
        b = self.budgets[self.stage]
        return (f"killed after {time.monotonic() - self.since:.1f} s in {self.stage}: the budget is {b.seconds:g} s "
                f"({b.basis})")
