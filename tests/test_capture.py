"""A child's output costs the agent a bounded amount of memory, and a pipe a descendant keeps open costs it a bounded
wait (tools/isolation/capture.py, issue 41). Real processes: afresh (run_isolated) and from the fork server."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tools.isolation.capture import HEAD_BYTES, PIPE_GRACE_S, TAIL_BYTES, Capture
from tools.isolation.sandbox import ProcStatus, last_json, run_isolated

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


def test_a_capture_keeps_head_tail_and_the_stage_marks_it_dropped_and_counts_the_rest():
    c = Capture()
    line = b"y" * 99 + b"\n"
    total = 0
    for i in range(60_000):                       # 6 MB of lines, three marks far from either end
        chunk = (b"@@agent-stage " + [b"parity", b"memcheck", b"bench"][i // 20_000] + b"\n") if i % 20_000 == 7_000 else line
        c.add(chunk)
        total += len(chunk)
    c.add(b"the end\n")
    total += 8
    text = c.text()
    assert c.dropped > 3_000_000 and len(text) < HEAD_BYTES + 2 * TAIL_BYTES + 400
    assert len(c.head) + len(c.tail) + c.dropped == total
    marks = [ln for ln in text.splitlines() if ln.startswith("@@agent-stage ")]
    assert marks == ["@@agent-stage parity", "@@agent-stage memcheck", "@@agent-stage bench"]
    assert f"[agent: {c.dropped} bytes of this output dropped here]" in text and text.endswith("the end\n")
    small = Capture()
    small.add(b"all of it\n")
    assert small.text() == "all of it\n" and small.dropped == 0


def test_a_flood_of_output_is_capped_and_the_result_line_survives():
    """30 MiB on stderr and 30 MiB on stdout before the result line: the agent keeps about 2 MiB of each."""
    code = ("import sys, json\nb = b'z' * 1023 + b'\\n'\nfor _ in range(30 * 1024):\n"
            "    sys.stdout.buffer.write(b); sys.stderr.buffer.write(b)\n"
            "sys.stdout.buffer.flush()\nprint(json.dumps({'ok': True, 'n': 7}), flush=True)\n")
    r = run_isolated([sys.executable, "-c", code], 300)
    assert r.status == ProcStatus.ok, r.reason()
    assert len(r.stdout) <= HEAD_BYTES + 2 * TAIL_BYTES + 200 and len(r.stderr) <= HEAD_BYTES + 2 * TAIL_BYTES + 200
    assert last_json(r.stdout) == {"ok": True, "n": 7}
    assert r.dropped_bytes > 2 * (30 << 20) - 2 * (HEAD_BYTES + 2 * TAIL_BYTES) - 100
    assert f"({r.dropped_bytes} bytes of its output dropped)" in r.reason()


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def test_a_daemon_holding_the_pipes_does_not_hold_the_caller_after_its_parent_exits():
    """The leader exits at once; its double-forked grandchild (a session of its own: no kill finds it) keeps stdout
    and stderr open for ten minutes. The caller returns the leader's outcome within the grace, not at the timeout."""
    code = ("import os, sys, time, json\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        print(json.dumps({'daemon': os.getpid()}), flush=True)\n        time.sleep(600)\n    os._exit(0)\n"
            "os.wait()\ntime.sleep(0.5)\n")
    t0 = time.monotonic()
    r = run_isolated([sys.executable, "-c", code], 300)
    took = time.monotonic() - t0
    daemon = (last_json(r.stdout) or {}).get("daemon")
    try:
        assert r.status == ProcStatus.ok, r.reason()
        assert daemon is not None, r.stdout
        assert took < 300 / 2, f"{took:.1f} s: the caller waited on the daemon's pipes (grace {PIPE_GRACE_S} s)"
    finally:
        if daemon:
            _kill(int(daemon))


def test_the_fork_servers_children_keep_the_same_promises(tmp_path):
    from tools.isolation.forkserver import forkserver
    from tools.isolation.sandbox import _finish, python_env
    server = forkserver(python_env())
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": server.env["PYTHONPATH"], "PYTHONUNBUFFERED": "1"}
    proc = server.spawn("tests.fixtures.forkprobe", ["flood", "24"], str(tmp_path), env, False)
    r = _finish(proc, ["forkprobe", "flood"], time.monotonic(), 300, None)
    assert r.status == ProcStatus.ok, r.reason()
    assert last_json(r.stdout) == {"result": "done"} and len(r.stderr) <= HEAD_BYTES + 2 * TAIL_BYTES + 400
    assert "@@agent-stage bench" in r.stderr.splitlines() and r.dropped_bytes > (24 << 20) - 3 * TAIL_BYTES
    t0 = time.monotonic()
    proc = server.spawn("tests.fixtures.forkprobe", ["daemon"], str(tmp_path), env, False)
    r = _finish(proc, ["forkprobe", "daemon"], time.monotonic(), 300, None)
    took = time.monotonic() - t0
    daemon = next((d["daemon"] for d in map(json.loads, r.stdout.splitlines()) if "daemon" in d), None)
    try:
        assert r.status == ProcStatus.ok and daemon is not None, (r.reason(), r.stdout)
        assert took < 300 / 2, f"{took:.1f} s: the caller waited on the daemon's pipes"
        # adopted by the server (a subreaper), not by init, and ended when the child it escaped from ended
        deadline = time.monotonic() + 10
        while _running(int(daemon)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(int(daemon)), "the double-forked daemon outlived its child"
    finally:
        if daemon:
            _kill(int(daemon))


def test_a_stage_budget_runs_from_its_own_mark_and_only_an_overrun_is_killed():
    """tools.judge.budgets.StageClock through the pump: each stage's deadline from its mark, a later mark replacing an
    earlier stage's (the .ci/run at 1b81497 killed a bench at the parity's deadline)."""
    from tools.isolation.sandbox import _finish, _spawn
    from tools.judge.budgets import StageClock
    from tools.results import StageBudget
    budgets = {"parity": StageBudget(seconds=1.0, basis="test"), "bench": StageBudget(seconds=1.0, basis="test")}

    def child(parity_s: float, bench_s: float):
        code = (f"import sys, time\nsys.stderr.write('\\n@@agent-stage parity\\n'); sys.stderr.flush(); time.sleep({parity_s})\n"
                f"sys.stderr.write('\\n@@agent-stage bench\\n'); sys.stderr.flush(); time.sleep({bench_s})\nprint('done')\n")
        argv = [sys.executable, "-c", code]
        clock = StageClock(budgets)
        return _finish(_spawn(argv, None, None, False), argv, time.monotonic(), 60, None, clock), clock

    r, _ = child(0.6, 0.6)          # 1.2 s in all, each stage inside its own 1 s
    assert r.status == ProcStatus.ok and r.stdout == "done\n", r.reason()
    r, clock = child(0.1, 30)       # the bench overruns its budget: killed about 1 s after its mark, not at 60 s
    assert r.status == ProcStatus.timeout and r.seconds < 30, r.reason()
    assert clock.stage == "bench" and "in bench: the budget is 1 s (test)" in (clock.overrun() or "")
