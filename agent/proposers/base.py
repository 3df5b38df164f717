"""The proposer interface. Three implementations: llm, heuristic (offline, the default) and replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from agent.records.figures import Figure
from agent.proposal import Proposal
from agent.records.schema import Usage
from tools.profile.model import ProfileReport
from tools.results import DevicePeak
from tools.task import Task


class ProposerError(Exception):
    """A way out of propose(). `usage` is what its calls cost before it gave up (a failed proposal is
    paid for too); `ends_run` says whether the run ends (no later iteration can do better) or only this
    iteration is lost."""
    ends_run: ClassVar[bool] = False

    def __init__(self, message: str, usage: Usage | None = None):
        super().__init__(message)
        self.usage: Usage = usage if usage is not None else Usage()


class ProposalFailed(ProposerError):
    """No valid proposal this iteration (reason in the message); the next iteration tries again."""


class ProposerExhausted(ProposerError):
    """The proposer has nothing left to try (the heuristic explored every configuration; replay ran out)."""
    ends_run = True


class BudgetExhausted(ProposerError):
    """Token or cost budget spent: the run ends cleanly."""
    ends_run = True


@dataclass
class HistoryItem:
    iteration: int
    hypothesis: str
    outcome: str          # runlog.Outcome value
    reason: str
    speedup: float | None = None
    knobs: dict[str, int] | None = None
    ms: float | None = None   # the candidate's main-shape median (ms), where its bench ran
    predicted: float | None = None                  # the speedup the proposal predicted
    interval: tuple[float, float] | None = None     # the measured speedup's 95% interval
    patch: str = ""                                 # its diff against its parent
    repairs: list[str] = field(default_factory=list)   # the attempts before the last, one line each
    resources: str = ""     # a GPU candidate's registers, spills, shared memory and occupancy (propose.resources)
    profile: str = ""       # a rejected GPU candidate's own profile, its few figures (propose.own_profile)


@dataclass
class Context:
    """Everything a proposer sees for one iteration."""
    task: Task
    iteration: int
    sources: dict[str, str]                 # editable file -> current text (of the best)
    profile: ProfileReport | None           # latest profile of the best
    history: list[HistoryItem] = field(default_factory=list)
    best_ms: float | None = None
    reference_ms: float | None = None
    times_from: str = ""                    # which bench best_ms and reference_ms come from (figures.standing_times)
    vs_reference: Figure | None = None      # the best's speedup over the reference, with its source (agent/records/figures.py)
    vs_initial: Figure | None = None
    peak: DevicePeak | None = None          # the device's spec-sheet peaks for the task's dtype (a GPU's bench said)
    knobs: dict[str, int | None] = field(default_factory=dict)   # current knob values in the best
    measured_knobs: list[dict[str, int]] = field(default_factory=list)  # configurations already measured (initial too)
    rewritten: dict[str, int] = field(default_factory=dict)   # editable file -> the kept iteration that rewrote it last
    noise: str = ""                         # the noise this run's benches measured (propose.noise), "" before any
    feedback: str | None = None             # repair context: why the last attempt failed (patch miss, ...)
    feedback_kind: str | None = None        # runlog.Outcome value of that failure: picks the repair prompt
    iter_dir: str | None = None             # where a proposer may save prompts / raw replies
    run_end: float = float("inf")           # time.monotonic() when the run's --budget-seconds ends (a model call's cap)


class Proposer(Protocol):
    name: str
    can_repair: bool   # False: a patch that does not apply is recorded at once, not sent back for repair

    def propose(self, ctx: Context) -> tuple[Proposal, Usage]:
        """Return a proposal and what it cost, or raise a ProposerError (ProposalFailed: this iteration
        is lost; ProposerExhausted, BudgetExhausted: the run ends)."""
        ...

    def skip_to(self, n: int) -> None:
        """On resume: the first n proposals of this run were already evaluated. A proposer that derives
        its next move from ctx.history alone has nothing to do here."""
        ...
