"""Ctrl-C around the steps that must not be cut in half."""

from __future__ import annotations

import signal


class DeferSigint:
    """Hold SIGINT for the duration of the block; `hit` says whether one arrived (main thread only).

    SIGINT is also blocked at the OS level, so that the git children of the block (the keep's amend, a
    user's post-commit hook) inherit the mask and are not killed mid-commit by a terminal's Ctrl-C,
    which goes to the whole foreground process group.
    """

    def __enter__(self) -> "DeferSigint":
        self.hit, self.prev = False, None
        try:
            self.prev = signal.signal(signal.SIGINT, self._held)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        except (ValueError, AttributeError):   # not the main thread / no sigmask: nothing to defer
            pass
        return self

    def _held(self, signum, frame) -> None:
        self.hit = True

    def __exit__(self, *exc) -> bool:
        if self.prev is not None:
            if signal.SIGINT in signal.sigpending():
                self.hit = True
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})   # a pending one goes to _held
            signal.signal(signal.SIGINT, self.prev)
        return False
