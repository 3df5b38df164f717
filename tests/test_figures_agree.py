"""The first hour replayed (issue 37): `agent check`, `agent optimize`, `agent show`, `agent report`,
`agent runs` and the kept commit's message, in a user's repository, and every figure against the
reference they print must agree, or say why there is none. A newcomer's run printed 3.593x in
check, 7.982x in a commit message and 0.087x at the end for one kernel against `torch.softmax`.

What agrees with what (each a measurement taken interleaved with what it is compared to):
- check's figure and the run's setup figure are both the initial kernel against the reference,
  timed in two benches: within 2x of each other (the issue's line: off by more than 2x);
- the run's end, `show`, `report.md` and `runs` print one figure, from one measurement;
- that figure is the best's speedup over the initial times the initial's over the reference,
  within 2x; the times shown beside it divide into it (same bench);
- a commit message carries a figure against the reference only from its own confirmation bench, which timed the
  reference beside it (issue 63), and the prompt's times and figure come from one bench."""

from __future__ import annotations

import json
import re

import pytest

from tests.userrepo import agent, git, make_user_repo

FIG = r"([\d.]+)x \[([\d.]+), ([\d.]+)\]"


def _ref_figure(text: str) -> str:
    """The best's figure against the reference as printed: 'A [L, H]', or 'unstable' / '-'."""
    m = re.search(FIG + r" vs reference", text)
    if m:
        return m.group(0)
    assert re.search(r"(- vs reference|unstable)", text), text[-3000:]
    return "none"


def _num(fig: str) -> tuple[float, float, float]:
    m = re.match(FIG, fig)
    assert m, fig
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def _us(text: str) -> float:
    """'236.6 us' or '1.019 ms' (agent/records/figures.py us()) in microseconds."""
    value, unit = text.split()
    return float(value) * (1e3 if unit == "ms" else 1.0)


