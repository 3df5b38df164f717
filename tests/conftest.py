import atexit
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

# The tests' precompiled headers (tools/pch.py, about 0.76 GB each) go to a folder of the test run's
# own, not into the home of whoever runs them; one folder for the whole run, so they are made once.
if not os.environ.get("AGENT_CACHE"):
    os.environ["AGENT_CACHE"] = tempfile.mkdtemp(prefix="agent-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AGENT_CACHE"], ignore_errors=True)
