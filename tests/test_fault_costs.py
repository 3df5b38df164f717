"""What a candidate's fault costs the agent (issue 41), through the real loop on the CPU matmul: a kernel that prints
4 MiB on each of its first 25 calls (100 MiB in all, the issue's flood) leaves the agent's peak memory where a run of
a harmless edit leaves it (before the output cap: 258 MB grew to 773 MB). The agent's peak is its own VmHWM
(/proc/PID/status), sampled while it runs: its children's memory is theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.runlog import read_iterations
from tests.userrepo import REPO, make_user_repo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")]

SIG = "int M, int N, int K) {\n"
FLOOD = ("#include <cstdio>\n#include <cstring>\nstatic char flood_buf[1 << 22];\nstatic int flood_calls = 0;\n"
         "static void flood() {\n    if (flood_calls++ >= 25) return;\n    memset(flood_buf, 'F', sizeof flood_buf);\n"
         "    flood_buf[sizeof flood_buf - 1] = '\\n';\n    fwrite(flood_buf, 1, sizeof flood_buf, stdout);\n"
         "    fflush(stdout);\n}\n\n")


def _run_peak(root: Path, edits: list[Edit], tmp: Path) -> tuple[int, subprocess.CompletedProcess]:
    props = tmp / f"props{len(list(tmp.glob('props*')))}.json"
    props.write_text(json.dumps([Proposal(hypothesis="a change", edits=edits, predicted=PredictedEffect(
        metric="time.median_ms", direction="down", speedup=1.1)).model_dump()]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for k in ("AGENT_BASE_URL", "AGENT_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_API_KEY"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "agent", "optimize", "kernels/matmul_cpu", "--proposer", "replay",
                             "--replay", str(props), "--iters", "1", "--quiet"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except OSError:
                return
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate(timeout=900)
    done.set()
    t.join()
    return peak[0], subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_flood_of_output_does_not_grow_the_agent(tmp_path):
    root = make_user_repo(tmp_path / "user")
    calm, res = _run_peak(root, [Edit(file="matmul.cpp", search="#include <cstddef>",
                                      replace="#include <cstddef>\n// a comment")], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    flood_edits = [Edit(file="matmul.cpp", search="#include <cstddef>\n", replace="#include <cstddef>\n" + FLOOD),
                   Edit(file="matmul.cpp", search=SIG, replace=SIG + "    flood();\n")]
    peak, res = _run_peak(root, flood_edits, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = sorted((root / "runs").iterdir())
    [rec] = read_iterations(runs[-1])
    assert rec.iteration == 1                       # judged, the run went on to its end
    assert calm > 0 and peak > 0
    assert peak <= calm + (64 << 20), f"the agent peaked at {peak >> 20} MiB against {calm >> 20} MiB for a comment"
