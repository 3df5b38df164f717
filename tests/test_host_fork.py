"""The host forked from the judge (tools/judge/hostfork.py fork_host): it starts without importing torch
again, and keeps none of the judge's descriptors, its private answer channel above all."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.fixtures.cpu_faults.faults import make_task
from tools.judge.hostclient import HostClient

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                                reason="needs g++ and Linux")


def test_the_forked_host_holds_only_its_pipes_and_stderr(tmp_path):
    """In a process of its own, as a judge is: fork_host forks only from a process with one thread, and a pytest
    worker may hold others by then (dask's, after an in-process sweep: the host was started afresh and this test
    failed when the slow tests came first)."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"from tests.test_host_fork import _forked_host; _forked_host({str(tmp_path)!r})"
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


def _forked_host(tmp: str) -> None:
    from pathlib import Path
    tmp_path = Path(tmp)
    import torch  # noqa: F401  (the judge has it imported before it makes its host)
    task, lib = make_task(tmp_path, "correct")
    secret_r, secret_w = os.pipe()        # stands in for the judge's private answer channel
    root = tmp_path / "judge"
    root.mkdir()
    host = HostClient(task.root, root)
    try:
        host.ask({"op": "load", "id": "candidate", "path": str(lib)})
        pid = host.info["pid"]
        # forked, not started afresh: the same program and arguments as this process
        with open(f"/proc/{pid}/cmdline", "rb") as f, open("/proc/self/cmdline", "rb") as me:
            assert f.read() == me.read()
        assert pid == host.proc.pid and host.info["threads"] == 1
        theirs = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        ours = lambda fd: os.readlink(f"/proc/self/fd/{fd}")            # noqa: E731
        allowed = {ours(host.proc.stdin.fileno()), ours(host.proc.stdout.fileno()), ours(2)}
        assert ours(secret_w) not in theirs.values() and ours(secret_r) not in theirs.values()
        # the request pipe, the answer pipe (twice: fd 1 and the private copy) and stderr; a library it
        # loaded is mapped, not held open
        assert set(theirs.values()) <= allowed | {"/dev/null"}, theirs
        assert {0, 1, 2} <= set(theirs)
        # it lives in its own scratch directory, fenced there like the host started afresh
        assert os.readlink(f"/proc/{pid}/cwd") == str(host.scratch.dir)
    finally:
        host.close()
        os.close(secret_r)
        os.close(secret_w)
    assert host.proc.returncode is not None       # reaped: no zombie left behind
    print("ok")


def _descendants_named(needle: bytes) -> list[int]:
    """This process's live descendants (tools.isolation.proctree) whose command line holds `needle`."""
    from tools.isolation.proctree import tree_of
    found = []
    for pid in tree_of(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_a_batch_child_forks_its_host_too(tmp_path):
    """The sweep's batch child (tools/judge/_batch_child.py) makes its host as the judge does, forked from itself, not
    a second Python that imports torch again: its watchdog thread, started before the host, made every batch start
    its host afresh (1.3-1.6 s of CPU a batch; a whole test run started about 40). Watched from outside: no process
    running `-m tools.judge.host` under this one while the batch runs, and both libraries judged."""
    import threading
    import time

    from tests.test_sweep import planted_task
    from tools.build.build import build
    from tools.judge import batch
    from tools.results import BatchStatus
    from tools.task import load_task
    task = load_task(planted_task(tmp_path))
    libs = []
    for n in range(2):
        b = build(task, tmp_path / f"b{n}")
        assert b.status.value == "ok", b.message
        libs.append(b.lib_path)
    fresh: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            fresh.update(_descendants_named(b"tools.judge.host"))
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        rounds = list(batch.evaluate(task, libs, libs[0], batch=2, limit_s=120))
    finally:
        done.set()
        t.join()
    settled = dict(r for rnd in rounds for r in rnd)
    assert sorted(settled) == [0, 1] and all(r.status == BatchStatus.ok for r in settled.values()), settled
    assert fresh == set(), f"a host started afresh under the batch child: {sorted(fresh)}"
