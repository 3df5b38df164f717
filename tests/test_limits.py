"""The resource limits of the process that runs a candidate (tools/isolation/limits.py, issue 41): set in the judge's
host before any candidate library loads, lowered and never raised, reported in its answer to init, and named in the
reason when one stops the kernel."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tests.fixtures.cpu_faults.faults import make_task
from tools.measure.parity import run_parity
from tools.results import ParityStatus

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


def _limits_in_child(env: dict | None = None) -> dict:
    code = ("import json; from tools.isolation.limits import apply, wanted\n"
            "print(json.dumps(apply(wanted(False, 480, '.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}, cwd=os.getcwd())
    return json.loads(out.stdout)


def test_the_limits_are_set_lowered_never_raised_and_overridable():
    got = _limits_in_child()
    hard = {k: resource.getrlimit(getattr(resource, n))[1] for k, n in
            [("cpu_s", "RLIMIT_CPU"), ("nofile", "RLIMIT_NOFILE"), ("as_bytes", "RLIMIT_AS")]}
    assert got["nofile"] == min(4096, hard["nofile"]) if hard["nofile"] != resource.RLIM_INFINITY else 4096
    assert 0 < got["cpu_s"] <= 480 * (os.cpu_count() or 1) + 60
    assert got["fsize_bytes"] >= 1 << 30 and got["nproc"] > 0
    assert 0 < got["as_bytes"] <= max(16 << 30, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + (1 << 20))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] != 64       # this process's own are untouched
    assert _limits_in_child({"AGENT_HOST_LIMITS": "nofile=64,fsize_bytes=2097152"})["nofile"] == 64


def test_a_kernel_that_writes_past_its_file_size_limit_is_stopped_and_the_limit_named(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_HOST_LIMITS", "fsize_bytes=1048576")
    task, lib = make_task(tmp_path, "correct")
    assert run_parity(task, lib).status == ParityStatus.ok          # the honest kernel writes no file: unaffected
    task, lib = make_task(tmp_path, "bigfile")
    res = run_parity(task, lib)
    # Python ignores SIGXFSZ: the 4 MiB write fails past the limit (EFBIG), and the file stops there
    assert res.status == ParityStatus.side_effect, res.message
    assert "matmul_cache.bin (1048576 B); stopped at the host's file-size limit (RLIMIT_FSIZE, 1048576 bytes)" \
        in res.message, res.message


FORKS = ("#include <cstddef>\n#include <cstdio>\n#include <unistd.h>\n#include <sys/wait.h>\n",
         "                       int M, int N, int K) {\n"
         "    { pid_t p = fork();\n"
         "      if (p == 0) { FILE* f = fopen(\"forked_child.txt\", \"w\"); if (f) { fputs(\"ran\\n\", f); fclose(f); } _exit(0); }\n"
         "      if (p > 0) waitpid(p, nullptr, 0); }\n")


def test_a_kernel_cannot_start_a_process_in_a_cpu_host_whoever_runs_it(tmp_path, monkeypatch):
    """tools/isolation/nofork.py: fork fails with EPERM in the host (root included, where RLIMIT_NPROC does not hold),
    so the kernel's child never writes its file and parity is ok; with the filter off (AGENT_HOST_NOFORK=0) the
    same kernel's child runs, and its file is the side effect the judge names. Threads still start (torch's)."""
    from tests.fixtures.cpu_faults.faults import compile_lib, source
    task, _ = make_task(tmp_path, "correct")
    src = source("correct").replace("#include <cstddef>\n", FORKS[0], 1)
    assert src.count(FORKS[1].splitlines(True)[0]) == 1
    lib = compile_lib(src.replace(FORKS[1].splitlines(True)[0], FORKS[1]), tmp_path / "libforks.so")
    res = run_parity(task, lib)
    assert res.status == ParityStatus.ok, res.message
    monkeypatch.setenv("AGENT_HOST_NOFORK", "0")
    res = run_parity(task, lib)
    assert res.status == ParityStatus.side_effect and "forked_child.txt" in res.message, res.message
