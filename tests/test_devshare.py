"""Buffers to and from the kernel's host through CUDA IPC (tools/judge/devshare.py): the same bytes as the files
channel, and a host's answer that names memory the judge may not take is refused, not copied. On the CPU the
files channel and the refusals; the IPC copy itself on the GPU."""

from __future__ import annotations

import shutil
import sys

import pytest

from tools.judge import devshare

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                               reason="needs g++ and Linux")


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def test_a_shared_range_must_lie_inside_the_mapped_allocation():
    assert devshare.within(0, 4096, 4096) and devshare.within(1024, 0, 1024)
    assert not devshare.within(1, 4096, 4096)          # one byte past the end
    assert not devshare.within(-8, 8, 4096)
    assert not devshare.within(0, -1, 4096)
    assert not devshare.within(1 << 62, 1 << 62, 4096)  # no wrap in Python's integers, still refused
    assert not devshare.within("0", 8, 4096) and not devshare.within(0, 8.0, 4096)


def test_a_handle_travels_whole_with_its_nul_bytes():
    """The driver's handle is 64 opaque bytes; the first device run sent 4 of them (a c_char array's value stops at
    its first NUL) and every mapping failed."""
    raw = bytes([0xF0, 0x91, 0x7F, 0x47, 0, 0, 2, 0] + [0] * 55 + [9])
    text = devshare.handle_text(devshare.handle_of(raw.hex()))
    assert len(text) == 128 and bytes.fromhex(text) == raw


@needs_gxx
def test_a_cpu_task_brings_its_outputs_back_through_files_and_refuses_a_forged_share(tmp_path):
    import torch

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.hostclient import HostClient, HostFailed, Remote
    task, lib = make_task(tmp_path, "correct")
    mod = task.module()
    shape = {"M": 64, "N": 48, "K": 32}
    inputs = mod.make_inputs(shape, 0, "cpu", "normal")
    out = mod.empty_output(shape, *inputs)
    root = tmp_path / "judge"
    root.mkdir()
    host = HostClient(task.root, root)
    try:
        host.ask({"op": "load", "id": "candidate", "path": str(lib)})
        remote = Remote(host)
        assert remote.ipc is devshare.enabled()      # asked for; a CPU host has no device memory to share
        remote.run("candidate", shape, out, *inputs)
        assert torch.allclose(out, mod.reference(shape, *inputs), rtol=1e-4, atol=1e-4)
        assert remote.moved == {"ipc": 0, "file": out.numel() * out.element_size(), "ipc_out": 0}
        # a host that answers a handle for a buffer the judge holds in host memory: refused before any copy
        key = next(iter(remote.synced))
        forged = {"shared": {key: {"handle": "00" * 64, "offset": 0, "nbytes": out.numel() * out.element_size()}}}
        with pytest.raises(HostFailed, match="host memory"):
            remote.bring(forged, {key: out})
    finally:
        host.close()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_on_the_gpu_inputs_and_outputs_travel_through_ipc_with_the_bytes_the_files_give(tmp_path, monkeypatch):
    import torch

    from tools.build.build import build
    from tools.judge.hostclient import HostClient, HostFailed, Remote
    from tools.task import load_task
    d = tmp_path / "softmax"
    shutil.copytree(ROOT / "kernels" / "softmax", d, ignore=shutil.ignore_patterns("__pycache__", "build"))
    task = load_task(d)
    b = build(task, tmp_path / "build")
    assert b.status.value == "ok", b.message[:500]
    mod = task.module()
    shape = dict(task.spec.main)
    inputs = mod.make_inputs(shape, 0, "cuda", "normal")
    got = {}
    from tools.judge import iofiles
    files: list[str] = []       # the judge's buffer files, watched where it writes them (a reader removes each)
    monkeypatch.setattr("tools.judge.hostclient.save", lambda t, path: (files.append(path), iofiles.save(t, path)))
    for ipc in ("1", "0"):
        monkeypatch.setenv("AGENT_HOST_IPC", ipc)
        files.clear()
        root = tmp_path / f"judge-{ipc}"
        root.mkdir()
        host = HostClient(task.root, root)
        try:
            host.ask({"op": "load", "id": "candidate", "path": str(b.lib_path)})
            remote = Remote(host)
            out = mod.empty_output(shape, *inputs)
            remote.run("candidate", shape, out, *inputs)
            nbytes, sent = out.numel() * out.element_size(), sum(t.numel() * t.element_size() for t in inputs)
            assert remote.moved == ({"ipc": nbytes, "file": 0, "ipc_out": sent} if ipc == "1" else
                                    {"ipc": 0, "file": nbytes, "ipc_out": 0})
            assert not files if ipc == "1" else any(f.rsplit("/", 1)[-1].startswith("i") for f in files), files
            got[ipc] = out.clone()
            if ipc == "1":
                # the host's answer names a range past its allocation's end: refused, nothing copied
                key = next(k for k in remote.synced if k.startswith("o"))
                ans = host.ask({"op": "call", "shape": shape, "put": [], "calls": [], "get": [key], "ipc": True})
                share = ans["shared"][key]
                bad = {"shared": {key: {**share, "offset": share["offset"] + (1 << 40)}}}
                with pytest.raises(HostFailed, match="outside its allocation"):
                    remote.bring(bad, {key: out})
                remote.mapped.close()
                assert remote.mapped.open == {}
        finally:
            host.close()
    assert torch.equal(got["1"], got["0"])
    assert torch.allclose(got["1"].float(), mod.reference(shape, *inputs).float(), atol=1e-2)
