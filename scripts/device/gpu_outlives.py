"""Can a candidate's GPU work outlive its host, and what does the next kernel's measurement see then (issue 40)?
On the GPU box:

    python scripts/device/gpu_outlives.py           # from the repo root; about 60 s

A process stands in for a candidate's host: it makes a CUDA context, queues a kernel that spins for SPIN_S seconds
(torch.cuda._sleep), and is killed with SIGKILL, as the judge kills a host. Twice: once alone, and once after it
forked a child (setsid, out of its process group) that does nothing but hold the process's open device files, as a
host without the no-fork filter could (tools/isolation/nofork.py). After each kill this process measures the
committed softmax as the side-stream probe does (the bench's per-call events, a burst with a device-wide sync, the
events around that burst) and lists the GPU's compute processes (nvidia-smi), every second until the spin's time
is over; then the judge's own check of the honest softmax (tools.judge.candidate.run_candidate, the loop's initial
measurement) once beside the orphan. Writes $OUT/gpu_outlives.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "device"))

from side_stream_neighbour import measure, softmax_built   # noqa: E402
from tools.judge.candidate import run_candidate   # noqa: E402

SPIN_S = 8.0
HOST = ("import os, sys, time, torch\n"
        "torch.ones(1, device='cuda'); torch.cuda.synchronize()\n"
        "torch.cuda._sleep(int(float(sys.argv[1]) * 1.9e9))   # cycles: about 1.9 GHz under load\n"
        "if sys.argv[2] == 'fork':\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.setsid(); time.sleep(float(sys.argv[1]) + 5); os._exit(0)\n"
        "    print('child', pid, flush=True)\n"
        "print('queued', os.getpid(), flush=True)\n"
        "time.sleep(600)\n")


def apps() -> list[str]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return [x.strip() for x in r.stdout.splitlines() if x.strip()]
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"nvidia-smi: {e}"]


def case(label: str, how: str, torch, mod, lib, shape, task, lib_path, work) -> dict:
    p = subprocess.Popen([sys.executable, "-c", HOST, str(SPIN_S), how], stdout=subprocess.PIPE, text=True)
    child = None
    for line in p.stdout:
        if line.startswith("child"):
            child = int(line.split()[1])
        if line.startswith("queued"):
            break
    time.sleep(0.5)   # the spin is running
    before = apps()
    t0 = time.monotonic()
    p.kill()
    p.wait()
    reaped = time.monotonic() - t0
    rows = []
    judged = None
    while time.monotonic() - t0 < SPIN_S + 3:
        r = {"t_s": round(time.monotonic() - t0, 2), "apps": apps(), **measure(torch, mod, lib, shape)}
        rows.append(r)
        print(f"{label:10s} t={r['t_s']:5.2f}s bench {r['bench_us']:9.1f} us wall {r['wall_us']:9.1f} us span "
              f"{r['span_us']:9.1f} us apps {r['apps']}", flush=True)
        if judged is None and how == "fork":
            _, par, bench, _ = run_candidate(task, lib_path, None, with_reference=True, scratch_root=work / "s")
            ok = par.status.value == "ok" and bool(bench) and bench[0].status.value == "ok"
            judged = {"t_s": round(time.monotonic() - t0, 2), "refused": not ok,
                      "message": (par.message if par.status.value != "ok" else bench[0].message if bench else "")[:400]}
            print(f"{label:10s} judge's check of the honest softmax beside the orphan: "
                  f"{'REFUSED' if not ok else 'ok'} {judged['message'][:300]}", flush=True)
        time.sleep(0.5)
    if child is not None:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"case": label, "apps_before_kill": before, "reaped_s": round(reaped, 3), "rows": rows, "judge": judged,
            "child": child}


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-outlives-out-"))
    work = Path(tempfile.mkdtemp(prefix="gpu-outlives-"))
    task, b, mod, lib, shape = softmax_built(work)
    import torch
    quiet = measure(torch, mod, lib, shape)
    print(f"quiet      bench {quiet['bench_us']:9.1f} us wall {quiet['wall_us']:9.1f} us span {quiet['span_us']:9.1f} us",
          flush=True)
    res = {"device": torch.cuda.get_device_name(), "quiet": quiet, "spin_s": SPIN_S,
           "cases": [case("killed", "alone", torch, mod, lib, shape, task, Path(b.lib_path), work),
                     case("orphan", "fork", torch, mod, lib, shape, task, Path(b.lib_path), work)]}
    (out / "gpu_outlives.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
