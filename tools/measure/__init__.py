"""Measure: the instruments that judge a built kernel - is its launch legal and big enough, is its output
the reference's, how fast is it - each a typed result, each usable alone (`python -m
tools.measure.parity|bench|launch kernels/TASK --json`).

Entry points:
- launch: static_check (the plan and ptxas' resources against the device's limits), dynamic_check
  (the profiler's trace) and its command line.
- parity: run_parity (the parent side), check (in the judge: listed and hidden shapes, distributions,
  seeds, poisoned outputs; before a keep the [dims] extremes, ranges, the values past the sample, domains, and
  views off the allocator's alignment, views); compare: poison_, compare, describe; warmup: parity's own first
  kernels paid by a judge child while it waits for its job.
- bench: run_bench (the parent side), measure (in the judge: interleaved rounds, the spot check);
  stats (timing summaries, the speedup's interval), probes (the bench's cross-checks), roofline
  (the floor a time cannot beat), refcheck (when a figure against the reference is one).

The code under test never runs here in-process: the judge room (tools.judge) runs these in a child
whose host loads the library. May import: the build, the task and the floors below.
"""
