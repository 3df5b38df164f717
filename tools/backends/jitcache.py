"""The CUDA driver's JIT cache of the judge's own processes (issue 66).

The driver compiles the PTX a process loads for the GPU it runs on and keeps the result in its JIT cache
($HOME/.nv/ComputeCache, or $CUDA_CACHE_PATH). cuDNN's attention, which torch's scaled_dot_product_attention takes in
fp16 on an H200, compiles its kernels at run time and loads them as PTX: with an empty cache SDPA's first call took
0.56 s and its second shape 0.54 s, with the cache filled 0.09 and 0.06 s (BENCHMARKS.md, issue 66 slice 13). Every
child of the agent runs with HOME in a scratch directory of its own (tools/isolation/scratch.py), so each judge child
paid that again: 1.2-1.3 s of a kept attention iteration's parity (its `values` draws call SDPA to find where the
user's call overflows), and again in a bench that times the reference.

Here the judge's children, which never load a candidate's code, share one cache that the agent keeps:
$AGENT_CACHE/cuda-jit (pch.py cache_root). The candidate's code runs in the judge's host. That host
keeps its own cache in its own scratch directory: Scratch.env() sets CUDA_CACHE_PATH there, so the judge's path never
reaches it. Its Landlock fence (tools/isolation/confine.py) also refuses any write outside that directory. So what
the judge's references load was compiled by the judge's own processes. Where the kernel has no Landlock
(confine.describe() says so) nothing would keep a candidate from writing into the shared cache, and the judge's
children keep theirs in their scratch directories, as before, unless AGENT_JIT_CACHE=1. AGENT_JIT_CACHE=0 turns the
sharing off; a path puts the shared cache there.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "AGENT_JIT_CACHE"


def shared_dir() -> Path | None:
    """Where the judge's children keep the driver's JIT cache, or None: AGENT_JIT_CACHE=0, or unset on a machine
    whose kernel has no Landlock (no fence keeps a candidate's process from writing into it; AGENT_JIT_CACHE=1 shares
    it there all the same). Read in the agent's process (a child's XDG_CACHE_HOME is its scratch directory)."""
    from tools.backends.pch import cache_root
    from tools.isolation.confine import landlock_abi
    named = os.environ.get(ENV, "").strip()
    if named.lower() in ("0", "off", "no", "false") or (not named and landlock_abi() == 0):
        return None
    return Path(named) if named and named.lower() not in ("1", "on", "yes", "true") else cache_root() / "cuda-jit"


def judge_env() -> dict[str, str]:
    """The environment a judge child gets beside its scratch directory's: CUDA_CACHE_PATH at the shared cache (made
    here where missing). Empty where sharing is off or the folder cannot be made: the child then keeps its cache in
    its scratch directory, as every other child does."""
    d = shared_dir()
    if d is None:
        return {}
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    return {"CUDA_CACHE_PATH": str(d)}
