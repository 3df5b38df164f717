"""The chat call: the `openai` client against any OpenAI-compatible endpoint, with tenacity retries.

Chat Completions for the widest compatibility. The client's own retries are off (max_retries=0):
tenacity is the single policy (exponential backoff with jitter, retryable errors only, see
agent/llm/errors.py). Structured output asks for the Proposal's JSON schema; a server that rejects
`response_format` is asked again in plain text, and remembered, so later calls go straight to text.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai

try:   # the HTTP client openai is built on: httpx2 from openai 3 on, httpx before
    import httpx2 as httpx
except ImportError:   # pragma: no cover (the older openai)
    import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential
from tenacity.stop import stop_base

from agent.llm.costs import call_cost, estimate_tokens, no_price_note
from agent.llm.errors import ErrorKind, LLMError, from_exception, is_retryable
from agent.records.schema import Usage
from agent.llm.settings import LLMSettings

log = logging.getLogger("agent.llm")
BAD_REPLY = ErrorKind("bad_reply", False, False, "the endpoint's reply is not a chat completion")
DEADLINE = ErrorKind("deadline", False, False, "the endpoint gave no whole reply within the call's deadline "
                     "(deadline_s; a server that sends a byte now and then never trips timeout_s)")


class _Deadline(httpx.HTTPTransport):
    """httpx's timeouts bound each read, not a reply: a server that sends one byte every 2 s held a run 420 s
    (issue 42). Every call is held to `end` (monotonic seconds, set per call) whole, head and body: the socket each
    request connects (httpcore's trace extension hands it over; no connection is kept alive, so every request
    connects) is shut down by a timer at `end`, which ends a read blocked on it, and a read past `end` raises a
    timeout. A new connection per call costs a handshake, against a call of seconds."""

    end: float = float("inf")

    def __init__(self) -> None:
        super().__init__(limits=httpx.Limits(max_keepalive_connections=0))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        import socket
        import threading
        end, socks, traced = self.end, [], request.extensions.get("trace")

        def trace(name: str, info: dict) -> None:
            if name.endswith(("connect_tcp.complete", "start_tls.complete")) and info.get("return_value") is not None:
                sock = info["return_value"].get_extra_info("socket")
                if sock is not None:
                    socks.append(sock)
            if traced is not None:
                traced(name, info)

        def cut() -> None:
            for sock in socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(max(0.0, end - time.monotonic()), cut)
        timer.daemon = True
        timer.start()
        request.extensions = {**request.extensions, "trace": trace}
        try:
            resp = super().handle_request(request)
        except Exception:
            timer.cancel()
            if time.monotonic() >= end:
                raise httpx.ReadTimeout("past the call's deadline", request=request) from None
            raise
        inner = resp.stream

        class Bounded(httpx.SyncByteStream):
            def __iter__(self):
                try:
                    for chunk in inner:
                        if time.monotonic() > end:
                            raise httpx.ReadTimeout("past the call's deadline", request=request)
                        yield chunk
                except httpx.TransportError:
                    if time.monotonic() >= end:
                        raise httpx.ReadTimeout("past the call's deadline", request=request) from None
                    raise

            def close(self) -> None:
                timer.cancel()
                inner.close()

        if time.monotonic() > end:
            timer.cancel()
            inner.close()
            raise httpx.ReadTimeout("past the call's deadline", request=request)
        resp.stream = Bounded()
        return resp


def retry_after(exc: BaseException | None) -> float | None:
    """The seconds a refusal asks to wait (`retry-after-ms`, or `Retry-After` in seconds or as an HTTP date), or
    None where it says nothing."""
    resp = getattr(exc, "response", None)
    headers = getattr(resp, "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            return max(0.0, float(headers["retry-after-ms"]) / 1e3)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            from datetime import datetime, timezone
            from email.utils import parsedate_to_datetime
            return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


class _Past(stop_base):
    """tenacity's stop at a moment on time.monotonic()'s clock: the call's deadline."""

    def __init__(self, end: float):
        self.end = end

    def __call__(self, retry_state) -> bool:
        return time.monotonic() >= self.end


class _Wait:
    """tenacity's wait: the server's Retry-After where it sends one (capped at retry_after_max_s; a 429 that asked for
    20 s was retried 0.6 s later), else exponential backoff with jitter; never past the call's deadline."""

    def __init__(self, s: LLMSettings, end: float):
        self.backoff = wait_random_exponential(multiplier=s.backoff_base_s, max=s.backoff_max_s)
        self.cap, self.end = s.retry_after_max_s, end

    def __call__(self, state) -> float:
        asked = retry_after(state.outcome.exception() if state.outcome is not None else None)
        wait = min(asked, self.cap) if asked is not None else self.backoff(state)
        return max(0.0, min(wait, self.end - time.monotonic()))


@dataclass
class ChatReply:
    text: str
    usage: Usage
    mode: str                          # json_schema | text
    request: dict[str, Any]            # what was sent (never the key)
    raw: str                           # the response body as received
    finish_reason: str | None = None
    notes: list[str] = field(default_factory=list)


