"""What a candidate's fault costs the agent (issue 41), through the real loop on the CPU matmul: a kernel that prints
4 MiB on each of its first 25 calls (100 MiB in all, the issue's flood) leaves the agent's peak memory where a run of
a harmless edit leaves it (before the output cap: 258 MB grew to 773 MB). The agent's peak is its own VmHWM
(/proc/PID/status), sampled while it runs: its children's memory is theirs. A kernel that hangs is killed at the
parity budget measured at setup (tools/judge/budgets.py), not at the task's 180 s; an honest kernel three times
slower than the initial one is not killed by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.proposal import Edit, PredictedEffect, Proposal
from agent.records.store import read_iterations
from tests.userrepo import REPO, make_user_repo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")]

SIG = "int M, int N, int K) {\n"
# the agent's own peak (VmHWM) through a run of every fault: a run of a comment's edit peaks at 43-44 MiB
AGENT_PEAK_BOUND = 128 << 20
FLOOD = ("#include <cstdio>\n#include <cstring>\nstatic char flood_buf[1 << 22];\nstatic int flood_calls = 0;\n"
         "static void flood() {\n    if (flood_calls++ >= 25) return;\n    memset(flood_buf, 'F', sizeof flood_buf);\n"
         "    flood_buf[sizeof flood_buf - 1] = '\\n';\n    fwrite(flood_buf, 1, sizeof flood_buf, stdout);\n"
         "    fflush(stdout);\n}\n\n")


def _agent_peak(root: Path, proposals: list[Proposal], tmp: Path, extra_env: dict | None = None,
                after=None) -> tuple[int, subprocess.CompletedProcess]:
    """`agent optimize kernels/matmul_cpu` replaying `proposals`, one iteration each, with the agent's own peak memory
    (VmHWM, sampled while it runs); `after()`, if given, runs once the agent has exited, whatever happened."""
    props = tmp / f"props{len(list(tmp.glob('props*')))}.json"
    props.write_text(json.dumps([p.model_dump() for p in proposals]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           **(extra_env or {})}
    for k in ("AGENT_BASE_URL", "AGENT_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_API_KEY"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "agent", "optimize", "kernels/matmul_cpu", "--proposer", "replay",
                             "--replay", str(props), "--iters", str(len(proposals)), "--target", "100x", "--quiet",
                             # a fault the host's filter neutralizes (its fork refused) is the parent's kernel: at the
                             # default 2% a loaded 2-core machine's noise kept one (pipe_holder 1.044x, .ci/run at
                             # bb2ad04); what this measures is what a fault costs and leaves, not the keep's noise
                             "--min-gain", "0.5"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = [0], threading.Event()

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
    try:
        out, err = proc.communicate(timeout=1500)
    finally:
        done.set()
        t.join()
        if after is not None:
            after()
    return peak[0], subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run_peak(root: Path, edits: list[Edit], tmp: Path) -> tuple[int, subprocess.CompletedProcess]:
    return _agent_peak(root, [Proposal(hypothesis="a change", edits=edits, predicted=PredictedEffect(
        metric="time.median_ms", direction="down", speedup=1.1))], tmp)


def test_a_flood_of_output_does_not_grow_the_agent(tmp_path):
    root = make_user_repo(tmp_path / "user", scan_allow=True)
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
    # what was left out is counted in the record: up to 100 MiB printed, at most 64 KiB + 1 MiB kept a stream
    assert rec.output_dropped_bytes > 50 << 20, rec.output_dropped_bytes
    assert calm > 0 and peak > 0
    assert peak <= calm + (64 << 20), f"the agent peaked at {peak >> 20} MiB against {calm >> 20} MiB for a comment"


def _slower(times: int) -> str:
    """The task's own kernel with its work done `times` times over (honest: the same answer, slower)."""
    text = (REPO / "kernels" / "matmul_cpu" / "matmul.cpp").read_text().replace('extern "C" void matmul(', "static void matmul_once(")
    return text + ('\nextern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {\n'
                   f"    for (int r = 0; r < {times}; ++r) {{\n        matmul_once(A, B, C, M, N, K);\n"
                   '        asm volatile("" ::: "memory");   // no pass is dead code\n    }\n}\n')


