import atexit
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

# The tests' precompiled headers (tools/backends/pch.py, about 0.76 GB each) go to a folder of the test run's
# own, not into the home of whoever runs them; one folder for the whole run, so they are made once.
# Under pytest-xdist the controller loads this file before it starts its workers, which inherit its
# environment: every worker shares the controller's folder (tools/backends/pch.py makes a header once, under a
# lock), and the controller removes it when the run ends.
if not os.environ.get("AGENT_CACHE"):
    os.environ["AGENT_CACHE"] = tempfile.mkdtemp(prefix="agent-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AGENT_CACHE"], ignore_errors=True)


# Our modules byte-compiled once, here, for the hundreds of processes the run starts (agent commands, fork servers,
# fresh hosts): where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), an editable install has no
# .pyc, and each of those processes compiled agent/ and tools/ from source again (31 s of the full suite's CPU,
# py-spy, 2026-11-29). Python reads a .pyc where one is, whatever that variable says, and checks it against the
# source's mtime and size, so an edit is never shadowed. Under pytest-xdist the controller does it before its workers
# start; __pycache__/ is ignored by git.
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    import compileall
    for _pkg in ("agent", "tools"):
        compileall.compile_dir(str(pathlib.Path(__file__).resolve().parent.parent / _pkg), quiet=2)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def torch_pch():
    """The CPU extensions' precompiled torch/extension.h, made once for the run (35-45 s on 2 cores)
    before the tests that compile a binding: a binding takes it only where it is cached (tools/backends/pch.py),
    13 s instead of 24 each. The folder holding it, or None where no gcc or no torch headers."""
    from tools.build.build import cxx_flags_of
    from tools.backends.pch import ensure, pch_flags
    from tools.task import load_task
    from tools.backends.toolchain import find_cxx, find_nvcc
    cxx = find_cxx()
    if cxx is None:
        return None
    task = load_task(pathlib.Path(__file__).resolve().parent.parent / "kernels" / "matmul_ext_cpu")
    try:
        return ensure(cxx, pch_flags(cxx_flags_of(task, task.root, find_nvcc()), task.root), 900).include_dir
    except (OSError, ImportError, ValueError):
        return None


@pytest.hookimpl(trylast=True)          # after -m's deselection: the slices are of what runs
def pytest_collection_modifyitems(config, items):
    """The slow tests first in each worker's share. pytest-xdist's worksteal hands worker i the i-th contiguous slice of
    this list (len // workers left, in turn) and an idle worker steals from the end of another's queue: with the slow
    tests where the file order puts them (test_kernelbench's 30-90 s each sit in the middle), a run could end with one
    worker on a long test and the other idle. Here each slice starts with its share of the slow tests and ends with
    fast ones, so what is left to steal at the end is short. Within the slow and within the fast the file order stays;
    without slow tests (the fast tier) nothing moves."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    slow = [it for it in items if it.get_closest_marker("slow") is not None]
    fast = [it for it in items if it.get_closest_marker("slow") is None]
    if workers == 1 or not slow or not fast:
        return
    out, left = [], len(items)
    for i in range(workers):
        size = left // (workers - i)                    # worksteal's own split (xdist/scheduler/worksteal.py)
        left -= size
        mine = slow[len(slow) * i // workers:len(slow) * (i + 1) // workers]
        take = max(0, size - len(mine))
        out += mine + fast[:take]
        fast = fast[take:]
    items[:] = out + fast


@pytest.fixture(autouse=True)
def own_object_cache(request, tmp_path_factory, monkeypatch):
    """Each test its own object cache (tools/build/objcache.py): whether a build compiles or links an object is what
    many tests assert, and must not depend on which test ran before it on the same worker. A test marked
    `shared_objects` takes the run's one cache instead (under AGENT_CACHE, beside the precompiled headers), for the
    builds several tests make of the same bytes (a KernelBench problem's binding)."""
    if request.node.get_closest_marker("shared_objects") is None:
        monkeypatch.setenv("AGENT_OBJECT_CACHE", str(tmp_path_factory.mktemp("objects")))
