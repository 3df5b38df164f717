"""LLM configuration: command line over environment over pyproject.toml [tool.agent] over defaults.

The API key is read from the environment only (AGENT_API_KEY, then OPENAI_API_KEY); it is never
read from pyproject.toml (which is committed) and never serialized (runs/ and git never see it).
No model and no base URL configured anywhere means no LLM: the loop uses the offline proposer.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator


class SettingsError(Exception):
    """The LLM configuration cannot be used; the message names the source and the fix."""


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: float = Field(ge=0, description="USD per 1M prompt tokens")
    output: float = Field(ge=0, description="USD per 1M completion tokens")


class LLMSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    base_url: str | None = None                       # None: the openai client's default (api.openai.com)
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)
    timeout_s: float = Field(default=120.0, gt=0)    # per HTTP request: to connect, and between two reads
    deadline_s: float = Field(default=600.0, gt=0)   # one call in all: every attempt, wait and byte of its reply
    max_attempts: int = Field(default=5, ge=1)       # tries per call, retryable errors only
    backoff_base_s: float = Field(default=1.0, ge=0) # exponential backoff with jitter: base * 2^n ...
    backoff_max_s: float = Field(default=30.0, ge=0) # ... capped here
    retry_after_max_s: float = Field(default=120.0, ge=0)   # a server's Retry-After is waited, up to this
    endpoint_outages: int = Field(default=3, ge=1)   # calls in a row that fail after their retries: the run ends
    schema_repairs: int = Field(default=2, ge=0)     # follow-ups for a reply that is not a valid Proposal
    structured: Literal["auto", "json_schema", "text"] = "auto"
    temperature: float | None = None                  # None: the server's default (reasoning models want that)
    max_tokens: int | None = Field(default=None, gt=0)
    context_tokens: int = Field(default=100_000, gt=0)   # prompt budget (estimated at 4 characters a token)
    prices: dict[str, Price] = {}                     # model -> USD per 1M tokens in/out
    budget_tokens: int | None = Field(default=None, gt=0)
    budget_usd: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _budget_needs_price(self) -> "LLMSettings":
        if self.budget_usd is not None and self.price() is None:
            raise ValueError(f"budget_usd is set but model {self.model!r} has no price: add it under "
                             "[tool.agent.prices] (USD per 1M tokens in/out) or use --budget-tokens")
        return self

    def price(self) -> Price | None:
        return self.prices.get(self.model)

    def key(self) -> str:
        """The key for the client; local servers (vLLM, Ollama, llama.cpp) accept any non-empty one."""
        return self.api_key.get_secret_value() if self.api_key else "not-needed"

    def describe(self) -> str:
        return f"{self.model} at {self.base_url or 'https://api.openai.com/v1'}"


# keys of [tool.agent] that belong to the LLM settings (the table also holds the loop's own keys)
_FILE_KEYS = {n for n in LLMSettings.model_fields if n != "api_key"}
_ENV = {"model": ["AGENT_MODEL"], "base_url": ["AGENT_BASE_URL", "OPENAI_BASE_URL"],
        "api_key": ["AGENT_API_KEY", "OPENAI_API_KEY"]}


def load_llm_settings(cli_overrides: Mapping[str, Any] | None, repo_root: Path,
                      environ: Mapping[str, str] | None = None) -> LLMSettings | None:
    """The LLM settings, or None when no model or base URL is configured (offline proposer)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    pyproject = Path(repo_root) / "pyproject.toml"
    values.update(_from_file(pyproject))
    for field, names in _ENV.items():
        for name in names:
            if env.get(name):
                values[field] = env[name]
                break
    values.update({k: v for k, v in (cli_overrides or {}).items() if v is not None})

    if not values.get("model") and not values.get("base_url"):
        return None
    if not values.get("model"):
        raise SettingsError(f"an LLM endpoint is configured ({values['base_url']}) but no model: pass "
                            "--model, set AGENT_MODEL or `model` in [tool.agent] of pyproject.toml")
    if not values.get("base_url") and not values.get("api_key"):
        raise SettingsError(f"model {values['model']!r} is configured but there is no API key for OpenAI: "
                            "set AGENT_API_KEY (or OPENAI_API_KEY), or pass --base-url for a local server")
    try:
        return LLMSettings.model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise SettingsError(f"LLM settings: {where + ': ' if where else ''}{msg}") from None


def _from_file(pyproject: Path) -> dict[str, Any]:
    if not pyproject.exists():
        return {}
    try:
        table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("agent", {})
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{pyproject}: not valid TOML: {e}") from None
    if "api_key" in table:
        raise SettingsError(f"{pyproject}: [tool.agent] holds api_key; never commit a key: remove it and set "
                            "AGENT_API_KEY in the environment")
    return {k: v for k, v in table.items() if k in _FILE_KEYS}
