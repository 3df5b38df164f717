"""Every profiler failure is a typed status with a fix hint, produced through real subprocesses:
ncu really missing from PATH, or a small executable named `ncu` on PATH that prints ncu's own
message text (from real ncu output) and exits as ncu does. Never an empty result that looks ok."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tools.profile import ProfileStatus, compact, profile_task, read_report
from tools.profile.ncu import EXTRA_METRICS
from tools.task import load_task

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "tests" / "fixtures" / "ncu" / "demo_task"

# ncu's own words (quoted from real ncu runs reported publicly, see the report for sources)
PERM = ("==PROF== Connected to process 9012 (/usr/bin/python3)\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
        "on the target device 0. For instructions on enabling permissions and to get more information see "
        "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n==PROF== Disconnected from process 9012\n")
DRIVER = ("==PROF== Connected to process 162 (/usr/bin/python3.13)\n"
          "==ERROR== An error was reported by the counter measurement library:\n"
          "==ERROR== Failed to initialize the profiler: LibraryNotLoaded. Check that a compatible driver library is loaded.\n"
          "==PROF== Trying to shutdown target application\n==ERROR== The application returned an error code (9).\n")
NOMATCH = ("==PROF== Disconnected from process 1906325\n==WARNING== No kernels were profiled.\n"
           "==WARNING== Note that specified NVTX include expressions match only push/pop ranges.\n")
APPFAIL = ("==PROF== Connected to process 4242 (/usr/bin/python3)\n"
           "RuntimeError: scale_run returned CUDA error 700\n"
           "==ERROR== The application returned an error code (1).\n")


def fake_ncu(tmp_path: Path, body: str) -> dict[str, str]:
    """An executable `ncu` first on PATH; it logs its argv, answers --version like ncu, runs `body`."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "ncu"
    exe.write_text("#!/bin/bash\n"
                   f"echo \"$@\" >> {tmp_path}/argv.log\n"
                   "if [ \"$1\" = --version ]; then echo 'NVIDIA (R) Nsight Compute Command Line Profiler'; "
                   "echo 'Version 2025.3.1.0 (build 36398880) (public-release)'; exit 0; fi\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{d}{os.pathsep}{os.environ['PATH']}"}


def printing(text: str, rc: int, to_stderr: bool = True) -> str:
    return f"cat {'>&2 ' if to_stderr else ''}<<'NCU_EOF'\n{text}NCU_EOF\nexit {rc}"


@pytest.fixture()
def task():
    return load_task(DEMO)


