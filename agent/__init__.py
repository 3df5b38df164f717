"""kernel-agent: a profile-guided, self-verifying optimization loop for CUDA kernels."""

import os as _os

# GitPython raises at import when no git executable is on PATH; that would take down even
# `agent doctor`, whose job is to say that git is missing. Git commands still fail clearly later.
_os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

__version__ = "0.1.0"
