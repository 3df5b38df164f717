"""tools.isolation.sandbox: a child that times out or finishes takes everything it started with it. Real processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tools.isolation.sandbox import ProcStatus, run_isolated

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")

SLEEPER = "import sys, time; time.sleep(600)"


def _alive(tag: str) -> list[str]:
    """Live processes whose command line carries tag (the test's own marker argument)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if tag.encode() in cmd:
            out.append(d)
    return out


def _sleeper(tag: str, pre: str = "") -> str:
    """A shell word that starts a python sleeping 10 minutes with `tag` in its argv, after `pre`."""
    return f"{sys.executable} -c '{pre}{SLEEPER}' {tag}"


@pytest.mark.parametrize("how", ["own_group", "own_session_parent_alive", "plain_background"])
def test_a_timeout_kills_every_descendant(how):
    """ninja puts each compiler in a process group of its own; a kernel may start helpers that leave the
    group or the session. Whichever way, past the timeout nothing the child started is alive."""
    tag = f"sandbox-{how}-{os.getpid()}"
    start = {"own_group": _sleeper(tag, "import os; os.setpgid(0, 0); "),
             "own_session_parent_alive": _sleeper(tag, "import os; os.setsid(); "),
             "plain_background": _sleeper(tag)}[how]
    t0 = time.monotonic()
    r = run_isolated(["sh", "-c", f"{start} & sleep 600"], 1.5)
    assert r.status == ProcStatus.timeout
    assert time.monotonic() - t0 < 10, "the kill and the wait for it are bounded"
    assert _alive(tag) == []


def test_a_finished_child_leaves_nothing_running():
    """The child exits at once; what it started in the background (output detached, so the caller is not
    held) ends with it."""
    tag = f"sandbox-finished-{os.getpid()}"
    r = run_isolated(["sh", "-c", f"{_sleeper(tag, 'import os; os.setpgid(0, 0); ')} >/dev/null 2>&1 & echo done"], 30)
    assert r.status == ProcStatus.ok and r.stdout == "done\n"
    assert _alive(tag) == []


def test_a_grandchild_holding_the_pipes_cannot_hold_the_caller_past_the_timeout():
    """A descendant that escapes the kill (new session, its parent already gone) keeps stdout open; the
    caller still returns, within the timeout plus the bounded drain."""
    tag = f"sandbox-pipes-{os.getpid()}"
    escape = f"{sys.executable} -c 'import os, time; os.fork() == 0 and (os.setsid(), time.sleep(600))' {tag}"
    t0 = time.monotonic()
    r = run_isolated(["sh", "-c", f"{escape}; sleep 600"], 1.5)
    try:
        assert r.status == ProcStatus.timeout and time.monotonic() - t0 < 20
    finally:
        for pid in _alive(tag):   # the escaped one is Trust 1's (the supervisor); do not leave it here
            os.kill(int(pid), 9)


@pytest.mark.parametrize("prestarted", [False, True])
def test_a_child_writes_only_into_its_scratch_directory_which_is_listed_and_removed(tmp_path, monkeypatch, prestarted):
    """A child that writes ./debug.log, ~/.cache/... and a temporary file (what a kernel logging its
    shapes would do) writes them in its own scratch directory under the given root, not in the agent's
    working directory (the user's checkout); what it wrote is listed with sizes, then removed."""
    import json

    from tools.isolation import scratch
    from tools.isolation.sandbox import prestart_python, run_python_json
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    root = tmp_path / "run" / "scratch"
    scratch.drain()
    if prestarted:
        child = prestart_python("tests.fixtures.scratch_writer", ["--job-stdin"], root)
        res = child.run("{}", 60)
        data = json.loads(res.stdout.strip().splitlines()[-1])
    else:
        res, data = run_python_json("tests.fixtures.scratch_writer", [], 60, root)
    assert res.status == ProcStatus.ok, res.stderr
    where = Path(data["cwd"])
    assert where.parent == root.resolve() and Path(data["home"]) == where and Path(data["tmp"]) == where / "tmp"
    assert list(checkout.iterdir()) == []                  # nothing in the agent's working directory
    assert not where.exists() and list(root.iterdir()) == []   # removed with the process
    listed = {f.path: f.bytes for f in scratch.drain()}
    assert listed.pop("debug.log") == len("relative\n") and listed.pop(".cache/kernel/entry.bin") == 100
    [(tmpname, size)] = listed.items()
    assert tmpname.startswith("tmp/") and tmpname.endswith(".tmp") and size == 5
    assert scratch.drain() == []


def test_the_fence_lets_a_process_write_only_in_its_scratch_directory(tmp_path):
    """tools.isolation.confine.fence_scratch (Landlock): after it, creating or writing a file outside the scratch
    directory fails with EACCES, inside it works, and so does everything the process starts."""
    import json
    import subprocess

    from tools.isolation.confine import landlock_abi
    if landlock_abi() == 0:
        pytest.skip("no Landlock on this kernel")
    inside, outside = tmp_path / "scratch", tmp_path / "checkout"
    inside.mkdir()
    outside.mkdir()
    (outside / "tracked.txt").write_text("user's work\n")
    code = f"""
import json, os, subprocess, sys
from tools.isolation.confine import fence_scratch
assert fence_scratch({str(inside)!r})
got = {{}}
for name, path in (("inside", {str(inside / 'a.log')!r}), ("outside", {str(outside / 'b.log')!r}),
                   ("overwrite", {str(outside / 'tracked.txt')!r})):
    try:
        open(path, "w").write("x")
        got[name] = "written"
    except PermissionError:
        got[name] = "refused"
child = subprocess.run(["sh", "-c", "echo y > {outside / 'c.log'}"], capture_output=True)
got["child"] = "refused" if child.returncode else "written"
print(json.dumps(got))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"inside": "written", "outside": "refused", "overwrite": "refused", "child": "refused"}, got
    assert sorted(x.name for x in outside.iterdir()) == ["tracked.txt"]
    assert (outside / "tracked.txt").read_text() == "user's work\n" and (inside / "a.log").read_text() == "x"
