"""The bench's runs in the kernel's host (tools/measure/bench.py's LocalRuns interface): HostRuns times the arms
with the host's clock and holds each burst to the judge's own (RemoteClock, tools.measure.stats.outside_check)."""

from __future__ import annotations

import weakref

from tools.judge.hostclient import HostClient, HostFailed, Remote
from tools.measure.stats import outside_check


class RemoteClock:
    """tools.backends.clocks' interface over the host's clock, each burst also timed here, from outside."""

    def __init__(self, host: HostClient):
        self.host = host
        self.bursts: list[tuple[str, float, float]] = []    # (arm, ms the host reported, ms on this clock)

    def rep_cost(self, arm: str, n: int = 3) -> float:
        ms = self.host.ask({"op": "cost", "arm": arm}).get("ms")
        if not isinstance(ms, (int, float)) or not ms >= 0:
            raise HostFailed("error", f"the host answered a rep cost of {ms!r}")
        return float(ms)

    def run(self, arm: str, n: int, offset: int = 0, one_thread: bool = False, before=None) -> list[float]:
        """n timed reps of the arm in the host; `before`, a tools.measure.rounds.Refresh, is made there from its
        seed on the host's sets."""
        import math
        import time
        t0 = time.perf_counter()
        ms = self.host.ask({"op": "time", "arm": arm, "n": n, "offset": offset, "one_thread": one_thread,
                            "refresh": getattr(before, "seed", None)}).get("ms")
        outside = (time.perf_counter() - t0) * 1e3
        if (not isinstance(ms, list) or len(ms) != n
                or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in ms)):
            raise HostFailed("error", f"the host answered {str(ms)[:80]} for {n} timed reps")
        self.bursts.append((arm, float(sum(ms)), outside))
        return [float(x) for x in ms]

    def sync(self) -> None:
        pass


class HostRuns:
    """tools.measure.bench's runs (see LocalRuns) in the host: the candidate and, if loaded, the baseline."""

    def __init__(self, remote: Remote, shape: dict, baseline: bool):
        self.remote, self.shape, self.baseline = remote, shape, baseline
        self.clock = RemoteClock(remote.host)

    def arms(self, sets: list[tuple], outs: list, with_reference: bool) -> list[tuple[str, str]]:
        labels = [("candidate", "candidate")] + ([("baseline", "baseline")] if self.baseline else []) \
            + ([("reference", None)] if with_reference else [])
        self._timed(sets, outs, labels)
        return [(label, label) for label, _ in labels]

    def _timed(self, sets: list[tuple], outs: list, labels: list[tuple]) -> None:
        """Send the buffers the host lacks and make `labels` (label, library id or None for the
        reference) its timed arms over them."""
        r = self.remote
        put = r.put([(t, "i") for s in sets for t in s] + [(r._out(o)[0], "o") for o in outs])
        r.host.ask({"op": "call", "shape": self.shape, "put": put, "calls": [], "get": []})
        r.host.ask({"op": "arms", "shape": self.shape, "arms": labels, "outs": [r._out(o)[1] for o in outs],
                    "sets": [[{"key": r._key(t, "i"), "shape": list(t.shape)} for t in s] for s in sets]})

    def calls(self, pairs: list[tuple], transfer: bool = True) -> tuple[float, float, float | None]:
        return self.remote.calls("candidate", self.shape, pairs, transfer)

    def together(self, calls: list[tuple]) -> list[int]:
        """The candidate on each (thread, shape, out, inputs), thread 0's and 1's in two threads of the host at
        once (on a GPU each on a stream of its own). The outputs come back here; returns the calls whose work
        outlived their stream, as the host says (the outputs it sends are what that stream's synchronize saw)."""
        self.remote.calls("candidate", self.shape, [(o, i) for _, _, o, i in calls], threads=2,
                          shapes=[s for _, s, _, _ in calls], thread_of=[t for t, _, _, _ in calls])
        return self.remote.late

    def threads(self) -> int | None:
        """torch's CPU threads in the host, as it said when it started."""
        return self.remote.host.info.get("threads")

    def one_thread(self, arm: str, n: int) -> list[float]:
        """The arm timed n times in the host with torch on one CPU thread (tools/measure/refcheck.py)."""
        return self.clock.run(arm, n, one_thread=True)

    def mirror(self, sets: list[tuple], seeds: list[int], dist: str) -> None:
        """The timed sets hold new values here (tools/measure/rounds.py, from make_inputs with `seeds`): the host
        makes the same (Remote.mirror)."""
        self.remote.mirror(self.shape, sets, seeds, dist)

    def refreshed(self, sets: list[tuple], seed: int, offset: int, n: int) -> None:
        """The host traded values in its sets before each rep of a burst (tools.measure.rounds.Refresh): the
        same here, replayed at once, so that this process's sets are the host's again (no bytes travel)."""
        from tools.measure.rounds import replay
        replay(sets, seed, offset, n)
        r = self.remote
        for s in sets:
            for t in s:
                key = r._key(t, "i")
                if key in r.synced:
                    r.synced[key] = (weakref.ref(t), t._version)

    def poison_outs(self, outs: list) -> None:
        """Poison the timed output buffers in the host (SpotCheck: before every library arm's burst)."""
        self.remote.host.ask({"op": "poison", "outs": [self.remote._out(o)[1] for o in outs]})

    def fetch_outs(self, outs: list) -> None:
        """The timed output buffers as the host holds them now, into the judge's tensors."""
        r = self.remote
        flats = {}
        for o in outs:
            flat, d = r._out(o)
            flats[d["key"]] = flat
        ans = r.host.ask({"op": "call", "shape": self.shape, "put": [], "calls": [], "get": list(flats), "ipc": r.ipc})
        r.bring(ans, flats)

    def time_pairs(self, sets: list[tuple], outs: list, n: int) -> list[float]:
        """The candidate alone on these buffers, timed by the host's clock as a bench rep is (after the
        bench: the host's timed arms are replaced)."""
        self._timed(sets, outs, [("candidate", "candidate")])
        return RemoteClock(self.remote.host).run("candidate", n)

    def clock_check(self, claimed: set[str] | None = None) -> str | None:
        return outside_check(self.clock.bursts, claimed=claimed)

    def clock_restart(self) -> None:
        """Forget the bursts timed so far: the bench is timed again, and held to its own."""
        self.clock.bursts.clear()