def run_with(monkeypatch, env: dict[str, str], task, **kw):
    monkeypatch.delenv("NCU", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return profile_task(task, DEMO / "libscale.so", fallback=False, **kw)


def assert_failure(rep, status):
    assert rep.status == status, rep.message
    assert rep.kernels == []
    assert rep.hint and "\n" not in rep.hint
    assert rep.message
    text = compact(rep)
    assert status.value in text and rep.hint in text


def test_ncu_not_found_for_real(monkeypatch, task, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rep = run_with(monkeypatch, {"PATH": f"{empty}{os.pathsep}/usr/bin{os.pathsep}/bin"}, task)
    assert_failure(rep, ProfileStatus.ncu_not_found)
    assert "ncu" in rep.hint


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the fallback succeeds instead")
def test_ncu_not_found_fallback_unavailable_keeps_status(monkeypatch, task, tmp_path):
    monkeypatch.delenv("NCU", raising=False)
    monkeypatch.setenv("PATH", f"/usr/bin{os.pathsep}/bin{os.pathsep}{Path(sys.executable).parent}")
    tmp = own_tempdir(monkeypatch, tmp_path)
    rep = profile_task(task, DEMO / "libscale.so", fallback=True, timeout_s=120)
    assert rep.status == ProfileStatus.ncu_not_found
    assert "fallback (torch profiler) also failed" in rep.message
    assert list(tmp.iterdir()) == []        # the fallback's trace folder went with the failure


def test_counters_not_permitted(monkeypatch, task, tmp_path):
    rep = run_with(monkeypatch, fake_ncu(tmp_path, printing(PERM, 1)), task)
    assert_failure(rep, ProfileStatus.counters_not_permitted)
    assert "ERR_NVGPUCTRPERM" in rep.message and "NVreg_RestrictProfilingToAdminUsers" in rep.hint
    assert rep.env.ncu_version == "2025.3.1.0"


def test_driver_incompatible(monkeypatch, task, tmp_path):
    rep = run_with(monkeypatch, fake_ncu(tmp_path, printing(DRIVER, 9)), task)
    assert_failure(rep, ProfileStatus.driver_incompatible)
    assert "LibraryNotLoaded" in rep.message


def test_no_kernel_matched(monkeypatch, task, tmp_path):
    rep = run_with(monkeypatch, fake_ncu(tmp_path, printing(NOMATCH, 0)), task)
    assert_failure(rep, ProfileStatus.no_kernel_matched)
    assert "kernel_regex" in rep.hint


def own_tempdir(monkeypatch, tmp_path: Path) -> Path:
    """tempfile's folder, this test's own: what a profile leaves in /tmp shows here."""
    import tempfile
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_target_failed_carries_the_programs_error(monkeypatch, task, tmp_path):
    tmp = own_tempdir(monkeypatch, tmp_path)
    rep = run_with(monkeypatch, fake_ncu(tmp_path, printing(APPFAIL, 1)), task)
    assert_failure(rep, ProfileStatus.target_failed)
    assert "CUDA error 700" in rep.message
    assert list(tmp.iterdir()) == []        # no report, and the log's tail is in the message: nothing kept


def test_timeout_kills_ncu(monkeypatch, task, tmp_path):
    rep = run_with(monkeypatch, fake_ncu(tmp_path, "sleep 30"), task, timeout_s=2)
    assert_failure(rep, ProfileStatus.timeout)
    assert rep.env.wall_seconds is not None and rep.env.wall_seconds < 10


def test_report_unreadable_through_real_ncu_report(monkeypatch, task, tmp_path):
    # ncu "succeeds" but the report it leaves is garbage: the real ncu_report module must say so
    body = ('while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; fi; shift; done\n'
            'echo "not a report" > "$out.ncu-rep"\necho "==PROF== Report: $out.ncu-rep"\nexit 0')
    rep = run_with(monkeypatch, fake_ncu(tmp_path, body), task, out_dir=tmp_path / "o")
    assert_failure(rep, ProfileStatus.report_unreadable)


def test_ncu_exit_zero_without_report_is_not_success(monkeypatch, task, tmp_path):
    rep = run_with(monkeypatch, fake_ncu(tmp_path, "exit 0"), task)
    assert_failure(rep, ProfileStatus.error)


def test_read_report_corrupt_and_missing(tmp_path):
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(b"\x00\x01garbage" * 100)
    for p in (bad, tmp_path / "missing.ncu-rep"):
        rep = read_report(p)
        assert rep.status == ProfileStatus.report_unreadable and rep.kernels == [] and rep.hint


def test_command_line_tier1_and_tier2(monkeypatch, task, tmp_path):
    """The exact ncu invocation: kernel filter, launch skip past warm-up, clocks untouched, sections."""
    env = fake_ncu(tmp_path, printing(NOMATCH, 0))
    run_with(monkeypatch, env, task, tier=1, warmup=3)
    run_with(monkeypatch, env, task, tier=2, warmup=4, launches_per_call=2)
    calls = [l for l in (tmp_path / "argv.log").read_text().splitlines() if not l.startswith("--version")]
    t1, t2 = calls
    for line in (t1, t2):
        assert "--target-processes all" in line and "-k regex:scale_add" in line
        assert "--clock-control none" in line and "--set" not in line
        assert "-m tools.profile.target --task" in line
    assert "--launch-skip 3 --launch-count 1" in t1 and "--launch-skip 8 --launch-count 2" in t2
    sections = lambda l: [w for p, w in zip(l.split(), l.split()[1:]) if p == "--section"]
    assert sections(t1) == ["SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats"]
    assert sections(t2) == ["SpeedOfLight", "LaunchStats", "Occupancy", "ComputeWorkloadAnalysis",
                            "MemoryWorkloadAnalysis", "SchedulerStats", "WarpStateStats"]
    assert "--metrics " + ",".join(EXTRA_METRICS) in t1


def test_missing_metric_is_dropped_and_retried(monkeypatch, task, tmp_path):
    gone = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    body = (f'if echo "$@" | grep -q {gone}; then echo "==ERROR== Failed to find metric {gone}" >&2; exit 1; fi\n'
            + printing(NOMATCH, 0))
    rep = run_with(monkeypatch, fake_ncu(tmp_path, body), task)
    calls = [l for l in (tmp_path / "argv.log").read_text().splitlines() if not l.startswith("--version")]
    assert len(calls) == 2 and gone in calls[0] and gone not in calls[1]
    assert rep.status == ProfileStatus.no_kernel_matched


def test_cli_json_and_exit_code(tmp_path):
    bad = tmp_path / "x.ncu-rep"
    bad.write_text("garbage")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--from-report", str(bad), "--json"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 1
    assert json.loads(p.stdout)["status"] == "report_unreadable"
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--from-report", str(bad)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "report_unreadable" in p.stderr and "fix:" in p.stderr
