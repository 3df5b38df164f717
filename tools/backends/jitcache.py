"""The CUDA driver's JIT cache of the judge's own processes (issue 66).

The driver compiles the PTX a process loads for the GPU it runs on and keeps the result in its JIT cache
($HOME/.nv/ComputeCache, or $CUDA_CACHE_PATH). cuDNN's attention, which torch's scaled_dot_product_attention takes in
fp16 on an H200, compiles its kernels at run time and loads them as PTX: with an empty cache SDPA's first call took
0.56 s and its second shape 0.54 s, with the cache filled 0.09 and 0.06 s (BENCHMARKS.md, issue 66 slice 13). Every
child of the agent runs with HOME in a scratch directory of its own (tools/isolation/scratch.py), so each judge child
paid that again: 1.0-1.2 s of attention's parity before a keep (scripts/device/parity_costs.py; its `values` draws call
SDPA to find where the user's call overflows), and again in a bench that times the reference.

The judge's children, which never load a candidate's code, share one cache: $AGENT_CACHE/cuda-jit
(pch.py cache_root), or the folder AGENT_JIT_CACHE names; AGENT_JIT_CACHE=0 turns sharing off. Every process that
loads a candidate's code keeps its own cache in its scratch directory (Scratch.env() sets CUDA_CACHE_PATH there, so
the judge's path never reaches it) and has put a Landlock fence (tools/isolation/confine.py) on itself that refuses
writes outside that directory: the judge's hosts, the launch check's plan child, the Nsight Compute pass's target
(tools/profile/target.py) and KernelBench's children. A task's module, which the judge imports, cannot be editable
(tools/task.py). Without Landlock nothing keeps a candidate out of a shared folder, so there is no sharing.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "AGENT_JIT_CACHE"


def shared_dir() -> Path | None:
    """Where the judge's children keep the driver's JIT cache, or None: AGENT_JIT_CACHE=0 (or off, no, false), or a
    machine whose kernel has no Landlock (no fence keeps a candidate out of it). Unset or 1: $AGENT_CACHE/cuda-jit;
    else the path it names. Read in the agent's process (a child's XDG_CACHE_HOME and working directory are its
    scratch directory's: a relative path is made absolute here)."""
    from tools.backends.pch import cache_root
    from tools.isolation.confine import landlock_abi
    named = os.environ.get(ENV, "").strip()
    if named.lower() in ("0", "off", "no", "false") or landlock_abi() == 0:
        return None
    if not named or named.lower() in ("1", "on", "yes", "true"):
        return cache_root().expanduser().resolve() / "cuda-jit"
    return Path(named).expanduser().resolve()


def judge_env() -> dict[str, str]:
    """The environment a judge child gets beside its scratch directory's: CUDA_CACHE_PATH at the shared cache (made
    here where missing; a CPU task's judge never writes there). Empty where sharing is off or the folder cannot be
    made: the child then keeps its cache in its scratch directory, as every other child does."""
    d = shared_dir()
    if d is None:
        return {}
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    return {"CUDA_CACHE_PATH": str(d)}
