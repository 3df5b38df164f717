"""Isolation: how every child that runs generated code is started, fenced, bounded and cleaned up, so
that a candidate cannot take the agent down, leave a process behind or write outside its scratch.

Entry points:
- sandbox.run_isolated, run_python_json, prestart_python / Prestarted: a child in its own session,
  with a timeout, dying with the agent; ProcResult says how it ended.
- forkserver.forkserver: the warm parent (torch imported once) the judges are forked from; started afresh, or
  forked from this process where it is warm already (forkserver.warm_here); forked.ForkedChild, a child of it.
- birth.become_child, die_with_parent, exit_with: a forked or started child's first steps.
- confine.fence_scratch: the Landlock fence a process that loads candidate code puts on itself.
- scratch.Scratch: a scratch directory per candidate process, and what it left there.
- checkout.CheckoutWatch: the user's checkout's file modes, compared around each candidate child.
- proctree.kill_tree: a child's whole process tree, found and killed from /proc.

The lowest room: it imports only tools.results (the result models), never the task, the build or
the instruments above it (tests/test_architecture.py).
"""
