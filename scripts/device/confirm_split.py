"""The confirmation's parity stage taken apart on one library (issue 66): (A) parity alone in a judge warmed by
warm_checks, twice, (B) memcheck alone, racecheck alone (hosts started 12 s before), (C) all three at once as the judge
runs them. From the repository root, LIB as for scripts/device/first_use.py:

    python3 scripts/device/confirm_split.py kernels/TASK LIB

BENCHMARKS.md's figures (issue 66 slice 8) were taken with a warm-up that also ran the value draws and the misaligned
views; warm_checks now runs the listed distributions only (what quick parity runs).
"""
import sys, tempfile, threading, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa
from tools.judge.hostclient import HostClient, Remote
from tools.judge.judge import checked_parity
from tools.judge.sanitize import memcheck, start_hosts
from tools.measure.warmup import warm_checks
from tools.task import load_task

task = load_task(sys.argv[1]); mod = task.module(); task.backend.warm_up(); lib = str(Path(sys.argv[2]).resolve())
root = Path(tempfile.mkdtemp(prefix="fu2-"))
print(warm_checks(task, mod, waiting=lambda: False), flush=True)
host = HostClient(task.root, root)
host.ask({"op": "load", "id": "candidate", "path": lib}); remote = Remote(host)
def par(seed):
    t0 = time.monotonic(); p = checked_parity(task, mod, remote, {"seed": seed, "parity_extent": "rest"})
    return f"parity {p.status.value} {len(p.checks)} checks {time.monotonic() - t0:.2f} s"
print("A", par(11), "|", par(12), flush=True)
def san(check, started, seed, out):
    t0 = time.monotonic(); r = memcheck(task, mod, {"lib": lib}, root, seed, check, started=started)
    out.append(f"{check} {r['status']} {r.get('shapes')} shapes {time.monotonic() - t0:.2f} s")
hosts = start_hosts(task.root, root)
if not hosts:   # no compute-sanitizer on this machine: parity alone is all there is
    host.close()
    sys.exit(0)
time.sleep(12)
for c in ("memcheck", "racecheck"):
    o = []; san(c, hosts[c], 5, o); print("B", o[0], flush=True)
hosts = start_hosts(task.root, root); time.sleep(12)
o = []; th = [threading.Thread(target=san, args=(c, hosts[c], 6, o)) for c in ("memcheck", "racecheck")]
t0 = time.monotonic(); [t.start() for t in th]; p = par(13); [t.join() for t in th]
print("C", p, "|", " | ".join(o), f"| stage {time.monotonic() - t0:.2f} s", flush=True)
host.close()
