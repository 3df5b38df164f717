"""A scratch directory per candidate process.

Every child that loads a candidate's library starts in its own directory, made for it under the
run's folder (runs/RUN/scratch/, never the user's checkout nor the run's worktree), with HOME, TMPDIR
and PWD pointing into it: a kernel that writes `./matmul_debug.log`, `~/.cache/...` or a temporary
file writes there. When the child has ended, what it left is listed (path and size, for the
iteration's record) and the directory is removed with everything in it.

This decides where relative and home-relative writes land; it does not stop a write by absolute path
(the user's checkout found through /proc, a file beside the library): that is the fence's job.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from tools.results import ScratchFile

MAX_LISTED = 50     # a record lists at most this many files of one process (the rest are counted)
_LOG: list[ScratchFile] = []    # what the closed scratch directories held, until drain() takes it


def drain() -> list[ScratchFile]:
    """The files listed by every scratch directory closed since the last drain (in this process)."""
    out = list(_LOG)
    _LOG.clear()
    return out


def record(files: list[ScratchFile]) -> None:
    """Files a child listed for a scratch directory it made and closed itself (the judge, for its
    host's): into the same log as this process's own."""
    _LOG.extend(files)


class Scratch:
    def __init__(self, root: Path | str | None, label: str):
        """A new directory root/LABEL-XXXXXX (root None: the system's temporary directory)."""
        base = Path(root) if root is not None else Path(tempfile.gettempdir()) / "kernel-agent-scratch"
        self.dir = (base / f"{label}-{secrets.token_hex(3)}").resolve()
        (self.dir / "tmp").mkdir(parents=True)
        self.label = label
        self.files: list[ScratchFile] | None = None

    def env(self) -> dict[str, str]:
        d = str(self.dir)
        # the CUDA driver's JIT cache where HOME would put it, named: a judge's shared one (tools/backends/jitcache.py)
        # is in its environment, and a host forked from it must not inherit it
        return {"HOME": d, "TMPDIR": str(self.dir / "tmp"), "PWD": d, "OLDPWD": d,
                "XDG_CACHE_HOME": str(self.dir / ".cache"), "AGENT_SCRATCH": d,
                "CUDA_CACHE_PATH": str(self.dir / ".nv" / "ComputeCache")}

    def close(self) -> list[ScratchFile]:
        """List what the process left (relative paths, sizes; the empty tmp/ is not listed), then
        remove the directory. Idempotent: a second call returns the first listing."""
        if self.files is not None:
            return self.files
        found: list[ScratchFile] = []
        for dirpath, _dirs, names in os.walk(self.dir):
            for name in names:
                p = Path(dirpath) / name
                try:
                    size = p.lstat().st_size
                except OSError:
                    continue
                found.append(ScratchFile(path=p.relative_to(self.dir).as_posix(), bytes=size, process=self.label))
        found.sort(key=lambda f: f.path)
        if len(found) > MAX_LISTED:
            rest = found[MAX_LISTED:]
            found = found[:MAX_LISTED] + [ScratchFile(path=f"... and {len(rest)} more files", process=self.label,
                                                      bytes=sum(f.bytes for f in rest))]
        shutil.rmtree(self.dir, ignore_errors=True)
        self.files = found
        _LOG.extend(found)
        return found

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def process_dir(prefix: str) -> Path:
    """A folder for one command's own build (`agent profile`, the instruments run alone without --lib), removed when
    the process ends: its library is used only in this process's life (each call left one in /tmp before)."""
    import atexit
    where = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return where