@pytest.mark.slow        # a whole run, from agent check to the kept commit
def test_every_figure_against_the_reference_agrees_from_check_to_the_commit(tmp_path):
    root = make_user_repo(tmp_path / "user")
    r = agent(root, "check", "kernels/matmul_cpu", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    bench = json.loads(r.stdout)["bench"][0]
    check_ci = bench["speedup_vs_reference_ci"]

    r = agent(root, "optimize", "kernels/matmul_cpu", "--iters", "3", "--target", "1.5x", "--proposer", "heuristic")
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join((r.stderr + r.stdout).split())   # the progress on stderr, the summary on stdout
    run_id = re.search(r"agent show (\S+)", out).group(1)
    setup = re.search(r"initial: [\d.]+ us, reference [\d.]+ us: ([\d.]+)x \[([\d.]+), ([\d.]+)\] vs reference", out)
    summary = re.search(r"speedup: (.*?\)) ", out).group(1)
    # agent/records/figures.py us(): a time under 1 ms in us, from 1 ms in ms (a slow machine's initial kernel crosses it)
    t = r"[\d.]+ (?:us|ms)"
    best_line = re.search(rf"best: ({t}) \(initial ({t}), reference ({t}|unstable); the confirmation bench\)", out)
    assert best_line, out   # the best was kept and confirmed: its times come from the confirmation bench
    end_fig = _ref_figure(summary)

    # the same figure wherever the run's result is shown
    show = " ".join(agent(root, "show", run_id).stdout.split())
    assert _ref_figure(show.split("speedup", 1)[1]) == end_fig, show
    r = agent(root, "report", run_id)
    assert r.returncode == 0, r.stderr
    md = (root / "runs" / run_id / "report.md").read_text()
    assert _ref_figure(re.search(r"\*\*Result\*\*: (.*)", md).group(1)) == end_fig, md
    runs = agent(root, "runs").stdout
    row = next(ln for ln in runs.splitlines() if ln.startswith(run_id))
    vs_ref_cell = row.split()[8]   # run task date time proposer iters kept vs-initial vs-ref status
    if end_fig != "none":   # the same figure, to the table's two decimals
        assert abs(float(vs_ref_cell.rstrip("x")) - _num(end_fig)[0]) <= 0.0051, (row, end_fig)
    else:
        assert vs_ref_cell == "-", row

    # the medians beside the figures come from the same bench and divide into them
    best_us, init_us = _us(best_line.group(1)), _us(best_line.group(2))
    vi, lo, hi = _num(re.search(FIG + r" vs initial", summary).group(0))
    assert lo / 1.5 <= init_us / best_us <= hi * 1.5, (init_us / best_us, summary)

    # where a figure is missing, the output says why (tools/measure/bench.py: rounds that disagreed twice), and
    # prints no number in its place
    if check_ci is None:
        assert "vs reference unstable" in bench["message"], bench["message"]
        assert bench["speedup_vs_reference"] is None and not re.search(FIG + r" vs reference", bench["message"]), bench
    if setup is None:
        assert "reference unstable: no figure against it" in out, out
        assert not re.search(r"initial: [\d.]+ us, reference [\d.]+ us", out), out
    assert (best_line.group(3) == "unstable") == (end_fig == "none"), (best_line.group(0), end_fig)
    f_end = _num(end_fig)[0] if end_fig != "none" else None
    if f_end is not None:   # the best's time and the reference's, from the same bench
        assert 0.5 <= f_end / (_us(best_line.group(3)) / best_us) <= 2.0, (f_end, best_line.group(0))
    if setup is not None and check_ci is not None:
        # check and the run's setup time the same (initial) kernel against the reference
        assert 0.5 <= check_ci["median"] / float(setup.group(1)) <= 2.0, (check_ci, setup.group(0))
    if setup is not None and f_end is not None:
        # the end: the best over the initial, times the initial over the reference
        assert 0.5 <= f_end / (vi * float(setup.group(1))) <= 2.0, (f_end, vi, setup.group(0))
    # where the reference was unstable (torch's rounds disagreeing in two benches: a loaded machine), the agreements
    # that need its figure were not made: said at the end, not passed over in silence
    unstable = [where for where, fig in (("check", check_ci), ("the run's setup", setup), ("the run's end", f_end))
                if fig is None]

    # the kept commits' messages carry measured figures only: against the reference, the one their confirmation bench
    # timed beside them, never the setup's multiplied in
    from agent.records.store import read_iterations
    kept = [rec for rec in read_iterations(root / "runs" / run_id) if rec.decision.value == "kept"]
    assert kept
    for rec in kept:
        msg = git(root, "log", "-1", "--format=%B", rec.commit_sha)
        ref = rec.confirm.speedup_vs_reference_ci
        assert "Agent-Run" in msg and (f"reference beside it: {ref.median:.3f}x" in msg if ref is not None
                                       else "reference" not in msg), msg
    if unstable:   # every other check above held
        pytest.skip(f"the reference's figure was unstable in {', '.join(unstable)} (each said so, checked above): "
                    "the figures against it there were not compared")


def test_a_kept_best_is_shown_against_the_reference_timed_beside_it_not_a_product_of_steps():
    """Issue 63: the prompt said 3.160x (the product of the kept steps times the setup's figure) beside times that gave
    1.32x, the reference having moved since the setup. A best kept since has its keep's confirmation bench figure,
    and the times shown with it are that bench's; a best without one falls back to the product, said so."""
    from agent.records.figures import SIDE_BY_SIDE, best_figure, standing_times, times_line
    from agent.records.schema import RunState
    st = RunState(best_sha="b2", best_iteration=2, best_ms=2.1, initial_ms=9.0, reference_ms=0.5,
                  chain_vs_initial=3.0, initial_vs_reference=0.3,
                  kept_sha="b2", kept_vs_reference=0.48, kept_vs_reference_low=0.45, kept_vs_reference_high=0.51,
                  kept_ms={"candidate": 2.0, "baseline": 2.5, "reference": 0.96})
    f = best_figure(st, "reference")
    assert (f.value, f.low, f.high, f.source) == (0.48, 0.45, 0.51, SIDE_BY_SIDE)
    best, ref, when = standing_times(st)
    assert (best, ref) == (2.0, 0.96) and "side by side" in when
    assert abs(ref / best / f.value - 1) < 0.01     # the times divide into the figure beside them
    assert "reference 960.0 us; its keep's confirmation bench" in times_line(st)
    assert best_figure(st, "initial").source.startswith("estimate")   # vs initial: still the chain, said so
    old = st.model_copy(update={"best_sha": "b3", "best_iteration": 3})   # a best kept without such a bench
    f = best_figure(old, "reference")
    assert f.value == 3.0 * 0.3 and f.source.startswith("estimate")
    assert "the reference's from the setup bench, earlier" in standing_times(old)[2]


def test_before_any_keep_the_figure_against_the_reference_names_the_setup_bench():
    """Iteration 1's prompt said "0.171x (estimate: product of the kept steps ...)" with no step kept: the figure is
    the setup bench's (the initial kernel and the reference interleaved), and it says so; once a step is kept the
    product is an estimate again."""
    from agent.records.figures import SETUP, SOURCES, best_figure
    from agent.records.schema import RunState
    st = RunState(best_iteration=None, initial_ms=2.87, best_ms=2.87, chain_vs_initial=1.0, initial_vs_reference=0.171)
    f = best_figure(st, "reference")
    assert f.value == 0.171 and f.source == SETUP
    kept = st.model_copy(update={"best_iteration": 1, "best_ms": 0.34, "chain_vs_initial": 8.4})
    assert best_figure(kept, "reference").source == SOURCES[False]
