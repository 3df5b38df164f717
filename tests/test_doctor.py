"""`agent doctor` and `agent check` as a user runs them: real subprocesses, real compilers."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.userrepo import agent
from tools.build.build import find_nvcc

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "fixtures"


def _agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # tests/userrepo.py's: the repository first on PYTHONPATH, an existing one kept (on the device the dependencies
    # are installed with --target and found through it), the command forked from the tests' warm parent
    return agent(ROOT, *args, timeout=300, env=env)


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def test_doctor_json_reports_this_machine():
    res = _agent("doctor", "--json", "--no-probe", env={"OPENAI_API_KEY": "sk-do-not-print-me"})
    assert res.returncode == 0, res.stderr
    assert "sk-do-not-print-me" not in res.stdout + res.stderr
    rep = json.loads(res.stdout)
    rows = {r["name"]: r for r in rep["rows"]}
    assert rep["ok"] is True
    assert {"python", "gpu", "nvcc", "c++", "ninja", "ncu", "ncu_report", "torch", "llm endpoint"} <= set(rows)
    assert rows["c++"]["status"] == "ok" and rows["ninja"]["status"] == "ok"
    assert rows["llm endpoint"]["status"] == "ok" and "OPENAI_API_KEY set" in rows["llm endpoint"]["detail"]
    if find_nvcc():
        assert rows["nvcc"]["status"] == "ok" and rows["nvcc"]["detail"][0].isdigit()
    if not _gpu():
        assert rows["gpu"]["status"] == "missing" and rows["gpu"]["hint"]


def test_doctor_without_a_compiler_fails_with_hints(tmp_path):
    # an empty PATH: no c++, no git, no nvcc (ninja may still come from the Python package)
    env = {"PATH": str(tmp_path), "CXX": "", "CUDA_HOME": "", "CUDA_PATH": "", "OPENAI_API_KEY": "",
           "OPENAI_BASE_URL": "", "AGENT_BASE_URL": ""}
    res = _agent("doctor", "--json", "--no-probe", env=env)
    assert res.returncode == 1
    rows = {r["name"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["c++"]["status"] == "missing" and "g++" in rows["c++"]["hint"]
    assert rows["nvcc"]["status"] == "missing" and "CUDA toolkit" in rows["nvcc"]["hint"]
    assert rows["llm endpoint"]["status"] == "warn"


def test_doctor_table_prints():
    res = _agent("doctor", "--no-probe")
    assert res.returncode == 0
    assert "agent doctor" in res.stdout and "nvcc" in res.stdout


def test_check_stops_at_a_compile_error(tmp_path):
    res = _agent("check", str(FIX / "cpp_bad"), "--build-dir", str(tmp_path), "--json")
    assert res.returncode == 1
    s = json.loads(res.stdout)
    assert s["ok"] is False and s["build"]["status"] == "compile_error"
    assert "bad.cpp:6" in s["build"]["message"]
    assert s["launch"] is None and s["parity"] is None and s["bench"] == []


def test_check_cpu_task_runs_what_exists(tmp_path):
    res = _agent("check", "kernels/matmul_cpu", "--build-dir", str(tmp_path))
    assert "build" in res.stdout and "Traceback" not in res.stdout + res.stderr
    jres = _agent("check", "kernels/matmul_cpu", "--build-dir", str(tmp_path), "--json")
    s = json.loads(jres.stdout)
    assert s["build"]["status"] == "ok" and s["launch"]["status"] == "not_applicable"
    # the whole pipeline ran: parity passed, the bench timed the candidate and the reference
    assert s["parity"]["status"] == "ok" and s["parity"]["checks"]
    assert [b["status"] for b in s["bench"]] == ["ok"] and s["bench"][0]["speedup_vs_reference"] is not None
    assert s["ok"] is True and jres.returncode == 0
    assert "all checks passed" in res.stdout


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_check_rejects_a_two_cta_launch(tmp_path):
    d = tmp_path / "t"
    shutil.copytree(FIX / "cuda_launch", d)
    src = (d / "scale.cu").read_text().replace("#define MAX_CTAS 1048576", "#define MAX_CTAS 2")
    (d / "scale.cu").write_text(src)
    res = _agent("check", str(d), "--build-dir", str(tmp_path / "b"), "--json")
    assert res.returncode == 1
    s = json.loads(res.stdout)
    assert s["build"]["status"] == "ok" and s["launch"]["status"] == "rejected"
    assert [v["rule"] for v in s["launch"]["violations"]] == ["grid_too_small"]
    assert s["parity"] is None
