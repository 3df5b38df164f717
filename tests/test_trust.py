"""Issue 24 ("Trust 1"): adversaries of the trust boundary, pushed through ONE real loop run.

The six adversaries of tests/fixtures/cheats/trust.py (three forgeries of the verdict, three writers
outside the candidate's scratch directory) and the real improvement (cheats.GOOD) go through one
`agent optimize --proposer replay` run in a user repo (tests/userrepo.py, the short timeouts of
test_verification). Each case's test reads the shared run and asserts what the FIXED product must do:
not kept, the outcome and reason of trust.py, the writer's file nowhere it should not be, the user's
checkout byte-for-byte unchanged.

What the current code gets wrong is marked xfail(strict=True), naming what gets through today: the fix
for issue 24 must remove each marker (a strict xfail that passes fails the suite). So must it flip
test_the_forgeries_work_today, which asserts that the forgeries really work today (they are not just
crashing or failing adversaries).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.runlog import Decision, IterationRecord, read_iterations, read_state
from tests.fixtures.cheats.trust import FORGERIES, GOOD, TRUST_CASES, WRITE_RELATIVE, WRITES, proposal
from tests.test_verification import verification_repo
from tests.userrepo import agent, git, snapshot
from tools.confine import landlock_abi

CASES = TRUST_CASES + [GOOD, WRITE_RELATIVE]
RUN_ID = "trust"

# what gets through today, per case (issue 24): each such param is xfail(strict=True)
TODAY: dict[str, str] = {
    "forge_result_line": "issue 24: kept at 5x; the forged result line says parity ok while the kernel "
                         "computes garbage (checker and candidate share a process)",
    "forge_timing": "issue 24: kept at 4.2x; the patched tools.bench statistics report a kernel slower "
                    "than the initial one 4.2x faster than its parent",
    "forge_exit_status": "issue 24: kept; the SIGSEGV on the hidden shape (in the evaluate child, and in the "
                         "fresh-seed parity of its implausible gain) is turned into a forged passing result "
                         "and exit 0",
    "loop_order": "issue 24: not the only kept candidate, nor applied to the task's kernel: the kept cheats "
                  "before it replaced the kernel its edit applies to (its LOOP_ORDER line is unused there)",
}
NO_FENCE = ("no Landlock on this kernel: a write by absolute path is not prevented (.matmul_cache lands in the "
            "user's checkout, matmul_profile.txt beside the library)")


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root outside runs/ and .git: relative path -> (size, mtime_ns)."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in ("runs", ".git")]
        for name in filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


@dataclass
class TrustRun:
    root: Path
    run: Path
    recs: dict[str, IterationRecord]
    elapsed: float
    best_sha: str
    before: tuple
    after: tuple
    status_before: str
    status_after: str
    files_before: dict[str, tuple[int, int]]
    files_after: dict[str, tuple[int, int]]
    summary: str = ""
    changed: list[str] = field(default_factory=list)   # new or changed files outside runs/ and .git


@pytest.fixture(scope="module")
def trust_run(tmp_path_factory) -> TrustRun:
    tmp = tmp_path_factory.mktemp("trust")
    root = verification_repo(tmp / "user")
    before, status_before, files_before = snapshot(root), git(root, "status", "--porcelain"), listing(root)
    props = tmp / "trust.json"
    props.write_text(json.dumps([proposal(c).model_dump() for c in CASES]))
    t0 = time.monotonic()
    # --past-target: the forged gains multiply far past any target, which would end the run early
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(props),
                "--iters", str(len(CASES)), "--target", "100x", "--past-target", "--quiet", "--run-id", RUN_ID,
                timeout=600)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    run = root / "runs" / RUN_ID
    recs = read_iterations(run)
    assert [r.iteration for r in recs] == list(range(1, len(CASES) + 1)), "every candidate got an iteration"
    assert read_state(run).status == "done"
    files_after = listing(root)
    tr = TrustRun(root=root, run=run, recs={c.name: r for c, r in zip(CASES, recs)}, elapsed=elapsed,
                  best_sha=read_state(run).best_sha, before=before, after=snapshot(root),
                  status_before=status_before, status_after=git(root, "status", "--porcelain"),
                  files_before=files_before, files_after=files_after,
                  changed=sorted(p for p, v in files_after.items() if files_before.get(p) != v))
    rows = []
    for c, r in zip(CASES, recs):
        s = r.bench.speedup_vs_baseline.median if r.bench and r.bench.speedup_vs_baseline else None
        rows.append(f"{c.name:18s} {r.outcome.value:14s} {r.decision.value:9s} "
                    f"parity={r.parity.status.value if r.parity else '-':9s} "
                    f"x={f'{s:.2f}' if s else '-':6s} {r.reason[:100]}")
    tr.summary = "\n".join(rows) + f"\nnew/changed outside runs/: {tr.changed}\n({elapsed:.0f}s, {run})"
    (tmp / "trust_summary.txt").write_text(tr.summary + "\n")
    print("\n" + tr.summary)
    return tr


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=TODAY[case.name])] if case.name in TODAY else []
    if case.name in ("write_checkout_abs", "write_next_to_lib"):
        marks = [pytest.mark.xfail(landlock_abi() == 0, strict=True, reason=NO_FENCE)]
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_trust_case(trust_run, case):
    """Never kept, rejected with the fixed product's outcome and reason; a writer's file is nowhere."""
    rec = trust_run.recs[case.name]
    where = f"{case.name}: {rec.outcome.value} / {rec.decision.value} / {rec.reason}"
    if case.kind == "good":
        assert rec.outcome.value == "kept" and rec.decision == Decision.kept, where
        # the only candidate kept, applied to the task's own kernel (the parent of iteration 1), the best
        kept = [n for n, r in trust_run.recs.items() if r.decision == Decision.kept]
        assert kept == [case.name], f"kept: {kept}"
        assert rec.parent_sha == trust_run.recs[CASES[0].name].parent_sha, where
        assert trust_run.best_sha == rec.commit_sha, where
        return
    assert rec.proposal is not None and rec.proposal.hypothesis.startswith(f"[{case.name}]"), where
    if case.kind == "writer":   # judged on merit; the file is nowhere outside a scratch directory
        name = WRITES[case.name]
        assert not (trust_run.root / name).exists(), f"{name} is in the user's checkout"
        assert not [p for p in trust_run.changed if Path(p).name == name], f"{name} is in the user's checkout"
        assert not list(trust_run.run.rglob(name)), f"{name} was left in the run's folder"
        listed = [f for f in rec.scratch_files if f.path == name]
        if case is WRITE_RELATIVE:   # a relative path: in its scratch directory, listed, removed
            assert listed and listed[0].bytes > 0 and listed[0].process == "runner-evaluate", rec.scratch_files
        else:                        # an absolute path outside: refused by the fence, nothing written
            assert not listed, rec.scratch_files
        return
    assert rec.decision == Decision.reverted, where
    assert rec.outcome.value == case.expect, where
    assert case.reason in rec.reason, where
    if case.hidden and case.expect == "parity_failed":
        assert rec.parity is not None and rec.parity.worst() is not None and rec.parity.worst().hidden, where
    name = WRITES.get(case.name)
    if name is not None:
        root, run = trust_run.root, trust_run.run
        assert not (root / name).exists(), f"{name} is in the user's checkout"
        assert not [p for p in trust_run.changed if Path(p).name == name], f"{name} is in the user's checkout"
        # nor next to any library of the run (the run's records are the agent's, not the candidate's)
        beside = [p for d in ("iter-*", "best", "initial") for p in run.glob(f"{d}/{name}")]
        assert not beside, f"{name} was written next to a library: {beside}"


@pytest.mark.slow
@pytest.mark.xfail(landlock_abi() == 0, strict=True, reason=NO_FENCE)
def test_the_users_checkout_is_unchanged(trust_run):
    """Byte for byte: HEAD, branch, status (untracked files included), README, refs; and no new or
    changed file outside runs/ and .git."""
    assert trust_run.status_after == trust_run.status_before
    assert trust_run.after == trust_run.before
    assert trust_run.changed == [], trust_run.changed


# --- today: the forgeries work (the fix must flip this test) --------------------------------------
_PROBE = textwrap.dedent("""
    import ctypes, json, random, sys, time
    what, lib = sys.argv[1], ctypes.CDLL(sys.argv[2])
    def call(l, m, n, k, a, b):
        c = (ctypes.c_float * (m * n))()
        l.matmul(a, b, c, ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k))
        return c
    def inputs(m, n, k):
        rng = random.Random(1)
        return ((ctypes.c_float * (m * k))(*[rng.uniform(-1, 1) for _ in range(m * k)]),
                (ctypes.c_float * (k * n))(*[rng.uniform(-1, 1) for _ in range(k * n)]))
    if what == "error":        # the largest error against a float64 reference, on an unlisted shape
        m, n, k = 24, 20, 40
        a, b = inputs(m, n, k)
        c = call(lib, m, n, k, a, b)
        print(json.dumps(max(abs(c[i * n + j] - sum(a[i * k + t] * b[t * n + j] for t in range(k)))
                             for i in range(m) for j in range(n))))
    elif what == "speed":      # best-of-7 milliseconds of lib and of argv[3] at 256^3, interleaved
        m = n = k = 256
        other = ctypes.CDLL(sys.argv[3])
        a, b = inputs(m, n, k)
        best = {0: 1e9, 1: 1e9}
        for _ in range(7):
            for key, l in ((0, lib), (1, other)):
                t0 = time.perf_counter()
                call(l, m, n, k, a, b)
                best[key] = min(best[key], (time.perf_counter() - t0) * 1e3)
        print(json.dumps([best[0], best[1]]))
    else:                      # a shape the task does not list
        a, b = inputs(100, 90, 50)
        call(lib, 100, 90, 50, a, b)
        print("returned")
