"""Two threads calling the candidate at once (the bench's reentrancy probe, tools/measure/probes.py reentrant, and
the kernel's host, tools/judge/host.py): released together, on a GPU each on a blocking CUDA stream of its own,
started by one gate so that their calls run side by side; which outputs changed after their own stream's
synchronize (work that outlived the caller's stream)."""

from __future__ import annotations

import threading
from typing import Any, Callable

GATE_CYCLES = 40_000_000    # the spin that holds both streams while the threads queue their calls (~20 ms at 2 GHz)


def two_threads(work: tuple[list[Callable[[], None]], list[Callable[[], None]]], outs: tuple[list, list] | None = None
                ) -> list[tuple[int, int]]:
    """Two threads released together, thread t making work[t] back to back; the first exception either
    raised is raised here. With `outs` (a CUDA task: thread t's outputs), each thread calls on a CUDA stream of its
    own (torch's current stream is per thread: the task's `run` launches on it; a blocking one, which a launch on the
    legacy default stream orders itself with, as on the default stream its author wrote it for) and, after that stream's own
    synchronize, copies its outputs (on the card), as a caller who reads them on that stream sees them; after a device-wide
    synchronize each output is put back to that copy (so the judge checks what the caller's stream saw), and the
    (thread, index) of every output that changed in between is returned: work that outlived the caller's stream."""
    gate, errors = threading.Barrier(2), []
    seen: dict[tuple[int, int], Any] = {}

    def run(t, items):
        try:
            gate.wait(timeout=60)
            if outs is None:
                for fn in items:
                    fn()
                return
            import torch
            stream = streams[t]
            stream.wait_event(start)     # held until the gate opens: both threads' calls queued by then
            with torch.cuda.stream(stream):
                for fn in items:
                    fn()
            stream.synchronize()
            for i, o in enumerate(outs[t]):
                # a copy on the card, where a copy to host memory was made (same stream, same place in its order:
                # what the caller's stream saw): the probe's reads back cost 0.3-0.5 s a keep on an H200 (issue 66)
                seen[(t, i)] = o.detach().clone()
        except BaseException as e:  # noqa: BLE001  (the kernel's or the task's error: raised below)
            errors.append(e)
            gate.abort()
    if outs is not None:
        # the gate: one spin kernel on a stream of its own, then an event both threads' streams wait on, so that their
        # calls, queued while it spins, start at the same moment on the GPU and run side by side (a spin per stream
        # started each when its thread got there: short kernels of one stream ran between the other's, and a
        # split-row softmax with a static per-row counter was kept: verify_gpu, H200)
        import torch

        from tools.backends.device import BlockingStreams
        with BlockingStreams(3) as (*streams, gate_stream):
            start = torch.cuda.Event()
            with torch.cuda.stream(gate_stream):
                torch.cuda._sleep(GATE_CYCLES)
            start.record(gate_stream)
            _join(run, work)
    else:
        _join(run, work)
    if errors:
        raise errors[0]
    if outs is None:
        return []
    import torch
    torch.cuda.synchronize()
    late = []
    for (t, i), copy in sorted(seen.items()):
        o = outs[t][i]
        if not torch.equal(o.detach().view(-1).view(torch.uint8), copy.view(-1).view(torch.uint8)):
            late.append((t, i))
            o.copy_(copy)
    return late


def _join(run, work) -> None:
    threads = [threading.Thread(target=run, args=(t, items), daemon=True) for t, items in enumerate(work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def late_calls(thread_of: list[int], late: list[tuple[int, int]]) -> list[int]:
    """two_threads' (thread, index) pairs as positions in the list of calls whose threads are `thread_of`."""
    mine = [[n for n, t in enumerate(thread_of) if t == want] for want in (0, 1)]
    return [mine[t][i] for t, i in late]
