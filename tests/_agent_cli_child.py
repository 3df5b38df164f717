"""`python -m agent ARGS` inside a child of the tests' warm parent (tests/userrepo.py agent()): the CLI's own
__main__ run as `python -m` runs it (the working directory first on the path: tools/isolation/forkserver.py _child
puts it there), then what an interpreter does at its end that a forked child's os._exit would skip: non-daemon
threads joined and the atexit handlers run (tools/isolation/scratch.py process_dir removes its folder in one)."""

import atexit
import runpy
import threading

try:
    runpy.run_module("agent", run_name="__main__", alter_sys=True)
finally:
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
