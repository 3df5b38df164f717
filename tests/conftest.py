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
