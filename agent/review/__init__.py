"""Review: runs read after the fact.

- runs: a run's folder, config, state and records read back (and mended where torn); table: `agent runs`.
- show: one run or one iteration in detail (`agent show`); transcript: a run's model conversation as markdown.
- report: the markdown report with its plots (plot: the speedup per iteration; roofline: the kernels against the
  device's roofs); cherrypick: kept commits onto the user's branch (`agent cherry-pick`); gate: the CI gate.

Everything here reads the records the loop wrote (agent/records/) and never writes into them, except `report`,
which adds report.md and its figures beside them. May import: agent.evaluation, agent.records and tools.
"""
