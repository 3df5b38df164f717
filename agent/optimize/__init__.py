"""Optimize: `agent optimize` and `agent resume`, the loop that proposes, commits, evaluates and keeps or reverts.

Entry points:
- session: start_run, resume_run, make_proposer, choose_task (a run's branch, worktree and records made or reopened).
- loop: Loop, one iteration at a time (propose -> patch -> commit -> evaluate -> keep or revert -> record).
- candidates: K proposals an iteration, evaluated side by side (--candidates, --workers).
- propose: the proposer's context (history, standing, noise, a rejected candidate's resources and profile) and
  applying its edits; patch: search/replace edits and their misses; repair: a failed candidate sent back.
- best: the run's best version, its library, launch, profile and figures; gitops: the run's branch, worktree and
  refs; view: what a user sees as it runs; signals: Ctrl-C during a keep; revoke: a keep undone when a check run
  after it refuses the kernel.

May import every room below it: agent.records, agent.evaluation, agent.proposers, agent.llm, agent.sweep,
agent.review, agent.proposal and tools.
"""
