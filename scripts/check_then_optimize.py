"""Seconds of `agent optimize --iters 1` right after `agent check`, on an imported KernelBench CPU solution whose
editable kernel.cpp includes torch's headers (tests/data/kernelbench/ew_problem.py + ew_cpu_unroll.py, as
test_kernelbench imports it): what linking check's object of the same bytes saves a run's first build
(tools/build/reuse.py). BENCHMARKS.md, "The test suite", issue 61.

    python scripts/check_then_optimize.py REPO_CHECKOUT WORK_DIR

REPO_CHECKOUT is the tree to measure (this one, or `git archive <rev> | tar -x -C DIR` of another): its agent runs.
Keep AGENT_CACHE the same across the two trees so that both use one precompiled header, and alternate them.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tests.test_kernelbench import DATA, _repo  # noqa: E402
from tests.userrepo import agent, git  # noqa: E402

work = Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
root = _repo(work)


def timed(*args: str, timeout: float = 900):
    t0 = time.time()
    res = agent(root, *args, timeout=timeout)
    print(f"{time.time() - t0:7.1f}s rc={res.returncode} {' '.join(args[:2])}", flush=True)
    return res


timed("import", "kernelbench", str(DATA / "ew_problem.py"), "--solution", str(DATA / "ew_cpu_unroll.py"),
      "--name", "ew", "--knob", "UNROLL=1,2,4,8", timeout=300)
timed("check", "kernels/ew", timeout=600)
git(root, "add", "-A")
git(root, "commit", "-qm", "the imported task")
timed("optimize", "kernels/ew", "--iters", "1", "--run-id", "kb", "--target", "100x", "--quiet")
first = json.loads((root / "runs" / "kb" / "iterations.jsonl").read_text().splitlines()[0])
print("iteration 1's build s:", first["times"]["build"])
