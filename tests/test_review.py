"""agent runs / show / report / cherry-pick / gate, on a real run of the real loop.

One short heuristic run of a small-budget copy of kernels/matmul_cpu is made once per session in a
temporary git repository (real compiler, real subprocesses, real git); every test reads it. Tests
that change branches do so in their own `git worktree` of that repository (the user's checkout
stand-in), so they do not disturb each other.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.cli import main
from agent.review.cherrypick import CherryPickError, cherry_pick
from agent.review.runs import load_run
from agent.records.schema import Decision
from tests.userrepo import agent, shared_by_workers

ROOT = Path(__file__).resolve().parent.parent
TASK_REL = "kernels/matmul_cpu"
RUN_ID = "review-test"

# a smaller budget than the shipped task: fewer timing rounds, one parity seed, one hidden shape
FAST = {"warmup_ms = 20": "warmup_ms = 5", "rep_ms = 60": "rep_ms = 15", "rounds = 8": "rounds = 4",
        "input_sets = 2": "input_sets = 1", "seeds = 2": "seeds = 1", "hidden_shapes = 2": "hidden_shapes = 1"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def run_repo(tmp_path_factory):
    """The run made once for the whole test run (tests/userrepo.py shared_by_workers: 11-12 s, which both workers
    paid when the work stealing split this file), copied for each worker: the tests here write to it (worktrees,
    branches, reports), the copy is theirs. Nothing in the repository or its run names the folder it was made in
    (a copy is what a user's clone of it would be)."""
    made = shared_by_workers(tmp_path_factory, "review", _make_run_repo)
    mine = tmp_path_factory.mktemp("review")
    shutil.copytree(made.parent, mine, dirs_exist_ok=True, symlinks=True)
    return mine / "repo"


def _make_run_repo(folder: Path) -> Path:
    repo = folder / "repo"
    (repo / "kernels").mkdir(parents=True)
    shutil.copytree(ROOT / TASK_REL, repo / TASK_REL, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    toml = repo / TASK_REL / "task.toml"
    text = toml.read_text()
    for a, b in FAST.items():
        assert a in text, f"the shipped task.toml changed: no {a!r}"
        text = text.replace(a, b)
    toml.write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Test User")
    git(repo, "config", "user.email", "user@example.com")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    p = agent(repo, "optimize", TASK_REL, "--iters", "3", "--target", "100x", "--proposer", "heuristic", "--run-id",
              RUN_ID, "--quiet", timeout=400, env={"COLUMNS": "300"})      # tests/userrepo.py's: no endpoint named
    assert p.returncode == 0, p.stdout + p.stderr
    (repo.parent / "optimize.out").write_text(p.stdout)      # the summary, for the figures test
    run = load_run(repo / "runs" / RUN_ID)
    assert run.kept(), f"the LOOP_ORDER move should have been kept: {[r.reason for r in run.records]}"
    return repo


@pytest.fixture
def cli(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")

    def call(*argv: str, cwd: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        rc = main([str(a) for a in argv])
        o = capsys.readouterr()
        return rc, o.out, o.err
    return call


def user_checkout(repo: Path, tmp_path: Path, name: str, start: str = "main") -> Path:
    """A checkout of the test repository on a new branch: what the user works in."""
    wt = tmp_path / name
    git(repo, "worktree", "add", "-q", "-b", name, str(wt), start)
    return wt


def snapshot(wt: Path) -> tuple[str, str, str, str]:
    return (git(wt, "rev-parse", "HEAD"), git(wt, "symbolic-ref", "-q", "HEAD"),
            git(wt, "status", "--porcelain", "--untracked-files=all"), git(wt, "diff", "HEAD"))


# --- runs / show / report ---------------------------------------------------------------------
def test_runs_lists_the_run_skips_non_runs_and_flags_another_schema(run_repo, cli, tmp_path):
    runs = tmp_path / "runs"
    (runs / RUN_ID).mkdir(parents=True)
    for f in ("run.json", "state.json", "iterations.jsonl"):
        shutil.copy(run_repo / "runs" / RUN_ID / f, runs / RUN_ID / f)
    (runs / "sweep-matmul_cpu-20260101-000000").mkdir()
    (runs / "sweep-matmul_cpu-20260101-000000" / "sweep.json").write_text("{}")
    old = json.loads((run_repo / "runs" / RUN_ID / "run.json").read_text())
    old.update(schema_version=0, run_id="old-run")
    (runs / "old-run").mkdir()
    (runs / "old-run" / "run.json").write_text(json.dumps(old))

    rc, out, _ = cli("runs", "--runs-dir", runs, cwd=run_repo)
    assert rc == 0
    assert RUN_ID in out and "matmul_cpu" in out and "heuristic" in out and "3/3" in out
    assert "sweep-" not in out
    assert "old-run" in out and "unreadable: written by log schema version 0" in out

    rc, out, _ = cli("runs", "--runs-dir", runs, "--json", cwd=run_repo)
    rows = {r["id"]: r for r in json.loads(out)}
    assert set(rows) == {RUN_ID, "old-run"}
    run = load_run(run_repo / "runs" / RUN_ID)
    good = rows[RUN_ID]
    assert good["readable"] and good["iterations"] == 3 and good["kept"] == len(run.kept())
    assert good["best_vs_initial"] == pytest.approx(run.best_speedup("initial").value)
    assert good["status"] == "done"
    assert not rows["old-run"]["readable"] and "schema version 0" in rows["old-run"]["reason"]

    rc, out, err = cli("show", "old-run", "--runs-dir", runs, cwd=run_repo)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "schema version 0" in err and "Traceback" not in err


def test_show_summary_and_one_iteration(run_repo, cli):
    run = load_run(run_repo / "runs" / RUN_ID)
    first = run.records[0]
    rc, out, _ = cli("show", RUN_ID, cwd=run_repo)
    assert rc == 0
    assert first.proposal.summary()[:40] in out
    assert "3 iterations done" in out and run.state.best_sha[:10] in out
    assert "median s per iteration over" in out and "without the proposer" in out
    rc, out, _ = cli("show", RUN_ID, "--json", cwd=run_repo)
    med = json.loads(out)["stage_medians_s"]
    built = [r for r in run.records if r.build is not None]
    assert med["build"] == pytest.approx(sorted(r.times.build for r in built)[len(built) // 2]) if len(built) % 2 \
        else med["build"] > 0
    assert 0 < med["without_proposer"] <= med["iteration"]
    # the wall clock covers the stages and the gaps between them
    assert med["without_proposer"] <= med["wall_without_proposer"] + 0.05 and med["iteration"] <= med["wall"] + 0.05
    assert all(it["wall_s"] >= sum(it["seconds"].values()) - 0.05 for it in json.loads(out)["iterations"])

    rc, out, _ = cli("show", RUN_ID[:8], "--iter", "1", cwd=run_repo)   # a unique prefix works
    assert rc == 0
    assert "hypothesis" in out and "#define LOOP_ORDER 1" in out and "max abs err" in out and "parity: ok" in out
    # the flags that built it, and what each time means in FLOP/s and bytes/s
    assert "commands" in out and "-O3 -march=native" in out and "-c matmul.cpp" in out and "-o libmatmul_cpu.so" in out
    assert "GFLOP/s" in out and "GB/s" in out

    rc, out, _ = cli("show", RUN_ID, "--iter", "1", "--json", cwd=run_repo)
    data = json.loads(out)
    assert data["iteration"] == 1 and data["proposal"]["hypothesis"] == first.proposal.hypothesis
    assert data["build"]["status"] == "ok" and data["parity"]["status"] == "ok"
    shapes = {e["shape"] for e in data["parity_by_shape"]}
    assert "M=131,N=67,K=97" in shapes and all(e["max_abs_err"] is not None for e in data["parity_by_shape"])
    assert any(a.endswith("patch.diff") for a in data["artifacts"])

    rc, _, err = cli("show", RUN_ID, "--iter", "99", cwd=run_repo)
    assert rc == 2 and "no iteration 99" in err


def test_report_writes_markdown_and_a_real_png(run_repo, cli):
    rc, out, _ = cli("report", RUN_ID, cwd=run_repo)
    assert rc == 0
    d = run_repo / "runs" / RUN_ID
    md = (d / "report.md").read_text()
    run = load_run(d)
    kept = run.kept()
    assert "![speedup per iteration](speedup.png)" in md
    # the task declares its FLOPs and bytes: a roofline beside it, named in the command's output
    assert "(roofline.png)" in md and (d / "roofline.png").read_bytes()[:4] == b"\x89PNG" and "roofline.png" in out
    assert "## Ablation" in md and f"`{kept[0].commit_sha[:10]}`" in md
    ci = kept[0].bench.speedup_vs_baseline
    assert f"{ci.median:.3f}x ({ci.low:.3f}-{ci.high:.3f})" in md
    for r in run.records:
        if r.decision != Decision.kept:
            assert r.reason.split()[0] in md and f"| {r.iteration} | {r.outcome.value} |" in md
    assert "## Environment" in md and run.cfg.env.cxx in md
    assert re.search(r"\*\*Throughput\*\*: best [\d.]+ GFLOP/s, [\d.]+ GB/s; initial .*; reference ", md), md

    png = d / "speedup.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.shape[0] >= 500 and img.shape[1] >= 800
    assert img[..., :3].std() > 0.05        # not a blank canvas


# --- cherry-pick ------------------------------------------------------------------------------
def test_cherry_pick_best_onto_the_users_branch_builds_and_passes_parity(run_repo, cli, tmp_path):
    from tools.build.build import build
    from tools.measure.parity import run_parity
    from tools.results import BuildStatus, ParityStatus
    from tools.task import load_task

    wt = user_checkout(run_repo, tmp_path, "user-best")
    before = git(wt, "rev-parse", "HEAD")
    run = load_run(run_repo / "runs" / RUN_ID)
    rc, out, err = cli("cherry-pick", RUN_ID, "--best", "--runs-dir", run_repo / "runs", cwd=wt)
    assert rc == 0, err
    assert "onto user-best" in out
    assert git(wt, "symbolic-ref", "--short", "HEAD") == "user-best"
    picked = git(wt, "rev-list", f"{before}..HEAD").split()
    assert len(picked) == len(run.kept())
    msg = git(wt, "show", "-s", "--format=%B", picked[0])
    assert f"Agent-Run: {RUN_ID}" in msg and "Speedup:" in msg
    assert git(wt, "status", "--porcelain", "--untracked-files=no") == ""
    # the user's branch now holds the best's task sources
    assert git(wt, "diff", run.state.best_sha, "HEAD", "--", TASK_REL) == ""

    task = load_task(wt / TASK_REL)
    b = build(task, tmp_path / "build")
    assert b.status == BuildStatus.ok, b.message
    par = run_parity(task, Path(b.lib_path))
    assert par.status == ParityStatus.ok, par.message

    rc, out, err = cli("cherry-pick", RUN_ID, "--runs-dir", run_repo / "runs", cwd=wt)   # again: nothing to do
    assert rc == 0, err
    assert "nothing to do" in out and git(wt, "rev-list", f"{before}..HEAD").split() == picked


def test_cherry_pick_squash_onto_another_branch_leaves_the_checkout_alone(run_repo, cli, tmp_path):
    wt = user_checkout(run_repo, tmp_path, "user-here")
    git(run_repo, "branch", "release", "main")
    here = snapshot(wt)
    rc, out, err = cli("cherry-pick", RUN_ID, "--onto", "release", "--squash", "--runs-dir", run_repo / "runs",
                       cwd=wt)
    assert rc == 0, err
    assert snapshot(wt) == here                      # not switched, not touched
    log = git(run_repo, "rev-list", "main..release").split()
    assert len(log) == 1
    msg = git(run_repo, "show", "-s", "--format=%B", "release")
    run = load_run(run_repo / "runs" / RUN_ID)
    assert f"Agent-Run: {RUN_ID}" in msg
    for r in run.kept():
        assert f"Agent-Iteration: {r.iteration}" in msg and r.proposal.summary()[:40] in msg
    assert git(run_repo, "diff", run.state.best_sha, "release", "--", TASK_REL) == ""
    assert "agent-cherry-pick" not in git(run_repo, "worktree", "list")


def test_cherry_pick_refuses_a_dirty_tree_and_changes_nothing(run_repo, cli, tmp_path):
    wt = user_checkout(run_repo, tmp_path, "user-dirty")
    src = wt / TASK_REL / "matmul.cpp"
    src.write_text(src.read_text() + "\n// work in progress\n")
    before = snapshot(wt)
    rc, out, err = cli("cherry-pick", RUN_ID, "--runs-dir", run_repo / "runs", cwd=wt)
    assert rc == 1 and out == ""
    assert "uncommitted changes" in err and "matmul.cpp" in err
    assert snapshot(wt) == before
    assert git(run_repo, "rev-parse", "user-dirty") == git(run_repo, "rev-parse", "main")


def test_cherry_pick_conflict_leaves_no_half_applied_state(run_repo, cli, tmp_path):
    wt = user_checkout(run_repo, tmp_path, "user-conflict")
    src = wt / TASK_REL / "matmul.cpp"
    src.write_text(src.read_text().replace("#define LOOP_ORDER 0", "#define LOOP_ORDER 0  // chosen by hand"))
    git(wt, "commit", "-qam", "pin the loop order")
    before = snapshot(wt)
    rc, out, err = cli("cherry-pick", RUN_ID, "--runs-dir", run_repo / "runs", cwd=wt)
    assert rc == 1
    assert re.search(r"iteration \d+ \([0-9a-f]{10}\) does not apply on user-conflict: conflicts in "
                     r"kernels/matmul_cpu/matmul.cpp", err), err
    assert "Nothing was changed" in err
    assert snapshot(wt) == before
    gitdir = Path(git(wt, "rev-parse", "--absolute-git-dir"))
    assert not (gitdir / "CHERRY_PICK_HEAD").exists()
    assert "agent-cherry-pick" not in git(run_repo, "worktree", "list")


def test_cherry_pick_refuses_what_is_not_the_runs_kept_commit(run_repo, tmp_path):
    wt = user_checkout(run_repo, tmp_path, "user-refuse")
    run = load_run(run_repo / "runs" / RUN_ID)
    not_kept = [r for r in run.records if r.decision != Decision.kept]
    if not_kept:
        with pytest.raises(CherryPickError, match=f"iteration {not_kept[0].iteration} .* was not kept"):
            cherry_pick(run, wt, iteration=not_kept[0].iteration)
    # a log whose kept iteration points at a commit the run did not make (the user's own)
    run.kept()[0].commit_sha = run.cfg.base_sha
    before = snapshot(wt)
    with pytest.raises(CherryPickError, match="not run review-test's iteration"):
        cherry_pick(run, wt, iteration=run.kept()[0].iteration)
    assert snapshot(wt) == before


# --- gate -------------------------------------------------------------------------------------
PLANTED = '''
// planted regression: the whole product is computed twice (same result, twice the work)
extern "C" void matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                       int M, int N, int K) {
    volatile int reps = 2;
    for (int r = 0; r < reps; ++r) matmul_once(A, B, C, M, N, K);
}
'''


@pytest.mark.slow        # two gates, each building and measuring a checkout: 11-13 s on 2 cores
def test_gate_passes_on_the_recorded_best_and_fails_on_a_planted_regression(run_repo, cli, tmp_path):
    run = load_run(run_repo / "runs" / RUN_ID)
    wt = user_checkout(run_repo, tmp_path, "user-gate", start=run.state.best_sha)
    runs = run_repo / "runs"

    rc, out, err = cli("gate", wt / TASK_REL, "--runs-dir", runs, cwd=wt)    # default: the newest finished run
    assert rc == 0, out + err
    assert out.startswith("gate passed") and f"run {RUN_ID} best" in out and len(out.strip().splitlines()) == 1
    # that was the best against itself: an A/A run never reports a change (two benches must agree on one)
    assert "no significant change" in out, out
    # the other direction: the best (LOOP_ORDER, about 3x) against the commit the run started from is a change
    rc, out, err = cli("gate", wt / TASK_REL, "--against", "main", "--runs-dir", runs, cwd=wt)
    assert rc == 0 and out.startswith("gate passed") and ": faster, within the" in out, out + err

    src = wt / TASK_REL / "matmul.cpp"
    src.write_text(src.read_text().replace('extern "C" void matmul(', "static void matmul_once(") + PLANTED)
    rc, out, err = cli("gate", wt / TASK_REL, "--against", RUN_ID, "--runs-dir", runs, "--max-regression", "5%",
                       "--json", cwd=wt)
    assert rc == 1, out + err
    res = json.loads(out)
    assert res["status"] == "regression" and not res["passed"]
    assert res["parity"]["status"] == "ok"                   # still correct, only slower
    # both benches see it: their medians (a bench's interval on a loaded 2-core machine can reach past 1 around a
    # median of 0.5: .ci/run once measured one reaching 1.43 while the gate's verdict was right)
    assert res["speedup"]["median"] < 0.8 and res["speedup_again"]["median"] < 0.8, res
    assert res["current_ms"] / res["baseline_ms"] > 1.3      # the planted slowdown, as measured
    assert res["against_sha"] == run.state.best_sha


def test_gate_fails_on_parity_and_refuses_an_unknown_baseline(run_repo, cli, tmp_path):
    wt = user_checkout(run_repo, tmp_path, "user-gate-bad")
    src = wt / TASK_REL / "matmul.cpp"
    src.write_text(src.read_text().replace("acc += A[(size_t)i * K + k] * B[(size_t)k * N + j];",
                                           "acc += A[(size_t)i * K + k] * B[(size_t)k * N + j] * 1.001f;"))
    rc, out, _ = cli("gate", wt / TASK_REL, "--against", "main", "--runs-dir", run_repo / "runs", cwd=wt)
    assert rc == 1 and out.startswith("gate FAILED") and "parity mismatch" in out

    rc, out, err = cli("gate", wt / TASK_REL, "--against", "no-such-thing", "--runs-dir", run_repo / "runs", cwd=wt)
    assert rc == 2 and "neither a run" in err


def _folded(text: str, word: str) -> bool:
    """`word` is in the rendering whole: on one line, or folded into pieces that start at the same column
    on consecutive lines."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        j = line.find(word[:4])
        while j >= 0:
            got, k = line[j:].split(" ")[0], i + 1
            while word.startswith(got) and len(got) < len(word) and k < len(lines):
                got += lines[k][j:].split(" ")[0] if len(lines[k]) > j and lines[k][j - 1:j] in (" ", "") else ""
                k += 1
            if got.startswith(word):
                return True
            j = line.find(word[:4], j + 1)
    return False


def test_the_runs_table_is_readable_at_80_columns():
    """Every cell keeps its text at a terminal's default width: folded onto more lines, never cut to one
    character and an ellipsis (it showed `t…` and `p…` for task and proposer), no character lost."""
    import io

    from rich.console import Console

    from agent.review.table import RunRow, runs_table
    rows = [RunRow(id="20261125-074612-ab12", task="attention_fwd", started="2026-11-25T07:46:12+00:00",
                   proposer="llm/gpt-5-codex", iterations=20, iters_max=20, kept=4, best_vs_initial=7.46,
                   best_vs_reference=0.131, confirmed=True, status="interrupted"),
            RunRow(id="old-run", readable=False, reason="written by log schema version 0")]
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(runs_table(rows, "runs in /home/user/project/runs"))
    text = buf.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    for cell in ("20261125-074612-ab12", "attention_fwd", "llm/gpt-5-codex", "20/20", "7.46x", "0.13x",
                 "interrupted", "unreadable:", "old-run"):
        assert _folded(text, cell), (cell, text)
    assert not _folded(text, "interupted")    # the check can fail: a lost character is seen


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_one_run_shows_the_same_figures_everywhere(run_repo, cli, monkeypatch):
    """The best's speedups in the summary, `agent show`, `agent show --json` and report.md are one
    measurement (the confirmation bench, named); each kept commit's message states the estimate that
    the report's ablation table and `agent show --iter` state for it."""
    from agent.records.figures import Figure, best_figure, figures_line
    run = load_run(run_repo / "runs" / RUN_ID)
    st = run.state
    vi, vr = best_figure(st, "initial"), best_figure(st, "reference")
    assert vi.confirmed and vr.confirmed and vr.low is not None     # a finished run ends confirmed
    assert (vi.value, vr.value) == (st.confirmed_vs_initial, st.confirmed_vs_reference)
    line = figures_line(st)
    assert "confirmation bench" in line and vi.text() in line and vr.text() in line
    assert line in _flat((run_repo.parent / "optimize.out").read_text())
    monkeypatch.setenv("COLUMNS", "400")
    rc, out, _ = cli("show", RUN_ID, cwd=run_repo)
    assert rc == 0 and line in _flat(out)
    rc, out, _ = cli("show", RUN_ID, "--json", cwd=run_repo)
    best = json.loads(out)["best"]
    assert rc == 0 and (best["vs_initial"], best["vs_reference"], best["confirmed"]) == (vi.value, vr.value, True)
    rc, _, _ = cli("report", RUN_ID, cwd=run_repo)
    report = (run_repo / "runs" / RUN_ID / "report.md").read_text()
    assert rc == 0 and line in report
    for r in run.kept():
        est = Figure(r.speedup_vs_initial).text()
        msg = git(run_repo, "log", "-1", "--format=%B", r.commit_sha)
        assert f"Cumulative: {est} vs the initial kernel" in _flat(msg) and "estimate: product" in _flat(msg)
        # only figures of benches that timed this commit: none against the reference (the setup's, multiplied in)
        assert "vs the reference" not in msg, msg
        assert re.search(rf"\| {r.iteration} \| `{r.commit_sha[:10]}` \|.*\| {re.escape(est)} \|", report), report


def test_a_known_gpu_gets_its_share_of_the_spec_sheet_peak_and_a_cpu_none():
    from agent.review.show import throughput
    from tools.results import DevicePeak, TimingStats
    from tools.measure.roofline import spec_peak
    assert spec_peak("cpu", "float32") is None and spec_peak("cuda: Some Future GPU", "float16") is None
    tf, gb, label = spec_peak("cuda: NVIDIA H200", "float16")
    assert (tf, gb) == (990.0, 4800.0) and "H200" in label and "tensor" in label
    assert spec_peak("cuda: NVIDIA H100 80GB HBM3", "float32")[0] == 67.0     # fp32: the non-tensor peak
    tm = TimingStats(label="candidate", median_ms=1.0, p10_ms=1.0, p90_ms=1.0, mean_ms=1.0, reps=5,
                     tflops=99.0, gbps=480.0)
    assert throughput(tm, DevicePeak(tflops=tf, gbps=gb, label=label)) == \
        "99 TFLOP/s (10.0% of 990 TFLOP/s), 480 GB/s (10.0% of 4800 GB/s)"
    assert throughput(tm, None) == "99 TFLOP/s, 480 GB/s"


def test_the_gates_rule_takes_a_third_bench_where_two_disagree():
    """agent/review/gate.py: a regression is two independent benches wholly below 1 - limit; where one of two says so
    and the other cannot tell (a planted 2.7x regression measured 0.370x [0.349, 0.389] and 0.425x [0.242, 1.053] on a
    loaded 2-core machine, and passed), a third bench decides."""
    from agent.review.gate import below, regressed
    from tools.results import SpeedupCI

    def ci(m, lo, hi):
        return SpeedupCI(median=m, low=lo, high=hi, confidence=0.95, rounds=6)
    clear, noisy = ci(0.370, 0.349, 0.389), ci(0.425, 0.242, 1.053)
    assert below(clear, 0.05) and not below(noisy, 0.05) and not below(None, 0.05)
    assert not regressed([clear, noisy], 0.05)                       # one of two: a third is taken
    assert regressed([clear, noisy, ci(0.41, 0.39, 0.43)], 0.05)     # two of three
    assert not regressed([clear, noisy, ci(0.99, 0.95, 1.04)], 0.05)
    assert not regressed([ci(1.0, 0.98, 1.02), ci(0.97, 0.96, 0.99)], 0.05)   # within the limit: never
