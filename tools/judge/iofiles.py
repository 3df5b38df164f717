"""The judge's buffer files: a CPU tensor (or a GPU one the driver cannot share through CUDA IPC) travels between the
judge and its host as a file of its bytes, named by its key (tools/judge/hostclient.py Remote): the judge writes the
inputs the host does not hold, the host the outputs and any input a call changed, and each side reads the other's.

Where they are: in a private folder in memory, on /dev/shm where it is a tmpfs with room (at least
MEMORY_FREE_BYTES free), for every buffer up to MEMORY_MAX_BYTES; on disk, in the host's scratch folder (io/),
otherwise and for a larger buffer (the wide shape's gigabytes stay out of memory). A CPU task's check writes
thousands of them; on the disk's filesystem each new file cost 0.12-0.26 ms of CPU in the kernel's inode allocation
(ext4, this project's machines, 2026-11-29), 0.05 ms in memory: the fast tier about 4 s shorter, a single check the
same (BENCHMARKS.md, "The test suite").
A reader removes a file once it has read it, so the memory folder holds only what is in flight.

The memory folder is named after the judge's process id, removed by HostClient.close, and any left by a judge
that was killed is removed by the next judge to start (`memory_dir`). The host's fence
(tools/isolation/confine.py) lets it write there ($AGENT_IO) as in its scratch folder: what a kernel could put
there lasts as long as its host, as its memory does. AGENT_IO_MEMORY=0: always on disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SHM = "/dev/shm"
PREFIX = "kernel-agent-io-"
MEMORY_MAX_BYTES = 64 << 20      # a larger buffer goes to disk
MEMORY_FREE_BYTES = 1 << 30      # the memory folder only where /dev/shm has this much free


def save(t, path: str) -> None:
    """A tensor's bytes (contiguous, host memory) to a file."""
    t.detach().contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy().tofile(path)


def load_into(t, path: str) -> None:
    """A file's bytes into the (contiguous) tensor t, which keeps its memory; the file removed after (read once)."""
    import torch
    n = t.numel() * t.element_size()
    if os.path.getsize(path) != n:
        raise ValueError(f"{os.path.basename(path)} holds {os.path.getsize(path)} bytes, the buffer {n}")
    src = torch.from_file(path, size=n, dtype=torch.uint8)
    t.view(-1).view(torch.uint8).copy_(src)
    del src
    try:
        os.unlink(path)
    except OSError:
        pass


def path_of(dirs: list[str], key: str, bound: int) -> str:
    """The file of buffer `key` (KIND + address in hex + "-" + its bytes): in dirs[0], the memory folder, where there
    is one and the buffer has at most `bound` bytes (the judge's MEMORY_MAX_BYTES, which it tells its host); else in
    dirs[-1], the disk's."""
    if not key.replace("-", "").isalnum():
        raise ValueError(f"bad buffer key {key!r}")
    size = key.rsplit("-", 1)[-1]
    small = size.isdigit() and int(size) <= bound
    return os.path.join(dirs[0] if small and len(dirs) > 1 else dirs[-1], key + ".bin")


def _tmpfs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(ln.split()[1:3] == [path, "tmpfs"] for ln in f if len(ln.split()) > 2)
    except OSError:
        return False


def sweep() -> list[Path]:
    """Remove the memory folders of judges that are gone (killed before their close); the removed ones."""
    gone = []
    try:
        found = list(Path(SHM).glob(PREFIX + "*"))
    except OSError:
        return gone
    for d in found:
        pid = d.name[len(PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or d.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
        except OSError:
            continue
    return gone


def memory_dir() -> Path | None:
    """A new private folder for this process's buffer files in memory, or None (no tmpfs at /dev/shm, too little room
    there, AGENT_IO_MEMORY=0)."""
    if os.environ.get("AGENT_IO_MEMORY") == "0" or not _tmpfs(SHM):
        return None
    try:
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize < MEMORY_FREE_BYTES:
            return None
        sweep()
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHM))
    except OSError:
        return None
