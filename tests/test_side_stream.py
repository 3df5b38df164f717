"""The side-stream probe (tools/measure/probes.py) holds a burst's wall time to events on the caller's stream taken
around the same calls, as well as to the bench's events. An honest softmax was refused on the bench's figure alone
(issue 40: "events say 59.4 us per call but back-to-back calls with a device-wide sync take 122.5 us each"), right
after another candidate's run: a GPU shared with another context, or changing clocks, slows the burst and its own
stream's span alike; work on a stream of the kernel's own leaves the span and not the wall. The rule's both
directions here with the figures of that refusal; on the device, scripts/device/side_stream_neighbour.py and
scripts/device/gpu_outlives.py. A one-off stall outside one burst's span (an honest sweep configuration on an H100:
80.6 us of span, 200.1 us of wall) is not the kernel's: the probe takes up to three bursts, each must show the gap."""

from __future__ import annotations

from types import SimpleNamespace

from tools.measure.probes import Probe, side_stream


def _probe(wall_us: float | list, span_us: float | None | list, bench_us: float = 59.4, n_expected: int = 841) -> Probe:
    """A probe whose bursts answer wall_us and span_us per call (lists: burst by burst, the last repeated)."""
    walls = list(wall_us) if isinstance(wall_us, list) else [wall_us]
    spans = list(span_us) if isinstance(span_us, list) else [span_us]
    burst = iter(range(1000))

    def calls(pairs, transfer=True):
        n, k = len(pairs), next(burst)
        assert n == n_expected and transfer is False
        wall, span = walls[min(k, len(walls) - 1)], spans[min(k, len(spans) - 1)]
        return n * 5e-6, n * wall * 1e-6, (None if span is None else n * span * 1e-6)
    task = SimpleNamespace(backend=SimpleNamespace(gpu=True))
    return Probe(task=task, mod=None, shape={"M": 8192, "N": 4096}, device="cuda", device_name="NVIDIA H100",
                 calls=calls, sets=[("x",)], outs=["y"], cand_ms=bench_us / 1e3, flops=None, nbytes=None)


def test_a_burst_slowed_with_its_own_stream_is_not_work_outside_the_stream():
    # the refusal's figures, the stream's span as slow as the wall: another context time-slicing the GPU
    assert side_stream(_probe(wall_us=122.5, span_us=118.0)) is None
    # no span from the host (a CPU task's answer, or an old host): the bench's events alone, as before
    assert "work runs outside the timed stream" in (side_stream(_probe(wall_us=122.5, span_us=None)) or "")


def test_work_on_a_stream_of_the_kernels_own_is_still_caught():
    # the caller's stream sees a launch and nothing else; the device-wide sync waits for the side stream's work
    why = side_stream(_probe(wall_us=122.5, span_us=3.0))
    assert why is not None and "59.4 us per call (the bench) and 3.0 us (around these calls" in why
    assert "122.5 us each (the closest of 3 bursts): work runs outside the timed stream" in why
    # half the work on the side: the wall 2.1x the span and the bench
    assert side_stream(_probe(wall_us=125.0, span_us=59.0)) is not None
    # honest and unhurried: nothing
    assert side_stream(_probe(wall_us=61.0, span_us=59.0)) is None


def test_a_stall_in_one_burst_is_not_refused_and_a_gap_in_every_burst_is():
    # the H100 sweep's figures (bench 79.4 us, 630 calls a burst): one burst stalled, the next as the span says
    assert side_stream(_probe(wall_us=[200.1, 81.0], span_us=80.6, bench_us=79.4, n_expected=629)) is None
    assert side_stream(_probe(wall_us=[200.1, 190.0, 81.0], span_us=80.6, bench_us=79.4, n_expected=629)) is None
    # the side stream's gap in all three bursts: refused, with the closest burst's figures
    why = side_stream(_probe(wall_us=[130.0, 122.5, 127.0], span_us=3.0))
    assert why is not None and "122.5 us each (the closest of 3 bursts)" in why, why
