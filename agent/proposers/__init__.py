"""Proposers: the proposer contract and the offline proposers.

Entry points:
- base: Proposer, Context, HistoryItem, ProposerError (ProposalFailed, ProposerExhausted, BudgetExhausted).
- heuristic: HeuristicProposer (the task's knobs, profile-guided); replay: ReplayProposer (an earlier run's or a
  file's proposals); retry: RetryFirst (a resumed run's undecided iteration first).

The model's proposer is agent.llm.proposer. May import: agent.records, agent.proposal and tools.
"""
