"""One table of endpoint errors: which are retried, and the sentence the user sees.

tenacity retries the retryable ones (agent/llm/client.py); the rest fail at once. `fatal` errors
(a wrong key, an unknown model) will fail every later call too, so the run should stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai


@dataclass(frozen=True)
class ErrorKind:
    name: str
    retryable: bool
    fatal: bool
    sentence: str


# checked in order: subclasses before their bases
TABLE: list[tuple[type[BaseException], ErrorKind]] = [
    (openai.APITimeoutError, ErrorKind("timeout", True, False,
        "the endpoint did not answer within the timeout (raise timeout_s for slow local models)")),
    (openai.APIConnectionError, ErrorKind("connection", True, False,
        "could not connect to the endpoint (is the server running and the base URL right?)")),
    (openai.RateLimitError, ErrorKind("rate_limit", True, False,
        "rate limited by the endpoint (429); retried with backoff")),
    (openai.InternalServerError, ErrorKind("server_error", True, False,
        "the endpoint had a server error (5xx)")),
    (openai.AuthenticationError, ErrorKind("authentication", False, True,
        "the endpoint refused the API key (401): check AGENT_API_KEY / OPENAI_API_KEY")),
    (openai.PermissionDeniedError, ErrorKind("permission", False, True,
        "the key has no access to this model or endpoint (403)")),
    (openai.NotFoundError, ErrorKind("not_found", False, True,
        "the endpoint does not know this model or path (404): check --model and --base-url (it usually ends in /v1)")),
    (openai.BadRequestError, ErrorKind("bad_request", False, False,
        "the endpoint rejected the request (400)")),
    (openai.UnprocessableEntityError, ErrorKind("unprocessable", False, False,
        "the endpoint could not process the request (422)")),
    (openai.ConflictError, ErrorKind("conflict", True, False, "the endpoint reported a conflict (409)")),
]
_OTHER_STATUS = ErrorKind("status", False, False, "the endpoint answered with an error")
_UNKNOWN = ErrorKind("unknown", False, False, "the call to the endpoint failed")


def classify(exc: BaseException) -> ErrorKind:
    for cls, kind in TABLE:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code >= 500:
            return ErrorKind("server_error", True, False, f"the endpoint had a server error ({exc.status_code})")
        return _OTHER_STATUS
    return _UNKNOWN


def is_retryable(exc: BaseException) -> bool:
    return classify(exc).retryable


class LLMError(Exception):
    """A call that failed for good (after retries where they apply), as one line for the user."""

    def __init__(self, kind: ErrorKind, detail: str, attempts: int = 1, status: int | None = None):
        self.kind, self.detail, self.attempts, self.status = kind, detail, attempts, status
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{kind.sentence}{tries}: {detail}" if detail else f"{kind.sentence}{tries}")

    @property
    def fatal(self) -> bool:
        return self.kind.fatal


def from_exception(exc: BaseException, attempts: int = 1) -> LLMError:
    kind = classify(exc)
    status = getattr(exc, "status_code", None)
    return LLMError(kind, _detail(exc), attempts, status)


def _detail(exc: BaseException) -> str:
    """The server's own message, one line, short."""
    msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            msg = str(inner["message"])
        elif isinstance(inner, str):
            msg = inner
    line = " ".join(str(msg).split())
    return line[:300]
