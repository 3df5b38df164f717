"""The wide shape (issue 40): a CUDA candidate about to be kept, called once on a shape whose largest tensor holds
more than 2^31 elements (tools/measure/ranges.py wide_shape), the judge's reference compared with it.

A model rewriting a kernel keeps an element offset in `int` by accident (`row * N`, `(b * H + h) * S * D`): right
on every shape under 2^31 elements, an illegal address or another row's data past it. The probe is one call:
the inputs are made in the judge and in the host from the same seed (their digests compared, no bytes travel:
tools/judge/hostclient.py Remote.mirror), the output is poisoned in the host (its guards too) and comes back as a
file, the reference runs here after the host has given its buffers back, and both processes' memory is freed
before the bench. It runs where parity's [dims] extremes run (`agent check`'s full parity, the check before a
keep), on a GPU, when the GPU's free memory holds both processes' copies; otherwise it is skipped and the parity
message says why (a skip is never a pass).
"""

from __future__ import annotations

import time

from tools.judge.hostclient import HostFailed, Remote
from tools.measure.ranges import INT32_PAST

MARGIN = 1 << 30   # bytes left free beside the host's copies (its context's own allocations, the driver's)


def _oom(e: BaseException) -> bool:
    return "OutOfMemoryError" in type(e).__name__ or "out of memory" in str(e).lower()


def check_wide(task, mod, remote: Remote, seed: int, past: int | None = None):
    """(a ShapeCheck, or None where the probe did not run, and the line that says what happened). The GPU memory
    it took, here and in the host, is given back before it returns. `past`: the largest tensor's elements at least
    (2^31 + 1; a CPU test takes a smaller one: the same steps, on the CPU's memory)."""
    import torch
    try:
        return _probe(task, mod, remote, seed, past or INT32_PAST)
    except HostFailed as e:   # the host died in the call (a fault): the candidate's
        from tools.measure.ranges import tensor_elements, wide_shape
        from tools.results import ShapeCheck
        from tools.task import shape_label
        shape = wide_shape(task.spec, mod, past or INT32_PAST) or {}
        return ShapeCheck(shape=shape, label="wide " + shape_label(shape), dist=task.spec.distributions[0], seed=seed,
                          hidden=True, ok=False, status=e.status, message=f"wide {shape_label(shape)}: {e}"), ""
    finally:
        if task.backend.gpu:
            torch.cuda.empty_cache()


def _probe(task, mod, remote: Remote, seed: int, past: int):
    import torch

    from tools.measure.buffers import Buffers
    from tools.measure.compare import compare, describe, tolerance_for
    from tools.measure.ranges import tensor_elements, wide_shape
    from tools.results import ShapeCheck
    from tools.task import shape_label
    from tools.task_messages import make_inputs
    t0 = time.monotonic()
    shape = wide_shape(task.spec, mod, past)
    if shape is None:
        return None, "the 2^31-element shape: not run (task.toml's [dims] maxima do not reach it)"
    label, dist = "wide " + shape_label(shape), task.spec.distributions[0]
    count = tensor_elements(mod, shape, task.spec.dims)
    device = task.backend.torch_device
    bufs, inputs, sent = Buffers(torch), None, []

    def skipped(why: str):
        return None, f"the 2^31-element shape {shape_label(shape)}: not run ({why})"

    try:
        try:
            inputs = make_inputs(mod, shape, seed, device, dist)
            out = bufs.out(0, mod.empty_output(shape, *inputs))
        except Exception as e:   # the task's, not the candidate's
            return skipped("the judge's inputs do not fit in the GPU's memory" if _oom(e) else
                           f"task.py's make_inputs or empty_output raised {type(e).__name__}: {str(e)[:200]}")
        tensors = [t for t in (*inputs, out) if isinstance(t, torch.Tensor)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        # the host's copies, and its make_inputs' largest temporary (an fp32 draw of the largest tensor)
        need = size + 4 * max(t.numel() for t in tensors) + MARGIN
        if task.backend.gpu:
            torch.cuda.empty_cache()   # this process's make_inputs temporaries back to the device first
        free = torch.cuda.mem_get_info()[0] if task.backend.gpu else need
        if free < need:
            return skipped(f"the host needs about {need / 2**30:.1f} GiB, the GPU has {free / 2**30:.1f} GiB free")
        phases = {"inputs": time.monotonic() - t0}
        try:
            sent = [(t, "i") for t in inputs if isinstance(t, torch.Tensor)] + [(out, "o")]
            remote.mirror(shape, [inputs], [seed], dist)
            task.backend.sync()
            t1 = time.monotonic()
            phases["inputs in the host"] = t1 - t0 - phases["inputs"]
            remote.calls("candidate", shape, [(out, inputs)], check=False)
            phases["the call, its output back"] = time.monotonic() - t1
        except RuntimeError as e:   # the host's answer: the task's run raised (a CUDA error), or memory ran out
            if _oom(e):
                return skipped("the host ran out of GPU memory")
            msg = " ".join(str(e).split())[:400]
            return ShapeCheck(shape=shape, label=label, dist=dist, seed=seed, hidden=True, ok=False, status="error",
                              message=f"{label}: {msg} (its largest tensor holds {count:,} elements, past 2^31: "
                                      "where a 32-bit element offset wraps)",
                              seconds=round(time.monotonic() - t0, 3)), ""
        remote.drop(sent)
        sent = []
        hit = bufs.guard_hit(0)
        if hit is not None:
            return ShapeCheck(shape=shape, label=label, dist=dist, seed=seed, hidden=True, ok=False,
                              status="out_of_bounds", seconds=round(time.monotonic() - t0, 3),
                              message=f"{label}: the kernel wrote outside its output tensor (element offset {hit}; "
                                      f"the output has {out.numel()} elements)"), ""
        t1 = time.monotonic()
        try:
            exp = mod.reference(shape, *inputs)
        except Exception as e:   # the task's, not the candidate's
            return skipped("the reference does not fit in the GPU's memory" if _oom(e) else
                           f"task.py's reference raised {type(e).__name__}: {str(e)[:200]}")
        atol, rtol = tolerance_for(task, out)
        c = compare(out, exp, atol, rtol)
        del exp
        phases["reference, compare"] = time.monotonic() - t1
        ok = c["status"] == "ok"
        sc = ShapeCheck(shape=shape, label=label, dist=dist, seed=seed, hidden=True, ok=ok,
                        seconds=round(time.monotonic() - t0, 3),
                        **{k: v for k, v in c.items() if k in ShapeCheck.model_fields and k not in ("ok", "message")})
        if not ok:
            sc.message = describe(label, dist, c, atol, rtol)
        spent = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        return sc, f"the 2^31-element shape {shape_label(shape)} ok ({sc.seconds:.1f}s: {spent})" if ok else ""
    finally:
        if sent:
            try:
                remote.drop(sent)
            except (HostFailed, RuntimeError):   # a dead host holds nothing; a poisoned context ends with the check
                pass
