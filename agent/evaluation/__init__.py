"""Evaluation: one candidate through the tools' instruments to a verdict, and where that runs.

Entry points:
- attempt: the candidate as typed data (Attempt) and the keep rule as one pure function (KeepRule, decide,
  doubtful, Verdict).
- evaluate: Evaluator (build, the static launch check, parity and the bench in one judge child, the confirmation,
  the re-bench, the dynamic launch check), snapshot_lib, launch_ok.
- keep: launch_and_confirm, a candidate about to be kept: its confirmation in a child (and sanitizer hosts) started
  before the keep, then its launch check in the Nsight Compute pass started before it.
- spares: Spares, what a keep needs started before its candidate is known and held by the loop's Evaluator (its
  confirmation's child and sanitizer hosts, its Nsight Compute pass's program).
- ended: how an iteration ends early (IterationEnded and its family: CompileFailed, ParityFailed, NotFaster,
  Inconclusive, ...), each with its record's outcome.
- executor: where candidates run (Local, or dask workers: make_executor, on_worker, pack_folder/unpack_folder).

May import: agent.records, agent.proposal and tools.
"""
