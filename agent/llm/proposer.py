"""The LLM proposer: one hypothesis per iteration from any OpenAI-compatible endpoint.

propose(ctx) builds the system prompt (AGENT.md + the Proposal schema) and the iteration prompt
(sources, profile, history, knobs, times), asks for a structured proposal, and sends the exact
problem back when the reply is not a valid Proposal (bounded). When the loop comes back with
ctx.feedback (a patch miss, a compile error, a parity mismatch, a launch violation), the matching
repair prompt continues the conversation of that iteration. Every prompt and raw reply is saved
under ctx.iter_dir as prompt-K.json / response-K.json; the key never is.

Its exceptions are the proposer contract's (agent/proposers/base.py): each carries `usage`, what the
call(s) of this propose() cost, so the loop accounts for a failed proposal too; `self.spent` is the
run's running total.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agent.llm.client import ChatReply, LLMClient
from agent.llm.context import ContextTooLarge, compact_profile, format_sources, iteration_prompt
from agent.llm.costs import Budget, estimate_tokens
from agent.llm.errors import LLMError
from agent.llm.machine import machine_facts
from agent.llm.structured import ReplyInvalid, parse_proposal, proposal_schema
from agent.llm.prompts import agent_rules, render
from agent.proposal import Proposal
from agent.proposers.base import BudgetExhausted, Context, ProposalFailed, ProposerError
from agent.records.schema import Usage
from agent.llm.settings import LLMSettings
from tools.profile.model import ProfileReport
from tools.task import Task

log = logging.getLogger("agent.llm")

# runlog.Outcome value of the failed attempt -> repair template
REPAIR_TEMPLATES = {
    "patch_did_not_apply": "repair_patch",
    "edit_outside_editable": "repair_patch",
    "no_change": "repair_patch",
    "compile_failed": "repair_compile",
    "parity_failed": "repair_parity",
    "launch_rejected": "repair_launch",
}


class LLMUnusable(ProposalFailed):
    """No later call can succeed either (wrong key, unknown model, sources over the context budget):
    the loop should end the run rather than try the next iteration."""
    ends_run = True


@dataclass
class _Conversation:
    iteration: int
    messages: list[dict[str, str]]
    sources: dict[str, str]


class LLMProposer:
    name = "llm"
    can_repair = True
    at_once = True     # may be asked several times at once (threads): each request is built from its ctx alone
    _stop_next: str | None = None

    def __init__(self, settings: LLMSettings, task: Task, *, spent: Usage | None = None,
                 profile_view: Callable[[ProfileReport | None], str] | None = None,
                 client: LLMClient | None = None):
        self.settings, self.task = settings, task
        self.client = client or LLMClient(settings)
        self.budget = Budget(settings.budget_tokens, settings.budget_usd, settings.price(), spent)
        self.profile_view = profile_view or compact_profile
        self.schema = proposal_schema()
        # the schema travels once a request: as its response format, or where the endpoint takes none appended to the
        # system message by the client (agent/llm/client.py with_schema)
        device = "gpu" if task.backend.gpu else "cpu"
        self.system = render("system", agent_rules=agent_rules(device), role=device.upper())
        self.machine = machine_facts(task)   # once a run: the machine, the toolchain, the tolerance, the harness
        # the last exchange of each candidate (its iteration folder): a repair continues its own conversation, also
        # when an iteration's K requests were made at once (agent/optimize/candidates.py)
        self._last: dict[str | None, _Conversation] = {}

    @property
    def spent(self) -> Usage:
        return self.budget.spent

    def skip_to(self, n: int) -> None:
        """Nothing to skip: each prompt is built from ctx (sources, profile, history) afresh."""

    def propose(self, ctx: Context) -> tuple[Proposal, Usage]:
        usage = Usage()
        if why := (self._stop_next or self.budget.over()):
            raise BudgetExhausted(why)
        try:
            messages = self._opening(ctx)
            replies = 0
            while True:
                reply = self._call_through(messages, ctx)
                replies += 1
                usage = usage + reply.usage
                messages = messages + [{"role": "assistant", "content": reply.text}]
                if reply.finish_reason == "length":   # cut off: parsed, half a reply only earns a schema complaint
                    problem = ("your reply was cut off at the token limit (finish_reason=length) before it ended. Send "
                               "the whole proposal again, shorter: fewer and smaller edits, each `search` only as long "
                               "as it must be to be unique, no text outside the JSON object")
                else:
                    try:
                        # a valid proposal already paid for is evaluated; the budget stops the next call
                        proposal = parse_proposal(reply.text)
                        break
                    except ReplyInvalid as e:
                        problem = str(e)
                if why := self.budget.over():
                    raise BudgetExhausted(why)
                if replies > self.settings.schema_repairs:
                    raise ProposalFailed(f"no valid proposal after {replies} replies: {_first_line(problem)}")
                messages.append({"role": "user", "content": render("repair_schema", problem=problem)})
            if self.budget.over():
                self._stop_next = self.budget.over()
            proposal.proposer = f"llm:{self.settings.model}"
            self._last[ctx.iter_dir] = _Conversation(ctx.iteration, messages, dict(ctx.sources))
            return proposal, usage
        except LLMError as e:
            raise (LLMUnusable if e.fatal else ProposalFailed)(f"LLM: {e}", usage) from None
        except ContextTooLarge as e:
            raise LLMUnusable(str(e), usage) from None
        except ProposerError as e:
            e.usage = usage
            raise

    # --- the conversation ------------------------------------------------------------------
    def _opening(self, ctx: Context) -> list[dict[str, str]]:
        if ctx.feedback:
            template = REPAIR_TEMPLATES.get(ctx.feedback_kind or "", "repair_patch")
            last = self._last.get(ctx.iter_dir)
            if last is not None and last.iteration == ctx.iteration:
                note = ("" if ctx.sources == last.sources else
                        "The files now read:\n\n" + format_sources(ctx.sources))
                return last.messages + [{"role": "user", "content": render(
                    template, feedback=ctx.feedback.strip(), sources_note=note)}]
            # no earlier exchange to continue (e.g. a resumed run): a fresh prompt plus the failure
            first = self._fresh(ctx)
            repair = render(template, feedback=ctx.feedback.strip(), sources_note="(They are shown above.)")
            first[-1]["content"] += "\n\n## The previous attempt\n\n" + repair
            return first
        return self._fresh(ctx)

    def _fresh(self, ctx: Context) -> list[dict[str, str]]:
        # the schema is part of every prompt, in the response format or in the system message
        left = self.settings.context_tokens - estimate_tokens(self.system) - estimate_tokens(json.dumps(self.schema))
        # a CPU task has no counters here yet: said as such, not as a GPU profiler's absence (issue 63); its measured
        # roofline (tools/measure/cpu_peak.py) is in "Where it stands"
        profile = self.profile_view(ctx.profile) if self.task.backend.gpu else \
            "(no hardware counters: this tool does not read a CPU's yet. The best's share of this machine's measured " \
            "FMA and memory peaks is under \"Where it stands\"; reason from it, the times, the machine's facts and the " \
            "build's command lines above)"
        user = iteration_prompt(ctx, profile, left, self.machine)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def _call_through(self, messages: list[dict[str, str]], ctx: Context) -> ChatReply:
        """A call; one the endpoint fails after all its retries (down, overloaded, timing out, past the call's deadline)
        is made again after backoff_max_s, so that an outage does not spend the iteration, until endpoint_outages calls
        in a row have failed: then the run ends (LLMUnusable). A failure that is the request's (400, 401, ...) or one
        cut by the run's own deadline stands at once."""
        s = self.settings
        for outage in range(1, s.endpoint_outages + 1):
            try:
                return self._call(messages, ctx)
            except LLMError as e:
                if not (e.kind.retryable or e.kind.name == "deadline") or e.fatal \
                        or time.monotonic() + s.backoff_max_s >= ctx.run_end:
                    raise
                if outage == s.endpoint_outages:
                    raise LLMUnusable(f"LLM: the endpoint failed {outage} calls in a row, each after its retries "
                                      f"(endpoint_outages): the last: {e}") from None
                log.warning("LLM endpoint failed a call after its retries (%s); the same call again in %.0f s "
                            "(%d of %d)", e, s.backoff_max_s, outage, s.endpoint_outages)
                time.sleep(s.backoff_max_s)
        raise AssertionError("unreachable")

    def _call(self, messages: list[dict[str, str]], ctx: Context) -> ChatReply:
        self.budget.before_call(estimate_tokens(json.dumps(messages)))
        k = _next_index(ctx.iter_dir)
        if ctx.iter_dir:
            _save(ctx.iter_dir, f"prompt-{k}.json", {
                "model": self.settings.model, "base_url": self.settings.base_url,
                "structured": "json_schema" if self.client.schema_supported is not False else "text",
                "messages": messages})
        try:
            reply = self.client.chat(messages, schema=self.schema, end=ctx.run_end)
        except LLMError as e:
            if ctx.iter_dir:
                _save(ctx.iter_dir, f"response-{k}.json", {"error": str(e), "kind": e.kind.name,
                                                            "status": e.status, "attempts": e.attempts})
            raise
        self.budget.record(reply.usage)
        if ctx.iter_dir:
            _save(ctx.iter_dir, f"response-{k}.json", {
                "mode": reply.mode, "schema_in": "response_format" if reply.mode == "json_schema" else "system message",
                "finish_reason": reply.finish_reason, "usage": reply.usage.model_dump(),
                "notes": reply.notes, "body": _as_json(reply.raw)})
        return reply


def _first_line(text: str) -> str:
    return " ".join(text.split())[:400]


def _next_index(iter_dir: str | None) -> int:
    if not iter_dir or not Path(iter_dir).is_dir():
        return 1
    taken = [int(m.group(1)) for p in Path(iter_dir).glob("prompt-*.json")
             if (m := re.fullmatch(r"prompt-(\d+)\.json", p.name))]
    return max(taken, default=0) + 1


def _save(iter_dir: str, name: str, data: dict) -> None:
    d = Path(iter_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(data, indent=1))


def _as_json(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw
