"""How much of a confirmation's parity is the judge process's first use of torch's kernels (lazy module loading,
library handles), issue 66: the same checked_parity (extent "rest", through a real host) three times in one process
(seeds 11, 12, 13), each under cProfile (its 14 costliest functions by own time). From the repository root:

    python3 -m tools.build kernels/TASK --build-dir /tmp/b --json        # its lib_path is LIB
    python3 scripts/device/first_use.py kernels/TASK LIB
"""
import cProfile, io, pstats, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa
from tools.judge.hostclient import HostClient, Remote
from tools.judge.judge import checked_parity
from tools.task import load_task

task = load_task(sys.argv[1]); mod = task.module(); task.backend.warm_up()
host = HostClient(task.root, Path(tempfile.mkdtemp(prefix="first-use-")))
try:
    host.ask({"op": "load", "id": "candidate", "path": str(Path(sys.argv[2]).resolve())})
    remote = Remote(host)
    for seed in (11, 12, 13):
        prof = cProfile.Profile(); t0 = time.monotonic(); prof.enable()
        par = checked_parity(task, mod, remote, {"seed": seed, "parity_extent": "rest"})
        prof.disable()
        print(f"== seed {seed}: {par.status.value} {len(par.checks)} checks in {time.monotonic() - t0:.2f} s")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print("\n".join(out.getvalue().splitlines()[6:24]))
finally:
    host.close()
