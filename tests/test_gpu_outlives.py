"""A candidate's GPU work must not outlive its host (issue 40). On an H200 a process that forked a child before it was
killed left its CUDA context, and the kernel it had queued, on the GPU: the next kernel's events said 48 us a call
while back-to-back calls took 104 us, the signature of the honest softmax's refusal in the issue
(scripts/device/gpu_outlives.py). The host's seccomp filter (tools/isolation/nofork.py) now stops the fork on a GPU
host too; where it is off, the judge names a host whose context is still on the GPU after its kill
(tools/judge/judge.py `outlived`).

On CI: nvidia-smi's process list is read as it prints it. On the device (`-m gpu`): a softmax whose launcher forks a
child that holds the context is ok with the filter (its fork refused) and `side_effect` without it, the pid named."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tools.backends.device import compute_pids
from tools.task import load_task

ROOT = Path(__file__).resolve().parents[1]


def test_nvidia_smis_process_list_is_read_as_it_prints_it():
    # what `nvidia-smi --query-compute-apps=pid --format=csv,noheader` printed on the H200 with two contexts
    assert compute_pids("499\n630\n") == {499, 630}
    assert compute_pids("499, 802 MiB\n") == {499}        # with used_memory asked too
    assert compute_pids("No running processes found\n") == set()
    assert compute_pids("") == set()


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and shutil.which("nvidia-smi") is not None
    except ImportError:
        return False


# the launcher's first call forks a child that leaves the host's session and holds its device files until 6 s after
# the host is gone
FORK = ("    static bool forked = false;\n"
        "    if (!forked) { forked = true; pid_t host = getpid(); pid_t p = fork();\n"
        "      if (p == 0) { setsid(); while (getppid() == host) usleep(100000); sleep(6); _exit(0); } }\n")


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU and nvidia-smi")
def test_a_host_whose_child_holds_its_gpu_context_is_named_and_the_filter_stops_it(tmp_path, monkeypatch):
    from tools.build.build import build
    from tools.measure.parity import run_parity
    from tools.results import ParityStatus
    d = tmp_path / "softmax"
    shutil.copytree(ROOT / "kernels" / "softmax", d, ignore=shutil.ignore_patterns("__pycache__"))
    src = (d / "softmax.cu").read_text()
    head = "extern \"C\" int softmax_run(const void* x, void* y, int M, int N, int flags, cudaStream_t stream) {\n"
    assert src.count(head) == 1
    (d / "softmax.cu").write_text("#include <unistd.h>\n" + src.replace(head, head + FORK))
    task = load_task(d)
    b = build(task, tmp_path / "b")
    assert b.status.value == "ok", b.message
    res = run_parity(task, b.lib_path, extent="quick")
    assert res.status == ParityStatus.ok, res.message          # the filter refused the fork: nothing outlives the host
    monkeypatch.setenv("AGENT_HOST_NOFORK", "0")
    res = run_parity(task, b.lib_path, extent="quick")
    assert res.status == ParityStatus.side_effect, res.message
    assert "its CUDA context (pid" in res.message and "still on the GPU" in res.message, res.message
    time.sleep(6)    # the child's last seconds: the GPU is left as the test found it
