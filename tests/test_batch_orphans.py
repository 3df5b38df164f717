"""A kernel's double-forked daemon (its own session, its parent gone) under a sweep's batch child
(tools/judge/_batch_child.py) was adopted by init and outlived the sweep (issue 41), when the batch child was started
afresh. The batch child is a subreaper now and ends what it adopted when it ends (forked by the fork server now, which
is a subreaper too). (The host's seccomp filter stops the fork itself on a CPU host;
it is off here so that the subreaper is what is tested.)"""

from __future__ import annotations

import os
import signal
import time
import uuid

from tests.fixtures.cpu_faults.faults import compile_lib, make_task, source
from tests.fixtures.faults.faults import FAULTS, tagged
from tools.isolation.forkserver import forkserver
from tools.isolation.sandbox import python_env
from tools.judge.batch import evaluate

SIG = "                       int M, int N, int K) {\n"


def test_a_daemon_a_kernel_starts_in_a_sweep_does_not_outlive_the_batch(tmp_path, monkeypatch):
    task, honest = make_task(tmp_path, "correct", rounds=3)
    [daemon] = [f for f in FAULTS if f.name == "daemon"]
    src = source("correct")
    assert src.count(SIG) == 1
    lib = compile_lib(src.replace("#include <cstddef>\n", "#include <cstddef>\n" + daemon.prelude, 1)
                      .replace(SIG, SIG + daemon.body), tmp_path / "libdaemon.so")
    # the fork server the batch child is forked from, started before the tag is set: it is this process's, not the
    # kernel's, and must not be counted (or killed) as what the kernel left
    forkserver(python_env())
    tag = f"batch-orphans-{uuid.uuid4().hex}"      # inherited by everything the batch child starts
    monkeypatch.setenv("AGENT_FAULT_TAG", tag)
    monkeypatch.setenv("AGENT_HOST_NOFORK", "0")   # the daemon starts (tools/isolation/nofork.py would stop it first)
    rows = [r for settled in evaluate(task, [lib, honest], honest, batch=2, parity_only=True) for r in settled]
    assert sorted(i for i, _ in rows) == [0, 1]
    assert all(r.status.value == "ok" for _, r in rows), rows   # the daemon's kernel is right: only the daemon is wrong
    deadline = time.monotonic() + 10
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:     # never leave one on the machine, whatever the assertion says
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert left == [], f"the kernel's daemon outlived the sweep's batch child: {left}"
