"""The keep rule's error rates through `agent optimize`: `python scripts/keep_rule_rates.py RUNS BUSY [NOOPS]`.

Each of RUNS runs is a fresh user repository (tests/fixtures/keep_rule.py): NOOPS no-op candidates (a comment: the
same binary) with the honest 1.13x change in their middle, BUSY spinning processes beside the run. Prints each run's
outcomes and, over all runs: how often the honest change was kept, inconclusive or called not faster; how often a
no-op was kept (a false keep) or inconclusive; how many benches were re-benched; and what the rule before issue 63
(no re-bench: a first bench or a confirmation whose interval reaches 1 is "not faster") would have decided on the
same benches. VERIFICATION.md ("The keep rule") quotes it."""

from __future__ import annotations

import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.records.store import read_iterations  # noqa: E402
from tests.fixtures.keep_rule import busy, honest, make_repo, noop, optimize  # noqa: E402
from tests.userrepo import agent  # noqa: E402
from tools.measure.bench import never_kept  # noqa: E402

GAIN = 0.02


def old_rule_keeps(r) -> bool:
    """The rule before re-benches, on the record's first benches: the first bench past the gain with its interval
    above 1, and a confirmation above 1 whose median with the first's clears the gain."""
    first = (r.bench_undecided or [r.bench])[0]
    conf = (r.confirm_undecided or [r.confirm])[0]
    ci = first.speedup_vs_baseline if first is not None else None
    if ci is None or never_kept(ci, GAIN) is not None:
        return False
    again = conf.speedup_vs_baseline if conf is not None else None
    return again is not None and again.low > 1.0 and math.sqrt(again.median * ci.median) >= 1.0 + GAIN


def main() -> None:
    runs, load = int(sys.argv[1]), int(sys.argv[2])
    noops = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    half = noops // 2
    props = [noop(i) for i in range(1, half + 1)] + [honest()] + [noop(i) for i in range(half + 1, noops + 1)]
    tally: dict[str, Counter] = {"honest": Counter(), "no-op": Counter(), "honest, old rule": Counter(),
                                 "no-op, old rule": Counter()}
    rebenched = 0
    for n in range(runs):
        with tempfile.TemporaryDirectory() as d, busy(load):
            run = optimize(make_repo(Path(d) / "user"), props, agent)
            recs = read_iterations(run)
        line = []
        for r in recs:
            kind = "honest" if r.iteration == half + 1 else "no-op"
            tally[kind][r.outcome.value] += 1
            tally[f"{kind}, old rule"]["kept" if old_rule_keeps(r) else "not kept"] += 1
            rebenched += len(r.bench_undecided) + len(r.confirm_undecided)
            line.append(("H:" if kind == "honest" else "") + r.outcome.value[:4]
                        + ("+" * (len(r.bench_undecided) + len(r.confirm_undecided))))
        print(f"run {n + 1}/{runs}, {load} busy: {' '.join(line)}", flush=True)
    for kind, c in tally.items():
        print(f"{kind}: {dict(c)}")
    print(f"re-benches: {rebenched} over {runs * len(props)} candidates")


if __name__ == "__main__":
    main()
