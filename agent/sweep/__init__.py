"""Sweep: the knob space measured, `agent sweep` and `agent check --knobs`.

Entry points:
- run: sweep() in three phases (build every configuration, parity and the bench in batches, the best verified).
- build: write_knobs, build_configurations (a task copy per configuration, built `jobs` at a time; Built).
- batches: Chunk, Shipped, evaluate_chunk (what one dask worker runs), evaluate_built, screen_built.
- points: SweepPoint, SweepResult (the sweep.json record), save_result, describe.
- knobcheck: check_knobs, configurations (`agent check --knobs each|all`).

May import: agent.evaluation, agent.records and tools.
"""
