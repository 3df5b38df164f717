"""Token and cost accounting per call, and the run's budget (tokens and/or USD)."""

from __future__ import annotations

from agent.proposers.base import BudgetExhausted
from agent.records.schema import Usage
from agent.llm.settings import Price

CHARS_PER_TOKEN = 4     # the estimate used before a call, where no tokenizer is at hand


def estimate_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def call_cost(prompt_tokens: int, completion_tokens: int, price: Price | None) -> float:
    if price is None:
        return 0.0
    return (prompt_tokens * price.input + completion_tokens * price.output) / 1e6


def no_price_note(model: str) -> str:
    return (f"no price for model {model!r}: cost counted as $0 (add it under [tool.agent.prices], "
            "USD per 1M tokens in/out)")


class Budget:
    """What the run has spent on the LLM, against --budget-tokens / --budget-usd."""

    def __init__(self, tokens: int | None, usd: float | None, price: Price | None, spent: Usage | None = None):
        self.tokens, self.usd, self.price = tokens, usd, price
        self.spent = spent or Usage()

    def before_call(self, prompt_estimate: int) -> None:
        """Refuse a call that would start over budget (its prompt alone would cross it)."""
        s = self.spent
        if self.tokens is not None and s.prompt_tokens + s.completion_tokens + prompt_estimate > self.tokens:
            raise BudgetExhausted(
                f"token budget: {s.prompt_tokens + s.completion_tokens} of {self.tokens} tokens spent and the next "
                f"prompt is about {prompt_estimate} tokens")
        if self.usd is not None and s.cost_usd + call_cost(prompt_estimate, 0, self.price) > self.usd:
            raise BudgetExhausted(f"cost budget: ${s.cost_usd:.4f} of ${self.usd:.2f} spent and the next prompt "
                                  f"costs about ${call_cost(prompt_estimate, 0, self.price):.4f}")

    def record(self, usage: Usage) -> None:
        self.spent = self.spent + usage

    def over(self) -> str | None:
        """Why the budget is spent after the last call, or None."""
        s = self.spent
        if self.tokens is not None and s.prompt_tokens + s.completion_tokens >= self.tokens:
            return f"token budget spent: {s.prompt_tokens + s.completion_tokens} of {self.tokens} tokens"
        if self.usd is not None and s.cost_usd >= self.usd:
            return f"cost budget spent: ${s.cost_usd:.4f} of ${self.usd:.2f}"
        return None
