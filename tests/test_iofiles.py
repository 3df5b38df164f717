"""The judge's buffer files (tools/judge/iofiles.py): in a private folder in memory where /dev/shm is a tmpfs with room,
a large buffer on disk, each file removed by its reader, the folder gone with its host or, after a judge was killed,
with the next judge's start; the host, fenced, writes its outputs there and the judge gets them right."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tools.judge import iofiles

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")
SHM_TMPFS = iofiles._tmpfs(iofiles.SHM)


def test_a_small_buffer_goes_to_memory_a_large_one_to_disk_and_a_bad_key_nowhere():
    dirs = ["/dev/shm/mem", "/scratch/io"]
    bound = iofiles.MEMORY_MAX_BYTES
    assert iofiles.path_of(dirs, "i7f00aa-4096", bound) == "/dev/shm/mem/i7f00aa-4096.bin"
    assert iofiles.path_of(dirs, f"o7f00aa-{bound}", bound).startswith("/dev/shm/mem/")
    assert iofiles.path_of(dirs, f"o7f00aa-{bound + 1}", bound) == f"/scratch/io/o7f00aa-{bound + 1}.bin"
    assert iofiles.path_of(["/scratch/io"], "i7f00aa-4096", bound) == "/scratch/io/i7f00aa-4096.bin"   # no memory
    for bad in ("../x-1", "a/b-1", "i7f.0-1", ""):
        with pytest.raises(ValueError):
            iofiles.path_of(dirs, bad, bound)


def test_a_file_is_removed_by_its_reader(tmp_path):
    import torch
    t = torch.arange(10, dtype=torch.float32)
    f = str(tmp_path / "i1-40.bin")
    iofiles.save(t, f)
    got = torch.empty(10)
    iofiles.load_into(got, f)
    assert torch.equal(got, t) and not os.path.exists(f)
    iofiles.save(t, f)
    with pytest.raises(ValueError):
        iofiles.load_into(torch.empty(11), f)        # a size that differs is an error, and the file stays
    assert os.path.exists(f)


@pytest.mark.skipif(not SHM_TMPFS, reason="no tmpfs at /dev/shm")
def test_a_killed_judges_folder_is_removed_by_the_next_and_a_live_ones_is_not(monkeypatch):
    monkeypatch.delenv("AGENT_IO_MEMORY", raising=False)      # the default, whatever the caller's environment
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = os.path.join(iofiles.SHM, f"{iofiles.PREFIX}{dead.pid}-test")
    os.makedirs(left)
    open(os.path.join(left, "o1-4.bin"), "wb").close()
    mine = iofiles.memory_dir()
    try:
        assert mine is not None and mine.parent == iofiles.Path(iofiles.SHM) and oct(mine.stat().st_mode)[-3:] == "700"
        assert not os.path.exists(left)                        # the dead judge's, swept by this start
        assert iofiles.sweep() == [] and mine.is_dir()         # ours: alive, kept
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(left, ignore_errors=True)
    monkeypatch.setenv("AGENT_IO_MEMORY", "0")
    assert iofiles.memory_dir() is None


@pytest.mark.skipif(shutil.which("g++") is None or not SHM_TMPFS, reason="needs g++ and a tmpfs at /dev/shm")
def test_the_fenced_host_writes_its_outputs_in_memory_and_the_folder_goes_with_it(tmp_path, monkeypatch):
    import torch

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.hostclient import HostClient, Remote
    monkeypatch.delenv("AGENT_IO_MEMORY", raising=False)
    task, lib = make_task(tmp_path, "correct")
    root = tmp_path / "judge"
    root.mkdir()
    host = HostClient(task.root, root)
    try:
        assert host.memory is not None and str(host.memory).startswith(iofiles.SHM)
        host.ask({"op": "load", "id": "candidate", "path": str(lib)})
        remote = Remote(host)
        a, b = torch.randn(33, 29), torch.randn(29, 17)
        out = torch.empty(33, 17)
        remote.calls("candidate", {"M": 33, "N": 17, "K": 29}, [(out, [a, b])])
        assert torch.allclose(out, a @ b, atol=1e-4, rtol=1e-4)      # written by the host (fenced) in memory, read here
        assert remote.moved["file"] == out.numel() * 4
        assert os.listdir(host.memory) == [] and os.listdir(host.io) == []     # each file removed by its reader
    finally:
        host.close()
    assert not host.memory.exists()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_buffer_past_the_bound_goes_through_the_disk(tmp_path, monkeypatch):
    import torch

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.hostclient import HostClient, Remote
    monkeypatch.setattr(iofiles, "MEMORY_MAX_BYTES", 1024)      # the judge's bound, told to its host at its start
    task, lib = make_task(tmp_path, "correct")
    root = tmp_path / "judge"
    root.mkdir()
    host = HostClient(task.root, root)
    seen = []
    real = iofiles.save
    # the judge's side of the transfer, watched where the judge calls it
    monkeypatch.setattr("tools.judge.hostclient.save", lambda t, path: (seen.append(path), real(t, path)))
    try:
        host.ask({"op": "load", "id": "candidate", "path": str(lib)})
        remote = Remote(host)
        a, b, out = torch.randn(33, 29), torch.randn(29, 17), torch.empty(33, 17)
        remote.calls("candidate", {"M": 33, "N": 17, "K": 29}, [(out, [a, b])])
        assert torch.allclose(out, a @ b, atol=1e-4, rtol=1e-4)
    finally:
        host.close()
    assert seen and all(p.startswith(str(host.io)) for p in seen), seen     # every input over 1 KiB: on disk