def with_schema(messages: list[dict[str, str]], schema: dict[str, Any] | None) -> list[dict[str, str]]:
    """The messages for an endpoint that takes no response_format: the schema at the end of the system message. The
    schema travels once per request: in the response format where the endpoint takes one, else here."""
    if schema is None:
        return messages
    text = ("\n\n## The proposal's JSON schema\n\n```json\n" + json.dumps(schema, indent=1) + "\n```\n")
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": messages[0]["content"].rstrip() + text}] + messages[1:]
    return [{"role": "system", "content": text.strip()}] + messages


class LLMClient:
    def __init__(self, settings: LLMSettings):
        self.settings = settings
        self._transport = _Deadline()
        self._client = openai.OpenAI(api_key=settings.key(), base_url=settings.base_url, timeout=settings.timeout_s,
                                     max_retries=0, http_client=openai.DefaultHttpxClient(transport=self._transport))
        # None: not known yet; False: the server rejected json_schema once, use text from now on
        self.schema_supported: bool | None = None if settings.structured == "auto" else (
            settings.structured == "json_schema")

    def chat(self, messages: list[dict[str, str]], schema: dict[str, Any] | None = None,
             schema_name: str = "proposal", end: float = float("inf")) -> ChatReply:
        """One completion (retried on retryable errors). Raises LLMError with one line for the user. `end`: the
        run's own deadline (time.monotonic()), above the call's: the call ends by whichever comes first."""
        self._run_end = end
        notes: list[str] = []
        if schema is not None and self.schema_supported is not False:
            fmt = {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema, "strict": True}}
            try:
                reply = self._call(messages, fmt)
                self.schema_supported = True
                return reply
            except LLMError as e:
                # only a server not yet known to take the schema may be rejecting it
                if e.status not in (400, 422) or self.schema_supported is not None:
                    raise
                notes.append(f"the server rejected response_format json_schema ({e.detail}); asked again for "
                             "JSON in plain text")
            reply = self._call(with_schema(messages, schema), None)   # a second 400: the schema was not the problem
            self.schema_supported = False
            log.info("%s: no json_schema support; using JSON in plain text from now on", self.settings.describe())
            reply.notes[:0] = notes
            return reply
        return self._call(with_schema(messages, schema), None)

    def _call(self, messages: list[dict[str, str]], fmt: dict[str, Any] | None) -> ChatReply:
        s = self.settings
        params: dict[str, Any] = {"model": s.model, "messages": messages}
        if fmt is not None:
            params["response_format"] = fmt
        if s.temperature is not None:
            params["temperature"] = s.temperature
        if s.max_tokens is not None:
            params["max_tokens"] = s.max_tokens
        # above tenacity's retries: the call's own deadline, and above it the run's (--budget-seconds)
        run_end = getattr(self, "_run_end", float("inf"))
        end = min(time.monotonic() + s.deadline_s, run_end)
        self._transport.end = end
        spent = (f"{s.deadline_s:.0f} s spent" if end < run_end else
                 "the run's time budget (--budget-seconds) ran out during the call")
        # the deadline as a moment, not a delay from tenacity's own start (a few ms later on a loaded machine: an
        # attempt the deadline ended was then followed by a wait of 0 s and an attempt that could not start)
        retrying = Retrying(stop=stop_after_attempt(s.max_attempts) | _Past(end),
                            wait=_Wait(s, end),
                            retry=retry_if_exception(is_retryable), reraise=True,
                            before_sleep=lambda st: log.warning(
                                "LLM call failed (%s), retry %d of %d", from_exception(st.outcome.exception()),
                                st.attempt_number, s.max_attempts - 1))
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    left = end - time.monotonic()
                    if left <= 0:
                        raise LLMError(DEADLINE, spent, attempts)
                    raw = self._client.chat.completions.with_raw_response.create(
                        **params, timeout=min(s.timeout_s, left))
        except openai.OpenAIError as e:
            if time.monotonic() >= end:
                raise LLMError(DEADLINE, f"{spent}, {attempts} attempt{'s' * (attempts != 1)}; "
                                         f"the last: {from_exception(e)}", attempts) from None
            raise from_exception(e, attempts) from None
        body = raw.text
        try:
            completion = raw.parse()
            choice = completion.choices[0]
        except (ValueError, IndexError, AttributeError, TypeError, openai.OpenAIError):
            raise LLMError(BAD_REPLY, " ".join(body[:200].split())) from None
        text = choice.message.content or ""
        notes = []
        if choice.finish_reason == "length":
            notes.append("the reply was cut off at the token limit (finish_reason=length)")
        usage = _usage(completion, messages, text, s, notes)
        return ChatReply(text=text, usage=usage, mode="json_schema" if fmt else "text",
                         request=params, raw=body, finish_reason=choice.finish_reason, notes=notes)


def _usage(completion: Any, messages: list[dict[str, str]], text: str, s: LLMSettings, notes: list[str]) -> Usage:
    u = getattr(completion, "usage", None)
    if u is not None and u.prompt_tokens is not None:
        p, c = int(u.prompt_tokens), int(u.completion_tokens or 0)
    else:
        p = estimate_tokens(json.dumps(messages))
        c = estimate_tokens(text)
        notes.append("the server reported no token usage; counted an estimate (4 characters a token)")
    price = s.price()
    if price is None:
        notes.append(no_price_note(s.model))
    return Usage(calls=1, prompt_tokens=p, completion_tokens=c, cost_usd=call_cost(p, c, price))
