"""This machine's measured CPU peaks (tools/measure/cpu_peak.py): measured once with the real compiler, cached, and
no figure where they cannot be measured (issue 63: a CPU task's model was given no peak to hold its kernel to)."""

from __future__ import annotations

from tools.measure.cpu_peak import cpu_peak


def test_the_peaks_are_measured_once_cached_and_absent_rather_than_made_up(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_CACHE", str(tmp_path / "cache"))
    p = cpu_peak()
    assert p is not None and "measured on 1 thread" in p.label and "FMA" in p.label
    # a core of any machine this runs on does between 1 and 1000 GFLOP/s of fp32 FMA on one thread, and moves between
    # 1 and 1000 GB/s: the figure is a measurement, not a table's constant or an optimized-away loop
    assert 1e-3 < p.tflops < 1.0 and 1.0 < p.gbps < 1000.0, p
    [cached] = (tmp_path / "cache").glob("cpu-peak-*.json")
    cached.write_text(cached.read_text().replace(str(p.gbps), "123.0"))   # the second call reads the cache
    assert cpu_peak().gbps == 123.0
    assert cpu_peak(cxx=str(tmp_path / "no-such-compiler")) is None
