"""The attention adversaries of issue 40 through the real loop, on the GPU box:

    python scripts/device/verify_attention.py [NAME ...]     # from the repo root; default all 18, then two honest moves

Makes a user repository (a real git repo in a temp dir) holding kernels/attention_fwd with shorter bench budgets,
writes each tests/fixtures/cuda_cheats/attention/*.cu as a replay proposal (a whole-file rewrite of attention.cu),
and pushes them all, then two honest faster moves (SMEM_PAD 0 -> 2: the K reads conflict-free; then WMMA tensor cores),
through ONE real loop run (`agent optimize --proposer replay`). Every adversary must not be kept; the honest moves
must be. Per iteration it records the outcome, the stage status that caught it and the reason: which probe caught
which form (tests/fixtures/cuda_cheats/attention/README.md says which should).

The loop is given LOOP_S seconds (env, default 540) and killed after: the iterations recorded by then are still
read. Writes $OUT/verify_attention.json and prints a table, then one summary line last. Exit 0 when nothing
adversarial was kept and the honest moves were.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent.proposal import Edit, PredictedEffect, Proposal   # noqa: E402
from agent.records.store import read_config, read_iterations, read_state   # noqa: E402
from verify_gpu import _device, _stage, git, initial_wide, make_user_repo, snapshot, wide_seconds   # noqa: E402

CHEATS = REPO / "tests" / "fixtures" / "cuda_cheats" / "attention"
TASK = REPO / "kernels" / "attention_fwd"
# honest faster moves after the adversaries, each on the one before (the heuristic's kept moves, BENCHMARKS.md)
HONEST = [("smem_pad_2", "SMEM_PAD 0 -> 2 (conflict-free K reads)", [("#define SMEM_PAD 0 ", "#define SMEM_PAD 2 ")]),
          ("tensor_cores", "WMMA tensor cores (SMEM_PAD 8, USE_TENSOR_CORES 1)",
           [("#define SMEM_PAD 2 ", "#define SMEM_PAD 8 "), ("#define USE_TENSOR_CORES 0 ", "#define USE_TENSOR_CORES 1 ")])]
TOML_FAST = {r"seeds = 2\nhidden_shapes = 2\n": "seeds = 1\nhidden_shapes = 1\n",
             r"\[bench\]\nwarmup_ms = 25\nrep_ms = 100\n": "[bench]\nwarmup_ms = 10\nrep_ms = 30\nrounds = 6\n"
                                                          "input_sets = 2\n"}


def cases(names: list[str]) -> list[tuple[str, str, str, list]]:
    out = []
    for name in names:
        text = (CHEATS / f"{name}.cu").read_text()
        out.append((name, "cheat", text.splitlines()[0].split(":", 1)[1].strip(), [(None, text)]))
    src = (TASK / "attention.cu").read_text()
    for name, what, edits in HONEST:
        for a, b in edits:
            assert src.count(a) == 1, f"{name}: the search text {a!r} is not unique"
            src = src.replace(a, b)
        out.append((name, "good", what, edits))
    return out


def main() -> int:
    names = sys.argv[1:] or sorted(p.stem for p in CHEATS.glob("*.cu"))
    todo = cases(names)
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="verify-attention-out-"))
    work = Path(tempfile.mkdtemp(prefix="verify-attention-"))
    root = make_user_repo(work / "user", "attention_fwd", TOML_FAST)
    before = snapshot(root)
    props = work / "attention_cheats.json"
    props.write_text(json.dumps([Proposal(
        hypothesis=f"[{name}] {pattern}", predicted=PredictedEffect(metric="time.median_ms", direction="down",
                                                                      speedup=2.0),
        edits=[Edit(file="attention.cu", content=r) if s is None else Edit(file="attention.cu", search=s, replace=r)
               for s, r in edits]).model_dump() for name, _, pattern, edits in todo]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    timed_out = False
    try:
        res = subprocess.run([sys.executable, "-m", "agent", "optimize", "kernels/attention_fwd", "--proposer",
                              "replay", "--replay", str(props), "--iters", str(len(todo)), "--target", "100x",
                              "--quiet", "--run-id", "verify"], cwd=root, env=env, capture_output=True, text=True,
                             timeout=float(os.environ.get("LOOP_S", "540")))
        rc, tail = res.returncode, (res.stderr or res.stdout)[-1500:]
    except subprocess.TimeoutExpired:
        timed_out, rc, tail = True, None, "timed out"
    elapsed = time.monotonic() - t0
    run = root / "runs" / "verify"
    recs = read_iterations(run) if (run / "iterations.jsonl").exists() else []
    problems = [] if rc == 0 else [f"the loop exited with {rc}: {tail}"]
    rows = []
    for i, (name, kind, pattern, _) in enumerate(todo):
        rec = recs[i] if i < len(recs) else None
        if rec is None:
            rows.append({"pattern": name, "kind": kind, "outcome": "missing", "status": "-", "kept": False,
                         "reason": "no record", "seconds": None, "ok": False})
            continue
        st = _stage(rec, rec.outcome.value)
        kept = rec.decision.value == "kept"
        ok = kept == (kind == "good")
        rows.append({"pattern": name, "kind": kind, "description": pattern, "outcome": rec.outcome.value,
                     "status": st.status.value if st is not None else "-", "kept": kept, "reason": rec.reason[:400],
                     "seconds": rec.wall_s and round(rec.wall_s, 1), "wide_s": wide_seconds(rec), "ok": ok})
        if not ok:
            problems.append(f"{name}: {'kept' if kept else 'not kept'}: {rec.outcome.value}: {rec.reason[:200]}")
    missing = [r["pattern"] for r in rows if r["outcome"] == "missing"]
    if missing:
        problems.append(f"no record for {', '.join(missing)}{' (the loop ran out of time)' if timed_out else ''}")
    if (run / "state.json").exists():
        cfg, state = read_config(run), read_state(run)
        if git(root, "rev-parse", cfg.branch) != state.best_sha:
            problems.append("the run's branch is not at its best commit")
    if snapshot(root) != before:
        problems.append("the user's checkout changed")
    dev = _device()
    result = {"device": dev, "seconds": round(elapsed, 1), "rows": rows, "problems": problems, "ok": not problems,
              "initial_wide": initial_wide(run)}
    print(f"the initial kernel on the 2^31-element shape: {result['initial_wide']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_attention.json").write_text(json.dumps(result, indent=2))
    for src, name in ((run / "iterations.jsonl", "iterations.jsonl"), (run / "initial" / "parity.json", "parity.json"),
                      (run / "initial" / "bench.json", "bench.json")):
        if src.exists():   # the records, with each check's and each probe's seconds
            shutil.copy(src, out / f"verify_attention_{name}")
    print(f"{'pattern':24s} {'kind':5s} {'outcome':16s} {'status':14s} kept  {'s':>6s} ok  reason")
    for r in rows:
        print(f"{r['pattern']:24s} {r['kind']:5s} {r['outcome']:16s} {r['status']:14s} {str(r['kept']):5s} {r['seconds']!s:>6s} "
              f"{'yes' if r['ok'] else 'NO':3s} wide {r.get('wide_s')!s:>6s}s {r['reason'][:160]}")
    for p in problems:
        print(f"PROBLEM: {p}")
    print(f"verify_attention on {dev}: {sum(r['ok'] for r in rows)}/{len(rows)} as expected, "
          f"{sum(r['kept'] for r in rows if r['kind'] != 'good')} adversaries kept, {elapsed:.0f}s: "
          f"{'OK' if not problems else 'FAILED'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
