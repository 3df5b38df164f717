"""Issue 43 on the device: the scripted conversation of a model that repairs its own candidate, on the softmax task,
through `agent optimize --proposer llm`, the real openai client and a local scripted server (tests/fake_openai.py).

The model's four answers, each a mistake a strong model makes by accident, then the kernel it meant:

1. `typo`: x read once into registers for rows that fit (16-byte vectors), with a semicolon dropped: compile_failed.
2. `smem_row`: instead, the row staged in shared memory as fp32 (N floats a CTA): fine on the main shape (16 KiB),
   1 MiB on the 262144-wide rows: launch_rejected by the static check on every shape (the opt-in limit).
3. `no_tail`: the register kernel again, its write pass without the scalar tail: the last elements of misaligned
   rows are never written: parity_failed.
4. `right`: the register kernel: x read once for rows of up to GROUP * REG_VECS vectors, 16-byte vectors everywhere.

    python3 scripts/device/repair_softmax.py [OUT_DIR [WORK_DIR]]

prints one line per attempt (outcome, seconds) and the verdict, writes OUT_DIR/repair_softmax.json and the run's
records (no libraries) as OUT_DIR/run.tar.gz. The
CPU half (tests/test_llm_repair.py) builds `smem_row` with nvcc and checks that the static launch check refuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

YR = "    __half* yr = y + (r < M ? r : 0) * (long long)N;\n"
PLAN = "    const int plan[7] = {(int)grid_x, 1, 1, THREADS, 1, 1, 0};"
VEC = ("#define VEC 1 ", "#define VEC 8 ")


def _register_path(tail: bool = True, typo: bool = False) -> str:
    end = "" if typo else ";"
    write_tail = ("        for (int i = sp.tail_start + gl; i < n; i += GROUP) "
                  "yr[i] = __float2half(__expf(__half2float(xr[i]) - m_row) * inv);\n") if tail else ""
    return YR + f"""
    // Rows of at most GROUP * REG_VECS vectors: x read once into registers, reduced there and written from there.
    // The test is on N alone (the same for every row of the CTA, rows past M included), so the whole CTA takes one
    // branch and the reductions' __syncthreads stay uniform.
    if (N / VEC <= GROUP * REG_VECS) {{
        const RowSplit sp = split_row(xr, n);
        const VecType<VEC>::T* xv = reinterpret_cast<const VecType<VEC>::T*>(xr + sp.head);
        Pack cache[REG_VECS];
        float m = -INFINITY;
        for (int i = gl; i < sp.head; i += GROUP) m = fmaxf(m, h2f(__half_as_ushort(xr[i])));
#pragma unroll
        for (int k = 0; k < REG_VECS; ++k) {{
            if (gl + k * GROUP < sp.nvec) {{
                cache[k].v = xv[gl + k * GROUP];
#pragma unroll
                for (int e = 0; e < VEC; ++e) m = fmaxf(m, h2f(cache[k].u[e]));
            }}
        }}
        for (int i = sp.tail_start + gl; i < n; i += GROUP) m = fmaxf(m, h2f(__half_as_ushort(xr[i])));
        const float m_row = group_max(m, red[0]){end}
        float s = 0.f;
        for (int i = gl; i < sp.head; i += GROUP) s += __expf(h2f(__half_as_ushort(xr[i])) - m_row);
#pragma unroll
        for (int k = 0; k < REG_VECS; ++k) {{
            if (gl + k * GROUP < sp.nvec) {{
#pragma unroll
                for (int e = 0; e < VEC; ++e) s += __expf(h2f(cache[k].u[e]) - m_row);
            }}
        }}
        for (int i = sp.tail_start + gl; i < n; i += GROUP) s += __expf(h2f(__half_as_ushort(xr[i])) - m_row);
        const float inv = 1.f / group_sum(s, red[1]);
        VecType<VEC>::T* yv = reinterpret_cast<VecType<VEC>::T*>(yr + sp.head);
        for (int i = gl; i < sp.head; i += GROUP) yr[i] = __float2half(__expf(__half2float(xr[i]) - m_row) * inv);
#pragma unroll
        for (int k = 0; k < REG_VECS; ++k) {{
            if (gl + k * GROUP < sp.nvec) {{
#pragma unroll
                for (int e = 0; e < VEC; ++e) cache[k].u[e] = f2h(__expf(h2f(cache[k].u[e]) - m_row) * inv);
                yv[gl + k * GROUP] = cache[k].v;
            }}
        }}
{write_tail}        return;
    }}
"""


REG_VECS = ("#define ONLINE 0 ", "#define REG_VECS 4            // vectors per thread held in registers\n#define ONLINE 0 ")

SMEM_ROW = YR + """
    // Stage the row in shared memory as fp32 once: the max, sum and write passes read it there instead of from DRAM.
    extern __shared__ float row_s[];
    float* rs = row_s + (threadIdx.x / GROUP) * N;
    for (int i = gl; i < n; i += GROUP) rs[i] = __half2float(xr[i]);
    __syncthreads();
    float mx = -INFINITY;
    for (int i = gl; i < n; i += GROUP) mx = fmaxf(mx, rs[i]);
    const float mrow = group_max(mx, red[0]);
    float sm = 0.f;
    for (int i = gl; i < n; i += GROUP) sm += __expf(rs[i] - mrow);
    const float rinv = 1.f / group_sum(sm, red[1]);
    for (int i = gl; i < n; i += GROUP) yr[i] = __float2half(__expf(rs[i] - mrow) * rinv);
    return;