def test_a_hang_costs_its_stage_budget_and_a_slower_honest_kernel_is_not_killed(tmp_path):
    from agent.records.schema import Outcome
    from agent.records.store import read_state
    root = make_user_repo(tmp_path / "user", scan_allow=True)
    hang = [Edit(file="matmul.cpp", search=SIG, replace=SIG + "    volatile int spin = 1;\n    while (spin) {}\n")]
    _, res = _run_peak(root, hang, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    run = sorted((root / "runs").iterdir())[-1]
    budget = read_state(run).stage_budgets["parity"]
    [rec] = read_iterations(run)
    assert rec.outcome == Outcome.parity_failed and "the budget is" in rec.reason, rec.reason
    assert budget.seconds < 180 and "the initial kernel's" in budget.basis
    assert rec.times.parity <= 3 * budget.seconds, (rec.times.parity, budget)
    _, res = _run_peak(root, [Edit(file="matmul.cpp", content=_slower(3))], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    run = sorted((root / "runs").iterdir())[-1]
    [rec] = read_iterations(run)
    assert rec.outcome == Outcome.not_faster and "budget" not in rec.reason, (rec.outcome, rec.reason)


def test_every_fault_of_the_issue_costs_seconds_and_leaves_nothing(tmp_path):
    """tests/fixtures/faults/faults.py's kernels, one iteration each, in ONE run: each survived, the run went on to the
    next, the stage seconds within 3x of the budget measured at setup, nothing left running after the run, the agent's
    own peak memory under AGENT_PEAK_BOUND, the user's checkout unchanged."""
    import signal
    import uuid

    from agent.records.schema import Decision
    from agent.records.store import read_state
    from tests.fixtures.faults.faults import FAULTS, tagged
    from tests.userrepo import snapshot
    root = make_user_repo(tmp_path / "user", scan_allow=True)
    before = snapshot(root)
    proposals = [Proposal(hypothesis=f"[{f.name}] {f.what}", predicted=PredictedEffect(
        metric="time.median_ms", direction="down", speedup=1.2), edits=[
        Edit(file="matmul.cpp", search="#include <cstddef>\n", replace="#include <cstddef>\n" + f.prelude),
        Edit(file="matmul.cpp", search=SIG, replace=SIG + f.body)]) for f in FAULTS]
    tag = f"faults-{uuid.uuid4().hex}"       # in the agent's environment: every process of the run inherits it
    found: dict = {}

    def leftovers() -> None:
        import time
        settle = time.monotonic() + 10       # the agent has exited: its fork server's death signal is on its way
        while (left := tagged(tag)) and time.monotonic() < settle:
            time.sleep(0.1)
        found["left"] = left
        found["seen"] = {}
        for pid in left:         # what each is (for the message), then never leave it on the machine
            try:
                found["seen"][pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200],
                                      Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:4])
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    peak, res = _agent_peak(root, proposals, tmp_path, {"AGENT_FAULT_TAG": tag}, after=leftovers)
    left, seen = found["left"], found["seen"]
    assert res.returncode == 0, res.stderr[-3000:]
    run = sorted((root / "runs").iterdir())[-1]
    budgets = read_state(run).stage_budgets
    recs = read_iterations(run)
    table = "\n".join(f"{f.name:12s} {r.outcome.value:15s} parity {r.times.parity:6.1f} s bench {r.times.bench:6.1f} s "
                      f"{r.reason[:120]}" for f, r in zip(FAULTS, recs))
    print(f"\n{table}\nbudgets {budgets}\nagent peak {peak >> 20} MiB; left running: {left}")
    assert [r.iteration for r in recs] == list(range(1, len(FAULTS) + 1)), table
    assert all(r.decision != Decision.kept for r in recs), table
    for f, r in zip(FAULTS, recs):
        assert r.times.parity <= 3 * budgets["parity"].seconds and r.times.bench <= 3 * budgets["bench"].seconds, \
            (f.name, r.times, budgets)
    assert left == [], f"processes the faults started are still running: {seen}\n{table}"
    assert 0 < peak <= AGENT_PEAK_BOUND, f"the agent peaked at {peak >> 20} MiB\n{table}"
    assert snapshot(root) == before
