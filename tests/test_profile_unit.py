"""Bottleneck thresholds, the occupancy estimate, the compact view, and the profile target and
trace parser on the CPU (a real g++-built library, a real torch profiler trace)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.profile import compact
from tools.profile.classify import SOL_HIGH, classify_bottleneck
from tools.profile.fallback import SmLimits, estimate_occupancy, report_from_trace
from tools.profile.model import Bottleneck, KernelProfile, ProfileEnv, ProfileReport, ProfileStatus, RuleResult, Stall

ROOT = Path(__file__).resolve().parent.parent
H100 = SmLimits(sm_count=132)


def kp(ctas=1024, c=None, m=None, rules=()):
    return KernelProfile(name="k", grid=(ctas, 1, 1), block=(256, 1, 1), ctas=ctas,
                         sol_compute_pct=c, sol_memory_pct=m, rules=list(rules))


@pytest.mark.parametrize("k,expect", [
    (kp(ctas=2, c=90, m=90), Bottleneck.small_grid),               # CTAs < SM count wins over SOL
    (kp(c=20, m=85), Bottleneck.memory),
    (kp(c=85, m=70), Bottleneck.compute),
    (kp(c=70, m=70), Bottleneck.memory),                           # tie: memory
    (kp(c=30, m=45), Bottleneck.latency),
    (kp(c=SOL_HIGH - 1, m=SOL_HIGH - 1), Bottleneck.latency),
    (kp(), Bottleneck.unknown),
    (kp(ctas=200, c=10, m=10, rules=[RuleResult(id="LaunchConfiguration", title="Small Grid", message="x")]),
     Bottleneck.small_grid),
])
def test_bottleneck_thresholds(k, expect):
    b, reason = classify_bottleneck(k, 132)
    assert b == expect and reason


def test_small_grid_reason_names_grid_and_sms():
    b, reason = classify_bottleneck(kp(ctas=2, c=1, m=1), 132)
    assert b == Bottleneck.small_grid and "2 CTAs on 132 SMs" in reason


@pytest.mark.parametrize("threads,regs,smem,occ,limiter,per_sm", [
    (256, 18, 0, 100.0, "warps", 8),            # the demo kernel (ptxas: 18 registers)
    (256, 128, 0, 25.0, "registers", 2),        # 128 regs x 256 threads: 2 CTAs of 8 warps
    (128, 32, 100 * 1024, 12.5, "shared_memory", 2),  # 100 KiB + 1 KiB reserved per CTA
    (32, 16, 0, 50.0, "blocks", 32),            # 32 CTAs/SM cap x 1 warp = 32 of 64 warps
])
def test_occupancy_estimate(threads, regs, smem, occ, limiter, per_sm):
    assert estimate_occupancy(threads, regs, smem, H100) == (occ, limiter, per_sm)


def test_compact_is_small_and_keeps_the_evidence():
    long = "The grid for this launch is configured to execute only 2 blocks, which is less than the GPU's 132 multiprocessors. " * 5
    rules = [RuleResult(id=f"R{i}", title=f"Rule {i}", type="OPT", message=long, speedup=float(i), speedup_kind="global")
             for i in range(10)]
    k = KernelProfile(name="scale_add_kernel", grid=(2, 1, 1), block=(256, 1, 1), ctas=2, waves_per_sm=0.01,
                      registers_per_thread=18, smem_static_bytes=0, smem_dynamic_bytes=0, duration_us=812.5,
                      sol_compute_pct=1.2, sol_memory_pct=3.4, dram_pct=3.3, l1_hit_pct=0.0, l2_hit_pct=33.0,
                      occupancy_theoretical_pct=100.0, occupancy_achieved_pct=12.4, occupancy_limiter="warps",
                      tensor_pipe_pct=0.0, stalls=[Stall(reason="long_scoreboard", pct=71.0)], rules=rules,
                      bottleneck=Bottleneck.small_grid, bottleneck_reason="grid is 2 CTAs on 132 SMs (130 SMs idle)")
    rep = ProfileReport(status=ProfileStatus.ok, kernels=[k],
                        env=ProfileEnv(ncu_version="2025.3.1.0", gpu="NVIDIA H100 80GB HBM3", sm_count=132, clock_control="none"))
    text = compact(rep)
    assert len(text) < 3000, len(text)     # four whole rule messages of 600 characters (issue 63: never cut)
    assert text.count(long.strip()) == 4
    assert "grid 2 (2 CTAs)" in text and "bottleneck: small_grid" in text and "long_scoreboard 71%" in text
    assert "[Rule 9 ~9% global]" in text and "[Rule 5" not in text     # top 4 by estimated speedup
    assert "clocks none" in text


def test_fallback_compact_says_no_counters():
    k = KernelProfile(name="k", grid=(2, 1, 1), block=(256, 1, 1), ctas=2, occupancy_theoretical_pct=100.0)
    text = compact(ProfileReport(status=ProfileStatus.fallback, source="fallback", kernels=[k]))
    assert "NO COUNTERS" in text


@pytest.fixture(scope="module")
def matmul_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    lib = tmp_path_factory.mktemp("mm") / "libmatmul.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(ROOT / "kernels/matmul_cpu/matmul.cpp")], check=True)
    return lib


def test_target_runs_the_task_and_writes_a_real_trace(matmul_lib, tmp_path):
    """The profiled program for real (CPU task): W+N calls, one JSON line; --trace writes a torch
    profiler trace, in which the fallback finds no CUDA kernel and says so (never an empty ok)."""
    trace = tmp_path / "trace.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "tools.profile.target", "--task", str(ROOT / "kernels/matmul_cpu"),
                        "--lib", str(matmul_lib), "--shape-index", "0", "--warmup", "2", "--iters", "3",
                        "--trace", str(trace)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["calls"] == 5 and out["shape"] == {"M": 64, "N": 64, "K": 64}
    assert "traceEvents" in json.loads(trace.read_text())
    rep = report_from_trace(trace, "matmul")
    assert rep.status == ProfileStatus.no_kernel_matched and rep.kernels == [] and rep.hint


def test_profile_of_a_cpu_task_is_an_error_not_empty(matmul_lib):
    from tools.profile import profile_task
    from tools.task import load_task
    rep = profile_task(load_task(ROOT / "kernels/matmul_cpu"), matmul_lib)
    assert rep.status == ProfileStatus.error and "CUDA" in rep.message and rep.hint


def test_a_waiting_target_reads_its_task_only_once_its_library_comes(matmul_lib, tmp_path):
    """tools/profile/warm.py starts the profiled program before its candidate is known: it imports torch, then waits
    for its library on stdin (a {"prepare": true} line before it makes a CUDA task's context). A candidate's commit may change the task meanwhile (here its shapes), so the task is
    read after the job: the call reports the shape the task says then. End-of-file instead of a job: it ends quietly."""
    import time

    from tools.isolation.sandbox import Prestarted, python_env
    task = tmp_path / "matmul_cpu"
    shutil.copytree(ROOT / "kernels/matmul_cpu", task)
    argv = [sys.executable, "-m", "tools.profile.target", "--task", str(task), "--shape-index", "0", "--warmup", "1",
            "--iters", "1"]
    child = Prestarted(argv, cwd=ROOT, env=python_env())
    pid = child._proc.pid
    t_end = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{pid}/maps").read_text() and time.monotonic() < t_end:
        time.sleep(0.1)           # torch is being imported: the start-up is under way
    time.sleep(1.0)
    toml = task / "task.toml"
    assert '{ M = 64,  N = 64,  K = 64 }' in toml.read_text()
    toml.write_text(toml.read_text().replace('{ M = 64,  N = 64,  K = 64 }', '{ M = 32, N = 48, K = 16 }', 1))
    assert child.tell(json.dumps({"prepare": True}))    # a keep began: its context now (a CUDA task's), then the job
    res = child.run(json.dumps({"lib": str(matmul_lib)}), 120)
    assert res.status.value == "ok", res.stderr
    assert not child.tell(json.dumps({"prepare": True})), "a line told to a child whose job has run"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["calls"] == 2 and out["shape"] == {"M": 32, "N": 48, "K": 16}
    quiet = Prestarted(argv, cwd=ROOT, env=python_env())
    quiet._proc.stdin.close()
    assert quiet._proc.wait(timeout=120) == 0 and quiet._proc.stdout.read() == b""
    quiet.close()


ESCAPE = '''
import os as _os
if _os.environ.get("ESCAPE_TO"):     # the task's Python, as a candidate's commit may change it
    try:
        open(_os.environ["ESCAPE_TO"], "w").write("out of the scratch directory")
    except OSError:
        pass
    open(_os.path.join(_os.environ["HOME"], "inside"), "w").write("in its scratch directory")
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock is Linux's")
def test_the_profiled_program_writes_only_in_its_scratch_directory(matmul_lib, tmp_path):
    """The Nsight Compute target loads the candidate's library and its task's Python (which a candidate's commit may
    change): it fences itself to the scratch directory its parent gives it (tools/profile/target.py fence), as the
    judge's host does. A write by absolute path outside fails, one into its HOME lands there and is listed when the
    directory closes; the call itself is unharmed. Without the scratch directory (no fence) the same write lands:
    what this test sees is the fence."""
    from tools.isolation.confine import landlock_abi
    from tools.isolation.sandbox import run_isolated
    from tools.isolation.scratch import Scratch, drain
    from tools.profile.target import target_argv, target_env
    from tools.task import load_task
    if landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock: nothing fences the target")
    task_dir = tmp_path / "matmul_cpu"
    shutil.copytree(ROOT / "kernels/matmul_cpu", task_dir)
    (task_dir / "task.py").write_text((task_dir / "task.py").read_text() + ESCAPE)
    task = load_task(task_dir)
    argv = target_argv(task, matmul_lib, 0, 1, 1)
    out = tmp_path / "escaped"
    drain()
    with Scratch(tmp_path / "scratch", "profile") as s:
        res = run_isolated(argv, 300, cwd=s.dir, env={**target_env(s), "ESCAPE_TO": str(out)})
    assert res.status.value == "ok", res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["ok"]
    assert not out.exists(), "the fenced target wrote outside its scratch directory"
    assert "inside" in [f.path for f in drain()]
    env = {k: v for k, v in target_env(s).items() if k != "AGENT_SCRATCH"}   # the same start, no scratch to fence to
    home = tmp_path / "home"
    home.mkdir()
    res = run_isolated(argv, 300, cwd=home, env={**env, "HOME": str(home), "ESCAPE_TO": str(out)})
    assert res.status.value == "ok", res.stderr
    assert out.read_text() == "out of the scratch directory"


def test_the_fallback_trace_comes_out_of_the_fenced_target(matmul_lib, tmp_path):
    """The torch-profiler fallback's target writes its trace in its own scratch directory (the only place its fence
    lets it write) and the agent moves it to the folder asked for, where it is read: here the CPU task's trace, with
    no CUDA kernel in it (an honest no_kernel_matched, not a failed program)."""
    from tools.profile.fallback import profile_fallback
    from tools.task import load_task
    rep = profile_fallback(load_task(ROOT / "kernels/matmul_cpu"), matmul_lib, shape=0, timeout_s=300, out_dir=tmp_path)
    assert rep.status == ProfileStatus.no_kernel_matched, rep.message
    assert "traceEvents" in json.loads((tmp_path / "trace.json").read_text())
