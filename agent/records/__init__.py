"""Records: what a run leaves on disk (runs/RUN/run.json, state.json, iterations.jsonl) and what is read back.

Entry points:
- schema: the records' models (RunConfig, RunState, IterationRecord, RepairAttempt, CandidateTried, Outcome,
  Decision, StageTimes, Usage, EnvFingerprint, now, SCHEMA_VERSION).
- store: durable writes (write_atomic, write_json_atomic, append_iteration), tolerant reads (read_config,
  read_state, read_iterations, mend_tail, find_run) and the run's lock (hold_run); LogError.
- figures: the figures a run reports and where each comes from (Figure, best_figure, estimate, figures_line,
  times_line).
- recover: records rebuilt from the run's commits (`agent resume --repair`).
- revoked: a keep revoked by a check run after it, as the records hold it (revoked_record, the state before the
  keep: save_before, state_before, restored).
- envinfo: the machine's fingerprint a run records (fingerprint, gpu_clocks).

May import: agent.proposal and tools. Nothing here runs a kernel or calls git beyond reading commits.
"""