""")


def _probe(*args: str) -> subprocess.CompletedProcess:
    """The library in a plain Python process (no runner, nothing to forge for): what it really does."""
    return subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_forgeries_work_today(trust_run):
    """Documents issue 24 as it stands: each forgery succeeds today (kept, with the verdict it forged),
    while its library, run outside the child, does what the forged verdict denies. Not merely a
    crashing or failing cheat. THE FIX MUST FLIP THIS TEST (delete it, or turn it into the opposite
    assertions), along with removing the xfail markers of the cases above."""
    recs, run = trust_run.recs, trust_run.run
    lib = lambda name: run / f"iter-{recs[name].iteration}" / "libmatmul_cpu.so"  # noqa: E731
    got = {}
    for name in FORGERIES:
        r = recs[name]
        got[name] = (r.decision.value, r.outcome.value, r.parity.status.value if r.parity else None,
                     r.bench.speedup_vs_baseline.median if r.bench and r.bench.speedup_vs_baseline else None)
    where = f"{got}\n{trust_run.summary}"

    # forge_result_line: kept at 5x with parity "ok" on every check; the library computes garbage
    r = recs["forge_result_line"]
    assert r.decision == Decision.kept and r.parity.status.value == "ok", where
    assert r.parity.checks and all(c.ok for c in r.parity.checks) and any(c.hidden for c in r.parity.checks)
    assert 4.0 < r.bench.speedup_vs_baseline.median < 6.0, where
    p = _probe("error", str(lib("forge_result_line")))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) > 0.1, "the kernel is meant to compute garbage"

    # forge_timing: kept at ~4.2x (both benches); the library is slower than the initial kernel
    r = recs["forge_timing"]
    assert r.decision == Decision.kept and r.parity.status.value == "ok", where
    assert 3.0 < r.bench.speedup_vs_baseline.median < 10.0 and 3.0 < r.confirm.speedup_vs_baseline.median, where
    p = _probe("speed", str(lib("forge_timing")), str(run / "initial" / "libmatmul_cpu.so"))
    assert p.returncode == 0, p.stderr
    forged_ms, initial_ms = json.loads(p.stdout.strip().splitlines()[-1])
    assert forged_ms > initial_ms, f"really {initial_ms / forged_ms:.2f}x the initial kernel"

    # forge_exit_status: kept, its parity "ok" on the hidden shape it crashes on; the child exited 0
    r = recs["forge_exit_status"]
    assert r.decision == Decision.kept and r.parity.status.value == "ok", where
    assert any(c.hidden and c.ok for c in r.parity.checks), where
    p = _probe("crash", str(lib("forge_exit_status")))
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr[-2000:])
