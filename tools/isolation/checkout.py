"""What a candidate may not change in the user's checkout and the fence cannot stop: file modes.

Landlock (tools/isolation/confine.py) refuses every write outside a candidate's scratch directory, but not
chmod or utime: a kernel that finds the checkout (/proc/PID/cwd up the process tree) can change a
user's file mode, which `git status` shows where core.fileMode is on. So the modes of the checkout's
files (git's tracked and untracked-but-not-ignored ones, and their directories) are taken before
each candidate child and compared after it; a mode that changed is put back and named, and the
candidate fails for it. Times are not compared: the user may go on editing files while a run works in
its own worktree, and an edit must not be charged to a candidate (nor undone).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path


def checkout_of(path: Path | str) -> Path | None:
    """The git checkout that holds path (its top level), or None outside one."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


class CheckoutWatch:
    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()
        try:
            out = subprocess.run(["git", "-C", str(self.root), "ls-files", "-z", "-co", "--exclude-standard"],
                                 capture_output=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = b""
        files = {p for p in out.decode(errors="surrogateescape").split("\0") if p}
        dirs = {str(parent) for f in files for parent in Path(f).parents}
        self.paths = sorted(files | dirs)

    def modes(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for p in self.paths:
            try:
                out[p] = stat.S_IMODE(os.lstat(self.root / p).st_mode)
            except OSError:
                out[p] = None
        return out

    def restore(self, before: dict[str, int | None]) -> list[str]:
        """The paths whose mode is no longer what `before` says, each put back; one line each."""
        changed = []
        for p, now in self.modes().items():
            was = before.get(p)
            if was is None or now is None or now == was:
                continue
            try:
                if not os.path.islink(self.root / p):
                    os.chmod(self.root / p, was)
                    changed.append(f"{p} (mode {was:o} -> {now:o}, put back)")
            except OSError as e:
                changed.append(f"{p} (mode {was:o} -> {now:o}, could not put back: {e.strerror})")
        return changed
