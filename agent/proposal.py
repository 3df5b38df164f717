"""The proposal: what every proposer (llm, heuristic, replay) hands the loop.

One hypothesis per iteration, the metrics it rests on, a prediction that can be checked, and the
edits as search/replace blocks (or a whole-file rewrite) on the task's editable files only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="what the hypothesis rests on, named as the prompt names it: a profile metric, a "
                                    "measured time, a compiler or machine fact")
    value: str = Field(description="its value, as the prompt gives it")


class PredictedEffect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="the metric the change should move")
    direction: Literal["up", "down"]
    speedup: float = Field(gt=0, description="predicted speedup over the current best, e.g. 1.3")


class Edit(BaseModel):
    """A search/replace block on one editable file; search=None with `content` rewrites the file."""
    model_config = ConfigDict(extra="forbid")
    file: str = Field(description="path relative to the task folder; must be an editable file")
    search: str | None = Field(default=None, description="exact text to find (once) in the file")
    replace: str | None = Field(default=None, description="text to put in its place")
    content: str | None = Field(default=None, description="whole new file content (instead of search/replace)")

    @model_validator(mode="after")
    def _one_form(self) -> "Edit":
        whole = self.content is not None
        block = self.search is not None and self.replace is not None
        if whole == block:
            raise ValueError("an edit is either search+replace or content (a whole-file rewrite), not both or neither")
        if block and not self.search:
            raise ValueError("search must not be empty")
        return self


class Proposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hypothesis: str = Field(min_length=1, description="one hypothesis: what limits the kernel and what the change does about it")
    evidence: list[Evidence] = Field(default_factory=list)
    predicted: PredictedEffect
    edits: list[Edit] = Field(min_length=1)
    knobs: dict[str, int] | None = Field(default=None, description="knob configuration after the edit (heuristic proposer)")
    proposer: str = Field(default="", description="filled by the loop: llm:MODEL, heuristic, replay:RUN")

    def summary(self) -> str:
        return self.hypothesis.strip().splitlines()[0][:120]
