"""The Nsight Compute pass's target behind the Landlock fence, on the GPU box (issue 66 slice 14):

    python3 scripts/device/fenced_target.py [TASK]        # default attention_fwd

Copies the task, appends to its Python a write by absolute path outside the process's scratch directory (and one into
its HOME), builds it, and profiles it the three ways the agent does: a cold whole-call pass (tools/profile/ncu.py, as
`agent profile` and a keep without a held pass), a pass started before its library is known and prepared as a keep
prepares it (tools/profile/warm.py), and the torch-profiler fallback's trace (tools/profile/fallback.py). For each:
the status, the kernels ncu found, the seconds, whether the outside write landed (it must not) and what the scratch
directory held when it closed. Writes $OUT/fenced_target.txt.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ESCAPE = '''
import os as _os
if _os.environ.get("FENCE_PROBE"):
    try:
        open(_os.environ["FENCE_PROBE"], "a").write(f"{_os.getpid()} wrote outside\\n")
    except (OSError, KeyError):
        pass
    try:
        open(_os.path.join(_os.environ["HOME"], "inside"), "w").write("in its scratch directory")
    except OSError:
        pass
'''


def main() -> int:
    from parity_costs import built
    from tools.isolation.scratch import drain
    from tools.profile.fallback import profile_fallback
    from tools.profile.ncu import profile_task
    from tools.profile.warm import start_pass
    from tools.task import load_task
    name = sys.argv[1] if len(sys.argv) > 1 else "attention_fwd"
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="fenced-target-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fenced-target-"))
    d, b = built(name, {}, work)
    (d / "task.py").write_text((d / "task.py").read_text() + ESCAPE)
    probe = work / "outside.txt"
    os.environ["FENCE_PROBE"] = str(probe)
    task = load_task(d)
    lines = [f"{name}: {b.lib_path}"]

    def report(label, rep, t0):
        ks = [k.name[:40] for k in rep.kernels]
        landed = probe.read_text().strip() if probe.exists() else ""
        files = [f.path for f in drain()]
        lines.append(f"{label}: {rep.status.value} in {time.monotonic() - t0:.2f} s; kernels {ks}; "
                     f"outside write: {landed or 'none'}; scratch held {files}; {rep.message[:160]}")
        probe.unlink(missing_ok=True)

    drain()
    t0 = time.monotonic()
    report("cold whole-call pass", profile_task(task, b.lib_path, tier=1, whole_call=True, out_dir=work / "p1",
                                                timeout_s=300), t0)
    warm = start_pass(task, 1)
    time.sleep(8)          # its target starts up and waits, as while a candidate builds
    warm.prepare()
    time.sleep(2)
    t0 = time.monotonic()
    report("pass started early", profile_task(task, b.lib_path, tier=1, whole_call=True, out_dir=work / "p2",
                                              timeout_s=300, warm=warm), t0)
    t0 = time.monotonic()
    report("torch-profiler fallback", profile_fallback(task, b.lib_path, timeout_s=300, out_dir=work / "p3"), t0)
    text = "\n".join(lines)
    print(text)
    (out / "fenced_target.txt").write_text(text + "\n")
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
