"""Issue 24 ("Trust 1"): adversaries of the trust boundary, pushed through ONE real loop run.

The six adversaries of tests/fixtures/cheats/trust.py (three forgeries of the verdict, three writers
outside the candidate's scratch directory) and the real improvement (cheats.GOOD) go through one
`agent optimize --proposer replay` run in a user repo (tests/userrepo.py, the short timeouts of
test_verification). Each case's test reads the shared run and asserts what the FIXED product must do:
not kept, the outcome and reason of trust.py, the writer's file nowhere it should not be, the user's
checkout byte-for-byte unchanged.

An adversary the code does not stop is marked xfail(strict=True) in TODAY, naming what gets through (a
strict xfail that passes fails the suite). Before the host/judge split all three forgeries were kept;
test_the_forgeries_are_rejected_for_what_their_libraries_really_do shows they are rejected now and that
their libraries really compute garbage, run slower, segfault (not adversaries that merely stopped
working).
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

from agent.records.schema import Decision, IterationRecord
from agent.records.store import read_iterations, read_state
from tests.fixtures.cheats.trust import FORGERIES, GOOD, TRUST_CASES, WRITE_RELATIVE, WRITES, proposal
from tests.test_verification import verification_repo
from tests.userrepo import agent, git, shared_by_workers, snapshot
from tools.isolation.confine import landlock_abi

# the real improvement first: it is judged against the task's own kernel (its LOOP_ORDER edit applies
# there); the writers are fast honest kernels judged on merit, so they may be kept after it
CASES = [GOOD] + TRUST_CASES + [WRITE_RELATIVE]
RUN_ID = "trust"

# what gets through today, per case: each such param is xfail(strict=True) (none since the host/judge
# split of issue 24; a new adversary that gets through goes here, named)
TODAY: dict[str, str] = {}
NO_FENCE = ("no Landlock on this kernel: a write by absolute path is not prevented (.matmul_cache lands in the "
            "user's checkout, matmul_profile.txt beside the library)")


def listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under root outside runs/ and .git: relative path -> (size, mtime_ns, mode)."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in ("runs", ".git")]
        for name in filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns, st.st_mode)
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


@pytest.fixture(scope="session")
def trust_run(tmp_path_factory) -> TrustRun:
    """The one run, made once for the test run and read by every worker that runs a case (tests/userrepo.py
    shared_by_workers): 28-32 s a run, and the full suite's work stealing gave both workers cases of it."""
    return shared_by_workers(tmp_path_factory, "trust", _trust_run)


def _trust_run(tmp: Path) -> TrustRun:
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
        # applied to the task's own kernel; nothing kept but it and the writers (honest, on merit)
        kept = [n for n, r in trust_run.recs.items() if r.decision == Decision.kept]
        assert set(kept) <= {case.name, *WRITES}, f"kept: {kept}"
        assert rec.iteration == 1, where
        return
    assert rec.proposal is not None and rec.proposal.hypothesis.startswith(f"[{case.name}]"), where
    if case.kind == "writer":   # judged on merit; the file is nowhere outside a scratch directory
        name = WRITES[case.name]
        assert not (trust_run.root / name).exists(), f"{name} is in the user's checkout"
        assert not [p for p in trust_run.changed if Path(p).name == name], f"{name} is in the user's checkout"
        assert not list(trust_run.run.rglob(name)), f"{name} was left in the run's folder"
        listed = [f for f in rec.scratch_files if f.path == name]
        if case is WRITE_RELATIVE:   # a relative path: in its scratch directory, listed, removed, and refused
            assert listed and listed[0].bytes > 0 and listed[0].process == "host", rec.scratch_files
            # issue 39: a library that writes files is a defect the user hears about before it is merged
            assert rec.decision == Decision.reverted and rec.parity.status.value == "side_effect", where
            assert "wrote files in its working directory: matmul_debug.log" in rec.reason, where
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


# --- the forgeries: rejected, and their libraries really do what the judge says ----------------------
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
def test_the_forgeries_are_rejected_for_what_their_libraries_really_do(trust_run):
    """Each forgery worked before the host/judge split (kept at 5x, 4.2x, with a forged parity on the
    shape it crashes on, and forge_clock at 1.50x over the real improvement). Now each is rejected by the judge's own verdict, and its library, run
    outside the loop, does what that verdict says: computes garbage, is slower, segfaults. Not a
    forgery that merely stopped working."""
    recs, run = trust_run.recs, trust_run.run
    lib = lambda name: run / f"iter-{recs[name].iteration}" / "libmatmul_cpu.so"  # noqa: E731
    where = trust_run.summary

    # forge_result_line: the judge saw the outputs mismatch; the library computes garbage
    r = recs["forge_result_line"]
    assert r.decision == Decision.reverted and r.parity.status.value == "mismatch", where
    p = _probe("error", str(lib("forge_result_line")))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) > 0.1, "the kernel is meant to compute garbage"

    # forge_timing: parity passed, the bench found it slower; the library is slower than the initial kernel
    r = recs["forge_timing"]
    assert r.decision == Decision.reverted and r.parity.status.value == "ok", where
    assert r.bench.speedup_vs_baseline.median < 1.0, where
    p = _probe("speed", str(lib("forge_timing")), str(run / "initial" / "libmatmul_cpu.so"))
    assert p.returncode == 0, p.stderr
    forged_ms, initial_ms = json.loads(p.stdout.strip().splitlines()[-1])
    assert forged_ms > initial_ms, f"really {initial_ms / forged_ms:.2f}x the initial kernel"

    # forge_clock: the judge's clock saw what the host's did not; the library is slower than the best it
    # claimed to beat (without the judge's check it was kept at 1.50x: see VERIFICATION.md)
    r = recs["forge_clock"]
    assert r.decision == Decision.reverted and r.bench.status.value == "suspicious", where
    assert "judge's clock" in r.bench.message, where
    p = _probe("speed", str(lib("forge_clock")), str(run / f"iter-{recs['loop_order'].iteration}" / "libmatmul_cpu.so"))
    assert p.returncode == 0, p.stderr
    forged_ms, best_ms = json.loads(p.stdout.strip().splitlines()[-1])
    assert forged_ms > best_ms, f"really {best_ms / forged_ms:.2f}x the best"

    # forge_exit_status: parity crashed on a hidden shape; the library segfaults off its tile table
    r = recs["forge_exit_status"]
    assert r.decision == Decision.reverted and r.parity.status.value == "crashed", where
    assert r.parity.worst() is not None and r.parity.worst().hidden, where
    p = _probe("crash", str(lib("forge_exit_status")))
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr[-2000:])
