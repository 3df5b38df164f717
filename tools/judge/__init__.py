"""Judge: where a candidate is checked without its code being able to reach the verdict. The judge
process loads the task module (the reference) but never the library; its host - fenced to a scratch
directory, the only process that loads candidate code - runs the calls on buffers the judge sends,
and the judge compares, times from outside and decides.

Entry points:
- candidate: run_candidate, prestart_candidate, WarmChild - the parent side: one judge child per
  candidate check (launch plan, parity, bench), pre-started in the loop.
- judge: `python -m tools.judge.judge evaluate|parity|bench ...` - the child.
- host and hostclient: the kernel's host and the judge's side of it (start, ask, tensors there and
  back, the outside clock; HostRuns for the bench); iofiles: the buffers' files between them (in memory where
  /dev/shm can hold them).
- batch (with _batch_child): parity and bench of many libraries, a batch per throwaway child (the sweep,
  `agent check --knobs`).
- what a kernel leaves behind, read in the host: fpstate (the floating-point control state), threads (threads still on
  a CPU after its calls), devstate (a GPU context's device-wide settings); sanitize: compute-sanitizer's checks.
- _plan_child: the launch check's child (the plan, the profiler's trace); runner: the private stdout
  the processes that load candidate code share.

The top room of tools/: may import every room below (tools.measure, tools.profile, tools.build, ...).
"""
