"""Where a confirmation's parity seconds go (issue 66): the checks a candidate about to be kept pays for (parity
extent "rest", then the wide shape on a GPU), through a real host as tools/judge/judge.py runs them, with the judge's
side under cProfile and each request to the host timed by kind. From the repository root:

    python3 scripts/device/check_split.py TASK_DIR LIB [TOP]      # LIB: a built library (python -m tools.build)

Prints the checks' count and seconds, the host's requests (count, seconds waited), then the TOP (default 40) judge-side
functions by cumulative time. On attention_fwd (H200, BENCHMARKS.md) a kept iteration's 114 checks took 10.9 s, most
listed-shape checks on other seeds 0.3 s each: this says which part of a check that is."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.judge.hostclient import HostClient, Remote  # noqa: E402
from tools.judge.judge import checked_parity  # noqa: E402
from tools.task import load_task  # noqa: E402


class TimedHost(HostClient):
    """The judge's host, each request's wait summed by its op."""

    waits: dict[str, list[float]]

    def ask(self, req: dict) -> dict:
        t0 = time.perf_counter()
        try:
            return super().ask(req)
        finally:
            w = self.waits.setdefault(str(req.get("op")), [0, 0.0])
            w[0] += 1
            w[1] += time.perf_counter() - t0


def main() -> int:
    import torch  # noqa: F401  (first, as the judge: the host forks from a process that has it)
    task = load_task(sys.argv[1])
    mod = task.module()
    task.backend.warm_up()
    host = TimedHost(task.root, Path(tempfile.mkdtemp(prefix="check-split-")))
    host.waits = {}
    try:
        host.ask({"op": "load", "id": "candidate", "path": str(Path(sys.argv[2]).resolve())})
        host.waits.clear()
        remote = Remote(host)
        prof = cProfile.Profile()
        t0 = time.monotonic()
        prof.enable()
        par = checked_parity(task, mod, remote, {"seed": 11, "parity_extent": "rest"})
        prof.disable()
        took = time.monotonic() - t0
    finally:
        host.close()
    print(f"{sys.argv[1]}: parity {par.status.value}, {len(par.checks)} checks in {took:.2f} s "
          f"(checks' own seconds {sum(c.seconds or 0 for c in par.checks):.2f})")
    print("host requests (count, seconds waited):", {k: (n, round(s, 3)) for k, (n, s) in host.waits.items()})
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(int(sys.argv[3]) if len(sys.argv) > 3 else 40)
    print(out.getvalue())
    return 0 if par.status.value == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
