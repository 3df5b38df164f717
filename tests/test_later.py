"""compute-sanitizer's checks run after a keep, in a judge child of their own (tools/judge/later.py, issue 66).

On CI (no GPU, no sanitizer): the real judge child (`python -m tools.judge.judge sanitize`) under stand-in
sanitizers: a clean run answers each check's result; one that reports an error (the tool's exit code) fails; a machine
without the tool says the check was skipped, not passed; a child ended early answers an error and leaves no process;
a confirmation's job that names `later` on the CPU defers nothing (there is no sanitizer on the CPU). On the device
(`-m gpu`): the confirmation leaves racecheck out and names it, and the child after it runs it on the card."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tools.judge.later import Later
from tools.judge.sanitize import ERROR_EXIT
from tools.results import SanitizerResult

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                                reason="needs g++ and Linux")
ROOT = Path(__file__).resolve().parents[1]


def _wrapper(tmp_path: Path, delay: float = 0.0, exit_code: int | None = None) -> Path:
    """A stand-in for compute-sanitizer: takes its options, waits `delay` s, runs the host; with `exit_code`, exits
    with it after the host (as the tool does with --error-exitcode when it reported an error)."""
    exe = tmp_path / f"fake-sanitizer-{delay}-{exit_code}"
    run = '"$@"; exit ' + str(exit_code) if exit_code is not None else 'exec "$@"'
    exe.write_text("#!/bin/bash\n"
                   '[ "$1" = --help ] && { echo "  --padding arg (=0)"; exit 0; }\n'
                   f'while [ $# -gt 0 ] && [ "$1" != "{sys.executable}" ]; do shift; done\n'
                   f"echo $$ >> {tmp_path}/wrapper.pids\nsleep {delay}\n{run}\n")
    exe.chmod(0o755)
    return exe


def _gone(tmp_path: Path) -> list[int]:
    pids = [int(p) for p in (tmp_path / "wrapper.pids").read_text().split()] \
        if (tmp_path / "wrapper.pids").exists() else []
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_the_checks_after_a_keep_answer_clean_failed_skipped_and_stopped(tmp_path, monkeypatch):
    from tests.fixtures.cpu_faults.faults import make_task
    task, lib = make_task(tmp_path, "correct")
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path)))
    later = Later(task, lib, ("racecheck",), scratch)
    (r,) = later.results()
    assert later.done and r.tool == "racecheck" and r.status == "ok" and r.shapes >= 1, r
    assert "racecheck clean on" in r.message and r.seconds > 0
    both = Later(task, lib, ("memcheck", "racecheck"), scratch).results()      # together, each its own host
    assert [(x.tool, x.status) for x in both] == [("memcheck", "ok"), ("racecheck", "ok")], both
    # the tool reports an error: the check fails (the loop then revokes the keep)
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path, exit_code=ERROR_EXIT)))
    (r,) = Later(task, lib, ("racecheck",), scratch).results()
    assert r.status == "failed" and r.message.startswith("compute-sanitizer racecheck"), r
    # no tool on the machine: skipped, which is not a pass (tools/judge/sanitize.py unchecked)
    monkeypatch.setenv("AGENT_SANITIZER", str(tmp_path / "no-such-sanitizer"))
    (r,) = Later(task, lib, ("racecheck",), scratch).results()
    assert r.status == "skipped", r
    # ended before it answered (the run ends): an error for each check, and nothing left running
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path, delay=60)))
    slow = Later(task, lib, ("memcheck", "racecheck"), scratch)
    for _ in range(200):           # both stand-ins started
        if (tmp_path / "wrapper.pids").exists() and len(_gone(tmp_path)) >= 2:
            break
        time.sleep(0.1)
    assert not slow.done
    t0 = time.monotonic()
    slow.close()
    assert time.monotonic() - t0 < 30 and slow.done
    assert [(x.tool, x.status) for x in slow.results()] == [("memcheck", "error"), ("racecheck", "error")]
    assert "did not run" in slow.results()[0].message
    assert not _gone(tmp_path), "a sanitizer's host outlived the child that was ended"


def test_a_later_given_the_child_held_for_it_runs_in_the_host_started_before_the_keep(tmp_path, monkeypatch):
    """prestart_later starts the judge child and its sanitizer's host at once (the stand-in logs the host's pid as it
    starts), before any library is known; the Later given it runs the check in that host and starts none. A held child
    that no longer serves the task (its task.toml changed since it started) is ended, and a child started then runs
    the check. Nothing outlives either."""
    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.later import prestart_later
    task, lib = make_task(tmp_path, "correct")
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path)))
    pids = tmp_path / "wrapper.pids"

    def started() -> list[int]:
        return [int(p) for p in pids.read_text().split()] if pids.exists() else []
    held = prestart_later(task, ("racecheck",), scratch)
    for _ in range(300):
        if started():
            break
        time.sleep(0.1)
    assert len(started()) == 1, "the held child started no host before its job"
    later = Later(task, lib, ("racecheck",), scratch, held=held)
    (r,) = later.results()
    assert later.warm and r.tool == "racecheck" and r.status == "ok" and r.shapes >= 1, r
    assert len(started()) == 1, "a host was started after the job: the held one was not used"
    # a held child whose task changed since it started: ended, and the check run in a child started now
    stale = prestart_later(task, ("racecheck",), scratch)
    for _ in range(300):
        if len(started()) == 2:
            break
        time.sleep(0.1)
    toml = Path(task.root) / "task.toml"
    toml.write_text(toml.read_text() + "\n")
    again = Later(task, lib, ("racecheck",), scratch, held=stale)
    (r,) = again.results()
    assert not again.warm and not stale.proc.alive and r.status == "ok", r
    assert len(started()) == 3
    for _ in range(100):
        if not _gone(tmp_path):
            break
        time.sleep(0.1)
    assert not _gone(tmp_path), "a sanitizer's host outlived its child"


def test_a_library_that_does_not_load_is_an_error_for_each_check_not_a_pass(tmp_path, monkeypatch):
    from tests.fixtures.cpu_faults.faults import make_task
    task, _ = make_task(tmp_path, "correct")
    monkeypatch.setenv("AGENT_SANITIZER", str(_wrapper(tmp_path)))
    (r,) = Later(task, tmp_path / "missing.so", ("racecheck",), tmp_path / "scratch").results()
    assert r.status in ("error", "failed") and r.status != "ok", r


def test_a_confirmation_on_the_cpu_defers_nothing(tmp_path, monkeypatch):
    """`later` asks the judge to leave a sanitizer out of a GPU confirmation; a CPU task runs none, so none is named
    for after the keep."""
    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.candidate import run_candidate
    task, lib = make_task(tmp_path, "correct")
    got = run_candidate(task, lib, None, scratch_root=tmp_path / "scratch", memcheck=True, later=("racecheck",))
    assert got.parity is not None and got.parity.status.value == "ok", got.parity
    assert got.parity.later == [] and "after the keep" not in got.parity.message


def test_the_parity_a_keep_records_keeps_what_the_confirmation_left_for_later():
    """The loop's record of a candidate's parity joins its quick parity and its confirmation's (evaluate.py _joined);
    every field the confirmation answers reaches it. On the H200 the `later` list was lost there: racecheck was left
    out of the confirmation and then never run (AGENT_RACECHECK_LATER=1, before this test)."""
    from agent.evaluation.evaluate import _joined
    from tools.results import ParityResult, ParityStatus
    first = ParityResult(status=ParityStatus.ok, message="quick", seconds=1.0)
    race = SanitizerResult(tool="racecheck", status="ok", message="racecheck clean")
    mem = SanitizerResult(tool="memcheck", status="ok", message="memcheck clean")
    then = ParityResult(status=ParityStatus.ok, message="rest", seconds=2.0, memcheck=mem, racecheck=race,
                        later=["racecheck"])
    got = _joined(first, then)
    for name in ParityResult.model_fields:
        if name not in ("checks", "seconds", "message", "status"):
            assert getattr(got, name) == getattr(then, name), name


@pytest.mark.gpu
def test_on_the_card_the_confirmation_leaves_racecheck_out_and_the_child_after_it_runs_it(tmp_path):
    import torch
    if not torch.cuda.is_available() or shutil.which("compute-sanitizer") is None:
        pytest.skip("needs a GPU and compute-sanitizer")
    from tools.build.build import build
    from tools.judge.candidate import run_candidate
    from tools.task import load_task
    task = load_task(ROOT / "kernels" / "softmax")
    res = build(task, tmp_path / "build")
    assert res.status.value == "ok", res.message
    got = run_candidate(task, Path(res.lib_path), None, scratch_root=tmp_path / "scratch", memcheck=True,
                        parity_extent="rest", later=("racecheck",))
    par = got.parity
    assert par is not None and par.status.value == "ok", par
    assert par.memcheck is not None and par.memcheck.status == "ok" and par.racecheck is None, par.message
    assert par.later == ["racecheck"] and par.message.endswith("racecheck after the keep"), par.message
    (r,) = Later(task, Path(res.lib_path), tuple(par.later), tmp_path / "scratch").results()
    assert r.tool == "racecheck" and r.status == "ok" and r.shapes >= 1, r