"""
SMEM_PLAN = "    const int plan[7] = {(int)grid_x, 1, 1, THREADS, 1, 1, ROWS_PER_CTA * N * (int)sizeof(float)};"


def _proposal(hyp: str, speedup: float, *edits: tuple[str, str]) -> dict:
    return {"hypothesis": hyp,
            "evidence": [{"metric": "dram__bytes_read.sum", "value": "about 3x the input: x is read in three passes"},
                         {"metric": "knob.VEC", "value": "1 (2-byte loads)"}],
            "predicted": {"metric": "gpu__time_duration.sum", "direction": "down", "speedup": speedup},
            "edits": [{"file": "softmax.cu", "search": s, "replace": r} for s, r in edits]}


HYP = ("The kernel reads x three times with 2-byte loads; for rows that fit (N up to GROUP*REG_VECS*VEC), hold the "
       "row in registers after one 16-byte-vector read and reduce and write from there: x read once, DRAM traffic "
       "from about 4 to 2 bytes an element")
ANSWERS = {
    "typo": _proposal(HYP, 1.8, VEC, REG_VECS, (YR, _register_path(typo=True))),
    "smem_row": _proposal("Stage each row in shared memory as fp32 in one read, then max, sum and write from there: "
                          "x read once", 1.6, (YR, SMEM_ROW), (PLAN, SMEM_PLAN)),
    "no_tail": _proposal(HYP, 1.8, VEC, REG_VECS, (YR, _register_path(tail=False))),
    "right": _proposal(HYP, 1.8, VEC, REG_VECS, (YR, _register_path())),
}
EXPECTED = ["compile_failed", "launch_rejected", "parity_failed"]


def apply(src: str, answer: dict) -> str:
    for e in answer["edits"]:
        assert src.count(e["search"]) == 1, e["search"][:60]
        src = src.replace(e["search"], e["replace"])
    return src


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def main(out: Path, work: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from agent.records.store import read_iterations
    from tests.fake_openai import FakeOpenAI
    user = work / "user"
    shutil.rmtree(user, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "kernels" / "softmax", user / "kernels" / "softmax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _git(user, "init", "-q", "-b", "main")
    with FakeOpenAI() as srv:
        (user / "pyproject.toml").write_text(f'[tool.agent]\nbase_url = "{srv.base_url}"\nmodel = "scripted-strong"\n'
                                             "timeout_s = 30\nmax_attempts = 2\n")
        _git(user, "add", "-A")
        _git(user, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "softmax")
        for name in ("typo", "smem_row", "no_tail", "right"):
            srv.push_proposal(ANSWERS[name])
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "agent", "optimize", "kernels/softmax", "--proposer", "llm",
                              "--iters", "1", "--repairs", "3", "--run-id", "repair", "--quiet"], cwd=user,
                             capture_output=True, text=True, timeout=560,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        wall = time.monotonic() - t0
        requests = len(srv.chat_requests)
    print(res.stdout[-1500:], res.stderr[-2500:], sep="\n")
    recs = read_iterations(user / "runs" / "repair")
    rows = []
    if recs:
        r = recs[0]
        for a in r.attempts:
            rows.append({"attempt": a.attempt, "outcome": a.outcome.value, "seconds": a.seconds,
                         "reason": a.reason[:300]})
        rows.append({"attempt": len(r.attempts) + 1, "outcome": r.outcome.value,
                     "seconds": round((r.wall_s or 0) - sum(a.seconds or 0 for a in r.attempts), 1),
                     "reason": r.reason[:300]})
        for row in rows:
            print(f"attempt {row['attempt']}: {row['outcome']} in {row['seconds']} s: {row['reason']}")
        print(f"iteration: {r.outcome.value} in {r.wall_s} s wall, {requests} requests; run {wall:.1f} s")
    # the run's records (no libraries, no build folders), in one archive: docs/TRANSCRIPT.md is rendered from them
    import tarfile
    run = user / "runs" / "repair"
    with tarfile.open(out / "run.tar.gz", "w:gz") as tar:
        for f in sorted(run.rglob("*")):
            if f.is_file() and f.suffix in (".json", ".jsonl", ".diff", ".log", ".md") and f.stat().st_size < 2_000_000:
                tar.add(f, arcname=str(Path("repair") / f.relative_to(run)))
    summary = {"rc": res.returncode, "wall_s": round(wall, 1), "requests": requests, "attempts": rows}
    (out / "repair_softmax.json").write_text(json.dumps(summary, indent=1))
    ok = bool(recs) and [r["outcome"] for r in rows[:-1]] == EXPECTED and rows[-1]["outcome"] == "kept"
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    args = sys.argv[1:] + ["/tmp/repair_softmax", "/tmp/repair_softmax_work"][len(sys.argv) - 1:]
    sys.exit(main(Path(args[0]), Path(args[1])))
