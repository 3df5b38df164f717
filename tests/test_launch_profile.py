"""One Nsight Compute pass for a candidate about to be kept (issue 66): every launch of one call, inside an NVTX range,
is both the launch check's geometry (tools/measure/launch.py from_profile) and the profile the keep records
(agent/evaluation/evaluate.py verify_launch/take_profile). Through real subprocesses: an executable `ncu` first on PATH
that writes a report the device captured (tests/fixtures/ncu/attn_t1.ncu-rep: attention_fwd_kernel, grid 2048, block
128, 102 registers, 41728 B of dynamic shared memory) where ncu would, and the real report reader. Both directions: a
plan the report agrees with passes, one it contradicts is rejected; a pass that cannot serve falls back to the trace."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

from agent.evaluation.evaluate import Evaluator
from agent.evaluation.ended import LaunchRejected
from agent.records.schema import StageTimes
from tools.backends.device import table_limits
from tools.measure.launch import from_profile
from tools.profile import profile_task
from tools.profile.ncu import NVTX_RANGE
from tools.results import Launch, LaunchResult, LaunchStatus
from tools.task import load_task

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "tests" / "fixtures" / "ncu" / "attn_t1.ncu-rep"
KERNEL = "attention_fwd_kernel"


PERM = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on "
        "the target device 0.")


def fake_ncu(tmp_path: Path, writes: bool | str = True, sees: Path | None = None) -> Path:
    """`ncu` on PATH: logs its argv; `writes`: copies the device's report to the -o stem, as ncu would; False: says it
    profiled nothing; "perm": refuses as ncu does where the counters are not permitted; "deaf": a target waiting for its
    library (no --lib) never gets it, the pass profiles nothing 2 s on, a cold one writes the report. `sees`: a profiling run waits
    up to 10 s for that file to be written, and logs "sees it" where it was during the run."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "ncu"
    body = (f'echo "{PERM}" >&2; exit 1' if writes == "perm" else f'cp {REPORT} "$stem.ncu-rep"' if writes else
            "echo '==WARNING== No kernels were profiled.'")
    if writes == "deaf":      # an ncu that does not hand its stdin to the target: a waiting target never gets its job
        body = (f'case " $* " in *" --lib "*) cp {REPORT} "$stem.ncu-rep";; '
                "*) sleep 2; echo '==WARNING== No kernels were profiled.';; esac")
    if sees is not None:
        body = (f'for i in $(seq 100); do [ -s {sees} ] && break; sleep 0.1; done; [ -s {sees} ] && '
                f'echo "sees it" >> {tmp_path}/argv.log\n{body}')
    # a target with no --lib waits for its library on stdin (tools/profile/warm.py): ncu's stdin is its
    # (lines before it, {"prepare": true}, logged too: tools/profile/target.py)
    job = ('' if writes == "deaf" else
           f'case " $* " in *" --lib "*) ;; *) while read -r job; do echo "job $job" >> {tmp_path}/argv.log; '
           'case "$job" in *\'"lib"\'*) break;; esac; done;; esac\n')
    exe.write_text("#!/bin/bash\n"
                   f'echo "$@" >> {tmp_path}/argv.log\n'
                   'if [ "$1" = --version ]; then echo "Version 2025.3.1.0 (build 1) (public-release)"; exit 0; fi\n'
                   'stem=""; prev=""; for a in "$@"; do [ "$prev" = -o ] && stem="$a"; prev="$a"; done\n'
                   + job + f"{body}\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return d


@pytest.fixture()
def on_path(monkeypatch, tmp_path):
    def put(writes: bool | str = True, sees: Path | None = None) -> None:
        monkeypatch.delenv("NCU", raising=False)
        monkeypatch.setenv("PATH", f"{fake_ncu(tmp_path, writes, sees)}{os.pathsep}{os.environ['PATH']}")
    return put


def plan(grid=(2048, 1, 1), smem=41728) -> LaunchResult:
    return LaunchResult(status=LaunchStatus.ok, own_kernels=[KERNEL],
                        launches=[Launch(kernel=KERNEL, grid=grid, block=(128, 1, 1), smem_dynamic_bytes=smem,
                                         smem_static_bytes=0, source="plan")])


def h200():
    return table_limits("sm_90").model_copy(update={"source": "device"})


def test_the_whole_call_is_profiled_inside_its_nvtx_range_and_its_launches_judged(on_path, tmp_path):
    on_path()
    task = load_task(ROOT / "kernels" / "attention_fwd")
    rep = profile_task(task, tmp_path / "lib.so", out_dir=tmp_path / "p", whole_call=True, fallback=False)
    argv = (tmp_path / "argv.log").read_text().splitlines()[-1].split()
    assert argv[argv.index("--nvtx-include") + 1] == f"{NVTX_RANGE}/" and "--nvtx" in argv
    assert "-k" not in argv and "--launch-skip" not in argv          # every launch of the call, whatever its name
    target = argv[argv.index("tools.profile.target"):]               # the target opens the range around its call
    assert target[target.index("--nvtx") + 1] == NVTX_RANGE
    assert [k.name for k in rep.kernels] == [KERNEL]
    ok = from_profile(task, rep, h200(), plan())
    assert ok.status == LaunchStatus.ok and ok.mode == "dynamic", ok.message
    assert [(ln.grid, ln.block, ln.registers, ln.smem_dynamic_bytes, ln.source) for ln in ok.launches] == \
        [((2048, 1, 1), (128, 1, 1), 102, 41728, "ncu")]
    # a plan the driver's launch contradicts (grid, or shared memory) is rejected, as the trace's check rejects it
    for lie in (plan(grid=(1024, 1, 1)), plan(smem=16384)):
        bad = from_profile(task, rep, h200(), lie)
        assert bad.status == LaunchStatus.rejected and [v.rule for v in bad.violations] == ["plan_mismatch"]
        assert "grid (2048, 1, 1)" in bad.violations[0].message


def traced(check) -> None:
    """A launch the pass could not check goes to the torch trace: on a machine with no GPU it says there is none; on a
    card (the device) it runs, and the stand-in library does not load, so the launch is refused, not passed."""
    from tools.backends.device import cuda_present
    if cuda_present():
        with pytest.raises(LaunchRejected, match="could not trace the launch"):
            check()
        return
    res = check()
    assert res.status == LaunchStatus.not_applicable and "no CUDA GPU" in res.message


def test_the_pass_serves_the_keep_once_and_a_pass_that_cannot_serve_leaves_the_trace_to_check(on_path, tmp_path):
    task = load_task(ROOT / "kernels" / "attention_fwd")
    lib = tmp_path / "iter-1" / "libattention_fwd.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not loaded: ncu is a stand-in")
    ev = Evaluator(task, tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    on_path()
    times = StageTimes()
    res = ev.verify_launch(lib, plan(), times, profile=(lib.parent, 1))
    assert res.status == LaunchStatus.ok and "Nsight Compute pass" in res.message and times.launch > 0
    assert len(list(lib.parent.glob("profile-t1-s*.ncu-rep"))) == 1    # in the iteration's folder, as a profile's is
    rep = ev.take_profile(lib)
    assert rep is not None and [k.name for k in rep.kernels] == [KERNEL]
    assert ev.take_profile(lib) is None                          # once: the next keep takes its own
    with pytest.raises(LaunchRejected, match="launch_plan must describe the real launch"):
        ev.verify_launch(lib, plan(grid=(4096, 1, 1)), times, profile=(lib.parent, 1))
    assert ev.take_profile(tmp_path / "other.so") is None        # a report of another library is not this one's
    # no kernels profiled: the torch trace checks the launch instead (traced())
    shutil.rmtree(tmp_path / "bin")
    on_path(writes=False)
    traced(lambda: ev.verify_launch(lib, plan(), times, profile=(lib.parent, 1)))
    assert ev.take_profile(lib) is None and ev.no_ncu is None     # the candidate's: the next one tries the pass again
    # the counters not permitted: the machine's; the trace checks this launch, and no later one tries ncu again
    shutil.rmtree(tmp_path / "bin")
    on_path(writes="perm")
    calls = len((tmp_path / "argv.log").read_text().splitlines())
    for _ in range(2):
        traced(lambda: ev.verify_launch(lib, plan(), times, profile=(lib.parent, 1)))
        assert ev.take_profile(lib) is None
    assert ev.no_ncu == "counters_not_permitted"
    ran = [ln for ln in (tmp_path / "argv.log").read_text().splitlines()[calls:] if "--version" not in ln]
    assert len(ran) == 1, ran


def test_a_pass_that_reached_its_launch_cap_leaves_the_launch_to_the_trace(on_path, tmp_path, monkeypatch):
    """The pass profiles CALL_LAUNCHES_MAX launches of a call at most: a report that reached the cap may have left
    launches unseen, so the trace checks the launch (here the cap lowered to the report's one kernel; traced() says what
    the trace answers on each machine); the report still serves as the keep's profile."""
    import tools.profile.ncu as ncu
    monkeypatch.setattr(ncu, "CALL_LAUNCHES_MAX", 1)
    on_path()
    task = load_task(ROOT / "kernels" / "attention_fwd")
    lib = tmp_path / "libattention_fwd.so"
    lib.write_bytes(b"not loaded")
    ev = Evaluator(task, tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    traced(lambda: ev.verify_launch(lib, plan(), StageTimes(), profile=(tmp_path, 1)))
    assert "--launch-count 1" in (tmp_path / "argv.log").read_text()
    rep = ev.take_profile(lib)
    assert rep is not None and [k.name for k in rep.kernels] == [KERNEL]


def test_a_keeps_pass_makes_its_context_beside_the_confirmation_and_a_failed_one_leaves_it_unused(on_path, tmp_path,
                                                                                                   monkeypatch):
    """A candidate about to be kept (agent/evaluation/keep.py): the held ncu pass's program (torch imported, no CUDA
    context) is told to prepare as the keep begins (its context made beside the confirmation); the confirmation runs
    first, in the child held for it with compute-sanitizer's hosts (a stand-in sanitizer that writes its pid as it
    starts), and the pass runs after it. Where the confirmation fails (here its parity cannot load the stand-in
    library) the launch is not checked: the pass never gets its library and is ended (its context would stay beside
    the next candidates' benches), a fresh one is held for the next keep, and the run's end leaves no process."""
    from agent.evaluation.attempt import Attempt
    from agent.evaluation.ended import RangeParityFailed
    from agent.evaluation.keep import launch_and_confirm
    from tools.results import ParityResult, ParityStatus
    pids = tmp_path / "wrapper.pids"
    san = tmp_path / "fake-sanitizer"
    san.write_text("#!/bin/bash\n"
                   '[ "$1" = --help ] && { echo "  --padding arg (=0)"; exit 0; }   # what it takes (sanitize.padded)\n'
                   f'while [ $# -gt 0 ] && [ "$1" != "{__import__("sys").executable}" ]; do shift; done\n'
                   f'echo $$ >> {pids}\nexec "$@"\n')
    san.chmod(0o755)
    monkeypatch.setenv("AGENT_SANITIZER", str(san))
    on_path()
    task = load_task(ROOT / "kernels" / "attention_fwd")
    lib = tmp_path / "iter-1" / "libattention_fwd.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not loaded: ncu is a stand-in")
    ev = Evaluator(task, tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    ev.spare.tier = 1                       # as the loop sets it (agent/optimize/best.py)
    ev.spare.ensure(ev)                     # held from the initial measurement on
    prepared = ev.spare.pass_
    stages: list[str] = []
    honest = Attempt(iteration=1, run_id="r", started="t", parent_sha="p", launch=plan(),
                     parity=ParityResult(status=ParityStatus.ok, message="ok: the first parity"))
    with pytest.raises(RangeParityFailed):
        launch_and_confirm(ev, lib, None, honest, False, lambda name, res: None, (lib.parent, 1), stages.append)
    assert stages == ["confirm"], stages
    assert "not the protocol" not in honest.parity.message and honest.parity.status != ParityStatus.ok
    assert honest.launch.message == plan().message, "the launch was checked after a failed confirmation"
    log = (tmp_path / "argv.log").read_text().splitlines()
    for _ in range(100):                    # (the stand-in logs what it reads as it reads it)
        if any(ln.startswith("job ") for ln in log):
            break
        time.sleep(0.1)
        log = (tmp_path / "argv.log").read_text().splitlines()
    assert [ln for ln in log if ln.startswith("job ")] == ['job {"prepare": true}'], log   # told, never given a library
    assert not prepared.child.alive, "the prepared pass outlived its keep"
    assert ev.spare.pass_ is not None and ev.spare.pass_ is not prepared and ev.spare.pass_.child.alive
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) >= 2                                    # memcheck's and racecheck's (and the next keep's)
    ev.spare.close()
    for _ in range(100):
        if not [p for p in started if os.path.exists(f"/proc/{p}")]:
            break
        time.sleep(0.1)
    assert not [p for p in started if os.path.exists(f"/proc/{p}")], "a sanitizer host outlived the run"


def test_a_keep_confirms_first_then_checks_its_launch_only_where_it_may_still_be_kept(tmp_path):
    """agent/evaluation/keep.py on the CPU, a real library through the real judge: the confirmation runs first, then
    the launch check (stages in that order; its answer says the launch was checked). Where the loop's decide() would
    reject on the confirmation's figure (`worth` says no), the launch is not checked: the candidate ends as not faster,
    not as a launch rejected, and pays for no pass."""
    from agent.evaluation.attempt import Attempt
    from tests.fixtures.cpu_faults.faults import make_task
    from tools.results import ParityResult, ParityStatus
    task, lib = make_task(tmp_path, "correct", rounds=3)
    ev = Evaluator(task, tmp_path / "build", None, scratch_root=tmp_path / "scratch")
    static = LaunchResult(status=LaunchStatus.ok, message="the static check of its own plan")

    def attempt() -> Attempt:
        return Attempt(iteration=1, run_id="r", started="t", parent_sha="p", launch=static,
                       parity=ParityResult(status=ParityStatus.ok, message="ok: the first parity"))
    from agent.evaluation.keep import launch_and_confirm
    for worth, stages_then, checked in ((None, ["confirm", "launch"], True),
                                        (lambda a: a.confirm is None, ["confirm"], False)):
        a, stages = attempt(), []
        assert launch_and_confirm(ev, lib, None, a, False, lambda name, res: None, (tmp_path, 1), stages.append,
                                  worth) is checked
        assert stages == stages_then and a.confirm is not None and a.confirm_error is None, (stages, a.confirm_error)
        assert a.parity.status == ParityStatus.ok and "the first parity" in a.parity.message


def test_a_keeps_pass_is_started_before_its_candidate_is_known_and_serves_it_as_a_cold_one_would(on_path, tmp_path):
    """The loop's evaluator holds one ncu pass started early (tools/profile/warm.py: a target waiting on stdin for its
    library, the pass's start-up paid beside other work): the keep's launch check hands it the candidate and gets the
    report where the cold pass writes it, and the same command line but for --lib; another is started as the keep
    ends; the run's end ends it. A pass of another tier is not used: the pass runs cold."""
    on_path()
    task = load_task(ROOT / "kernels" / "attention_fwd")
    lib = tmp_path / "iter-1" / "libattention_fwd.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not loaded: ncu is a stand-in")
    ev = Evaluator(task, tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    ev.spare.tier = 1                       # as the loop sets it (agent/optimize/best.py)
    child = ev.prestart()                   # each candidate's prestart: the spare pass starts with its first one
    if child is not None:
        child.close()
    ev.spare.confirming.close()             # (the confirmation's child held beside it: the next test's)
    first = ev.spare.pass_
    assert first is not None and first.child.alive
    assert first.prepare() and first.prepare()       # a keep's, twice: the program waits on for its library
    reader = first.reader                            # its report's reader, started with it (its imports done)
    assert reader is not None and reader.alive
    times = StageTimes()
    res = ev.verify_launch(lib, plan(), times, profile=(lib.parent, 1))
    assert res.status == LaunchStatus.ok and "Nsight Compute pass" in res.message, res.message
    log = (tmp_path / "argv.log").read_text().splitlines()
    jobs = [ln for ln in log if ln.startswith("job ")]
    assert jobs == ['job {"prepare": true}'] * 2 + [f'job {{"lib": "{lib.resolve()}"}}'], log   # then its library
    assert ev.spare.pass_ is None                                        # taken
    # it read the report: ended by its job's end, not by close() (which marks it used as well: before, the pass's
    # reader was closed unread and a cold one read the report, 0.6 s of an H200's keep)
    assert reader.used and not reader.alive and first.reader is None and reader.exit_code == 0, reader.exit_code
    ev.spare.ensure_pass(ev)                                             # as the keep ends (agent/evaluation/keep.py)
    nxt = ev.spare.pass_
    assert nxt is not None and nxt is not first and nxt.child.alive
    for _ in range(100):                                                 # (its stand-in logs its argv as it starts)
        ran = [ln for ln in (tmp_path / "argv.log").read_text().splitlines() if "--version" not in ln
               and not ln.startswith("job ")]
        if len(ran) == 2:
            break
        time.sleep(0.1)
    assert len(ran) == 2 and "--lib" not in ran[0].split() and "--lib" not in ran[1].split()
    assert [k.name for k in ev.take_profile(lib).kernels] == [KERNEL]
    assert len(list(lib.parent.glob("profile-t1-s*.ncu-rep"))) == 1    # where a cold pass writes its report
    assert not first.stem.parent.exists() and not first.child.alive   # the used one's folder and process gone
    ev.spare.tier = 2                                                    # a pass of tier 1 does not serve tier 2
    ev.verify_launch(lib, plan(), times, profile=(lib.parent, 2))
    assert not nxt.child.alive and ev.take_profile(lib) is not None
    ev.spare.ensure_pass(ev)
    log = (tmp_path / "argv.log").read_text().splitlines()
    assert len([ln for ln in log if ln.startswith("job ")]) == 3        # the tier-2 pass ran cold, with --lib
    cold = [ln for ln in log if "--version" not in ln and not ln.startswith("job ")][2]
    assert "--lib" in cold.split() and "ComputeWorkloadAnalysis" in cold
    last = ev.spare.pass_
    assert last is not None and last.child.alive and last.reader.alive
    unused = last.reader
    ev.spare.close()                                                     # the run's end (agent/optimize/loop.py)
    assert not last.child.alive and ev.spare.pass_ is None and not unused.alive


def test_a_keeps_confirmation_child_is_held_from_the_first_candidate_and_serves_only_the_task_it_loaded(tmp_path):
    """The confirmation's child (on a GPU with its compute-sanitizer hosts) is started with the run's first candidate
    and held: the keep takes it instead of starting one (agent/evaluation/keep.py), and the next is started as that
    keep ends. So is the child of the checks a keep leaves for after it (racecheck's host started under the tool),
    taken by the keep's Later (agent/optimize/revoke.py). A child that loaded the task before its files changed (a
    kept commit edited its Python) does not serve: it is ended and the keep starts its own. Real children (the
    judge's, waiting on stdin); the run's end ends them."""
    root = tmp_path / "attention_fwd"
    shutil.copytree(ROOT / "kernels" / "attention_fwd", root, ignore=shutil.ignore_patterns("__pycache__"))
    ev = Evaluator(load_task(root), tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    own = ev.prestart(confirmation=True)
    assert own is not None and ev.spare.confirming is None        # not the loop's evaluator: nothing held
    own.close()
    ev.spare.tier = 1
    first = ev.prestart()
    held = ev.spare.confirming
    assert held is not None and held.proc.alive and held is not first
    assert "--sanitize-early=memcheck,racecheck" in held.proc.argv                  # racecheck beside parity here
    held.close()
    ev.later = ("racecheck",)              # left for after the keep (agent/optimize/revoke.py): its host not started
    ev.spare.ensure_confirmation(ev)
    held = ev.spare.confirming
    assert held is not None and "--sanitize-early=memcheck" in held.proc.argv
    first.close()
    second = ev.prestart()
    assert second is not None and ev.spare.confirming is held                 # one held, not one a candidate
    second.close()
    lat = ev.spare.later                    # the checks after a keep: their judge child held too, its host started
    assert lat is not None and lat.proc.alive and "sanitize" in lat.proc.argv, lat
    assert "--sanitize-early=racecheck" in lat.proc.argv
    assert ev.spare.take_later() is lat and ev.spare.later is None            # the keep's Later takes it
    lat.close()
    assert ev.prestart(confirmation=True) is held and ev.spare.confirming is None
    held.close()
    ev.spare.ensure_confirmation(ev)                                          # as a keep ends
    nxt = ev.spare.confirming
    assert nxt is not None and nxt is not held and nxt.proc.alive
    (root / "task.py").write_text((root / "task.py").read_text() + "\n# a kept commit's edit\n")
    ev.task = load_task(root)
    fresh = ev.prestart(confirmation=True)
    assert fresh is not None and fresh is not nxt and not nxt.proc.alive    # the stale one ended, a fresh one started
    fresh.close()
    ev.spare.ensure_confirmation(ev)
    last = ev.spare.confirming
    assert last is not None and last.proc.alive
    ev.spare.ensure_later(ev)
    lat = ev.spare.later
    assert lat is not None and lat.proc.alive
    ev.spare.close()
    assert not last.proc.alive and ev.spare.confirming is None
    assert not lat.proc.alive and ev.spare.later is None


def test_a_pass_started_early_whose_target_never_gets_its_library_is_run_cold(on_path, tmp_path):
    """An ncu that does not hand its stdin to the program it runs: the early-started pass's target never gets its
    library and the pass profiles nothing. That is the machine's, not the candidate's: the pass is run cold (--lib) at once, and
    the keep's launch check and profile come from it."""
    on_path(writes="deaf")
    task = load_task(ROOT / "kernels" / "attention_fwd")
    lib = tmp_path / "iter-1" / "libattention_fwd.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not loaded: ncu is a stand-in")
    ev = Evaluator(task, tmp_path / "build", h200(), scratch_root=tmp_path / "scratch")
    ev.spare.tier = 1
    ev.spare.ensure_pass(ev)
    assert ev.spare.pass_ is not None
    res = ev.verify_launch(lib, plan(), StageTimes(), profile=(lib.parent, 1))
    assert res.status == LaunchStatus.ok and "Nsight Compute pass" in res.message, res.message
    ran = [ln.split() for ln in (tmp_path / "argv.log").read_text().splitlines() if "--version" not in ln]
    assert len(ran) == 2 and "--lib" not in ran[0] and "--lib" in ran[1], ran     # held, then cold
    assert [k.name for k in ev.take_profile(lib).kernels] == [KERNEL]
    ev.spare.close()
