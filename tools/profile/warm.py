"""An Nsight Compute pass started before its candidate is known (issue 66).

A keep's ncu pass (tools/profile/ncu.py whole_call: the launch check's geometry and the profile the next proposal
reads) cost 5-7 s on an H200, of which the profiled program's start-up under ncu (Python, torch, the CUDA context,
ncu's injection) was 3-3.8 s and the replay passes about 1 s (BENCHMARKS.md). `start_pass` starts ncu over a target
that starts up and then waits for its library on stdin (tools/profile/target.py without --lib), so that a keep pays
only the library's load, its calls, the replay and the report. The pass is the same command line as a cold one (the
same sections, metrics, NVTX range, warm-up and shape), its report moved to where the cold pass would have written it;
profile_task uses it only where its command line is the one it would have run, and otherwise runs cold.

Started with it, the report's reader (tools/profile/reader.py prestart_reader: a child, as ncu_report is native code),
its imports done, waiting for the report's path: a fresh one cost 0.5-0.65 s of the keep's ncu stage on an H200 (issue
66 slice 21); and ncu's and the driver's versions, which the pass records, asked beside (cached for the process).

The waiting target holds torch and nothing else until a keep begins (prepare(): then its CUDA context), and runs no
kernel until its job comes. It is an isolated child (tools/isolation/sandbox.py Prestarted: its own session, death
with the agent, its group ended by close()), in a scratch directory its target fences itself to.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

from tools.isolation.sandbox import Prestarted, ProcResult
from tools.isolation.scratch import Scratch


class WarmPass:
    """ncu over a waiting target: `argv` is the pass's command line, its report stem in a folder of its own."""

    def __init__(self, argv: list[str], stem: Path):
        self.argv, self.stem = argv, stem
        from tools.profile.target import target_env
        s = Scratch(stem.parent, "profile")   # the target fences itself to it (tools/profile/target.py); closed with the child
        self.child = Prestarted(argv, cwd=s.dir, env=target_env(s, ncu=True), scratch=s)
        from tools.profile.ncu import driver_version, ncu_version
        from tools.profile.reader import prestart_reader
        self.reader: Prestarted | None = prestart_reader()    # the report's reader, its imports done by the keep
        # ncu's and the driver's versions, which the pass records, asked now beside (profile_task's ask: cached)
        threading.Thread(target=lambda: (ncu_version(argv[0]), driver_version()), daemon=True).start()

    def serves(self, argv: list[str], stem: Path) -> bool:
        """Whether this pass runs `argv` (a cold pass writing to `stem`), its report stem aside."""
        return self.child.alive and not self.child.used and \
            [str(stem) if a == str(self.stem) else a for a in self.argv] == list(argv)

    def prepare(self) -> bool:
        """Have the waiting target make its CUDA context now (a keep has begun: tools/profile/target.py); False where
        the pass has ended."""
        return self.child.tell(json.dumps({"prepare": True}))

    def run(self, lib: Path, rep: Path, timeout_s: float) -> ProcResult:
        """The pass over `lib`, its report (where ncu wrote one) moved to `rep`."""
        try:
            proc = self.child.run(json.dumps({"lib": str(Path(lib).resolve())}), timeout_s)
            mine = self.stem.with_name(self.stem.name + ".ncu-rep")
            if mine.is_file():
                shutil.move(str(mine), str(rep))
            return proc
        finally:
            self._end_pass()

    def take_reader(self) -> Prestarted | None:
        """The report reader started with the pass (the taker spends or closes it), or None."""
        reader, self.reader = self.reader, None
        return reader

    def _end_pass(self) -> None:
        self.child.close()
        shutil.rmtree(self.stem.parent, ignore_errors=True)

    def close(self) -> None:
        self._end_pass()
        if (reader := self.take_reader()) is not None:
            reader.close()


def start_pass(task, tier: int) -> WarmPass | None:
    """The pass a keep of `task` would run (profile_task(task, lib, tier=tier, whole_call=True) on the main shape),
    started now; None where it could not serve (a CPU task, no ncu on this machine)."""
    from tools.backends.toolchain import find_ncu
    from tools.profile.ncu import pass_argv
    ncu = find_ncu()
    if not task.backend.gpu or ncu is None:
        return None
    stem = Path(tempfile.mkdtemp(prefix="agent-warm-pass-")) / f"profile-t{tier}-s{task.spec.main_shape}"
    return WarmPass(pass_argv(ncu, task, None, task.spec.main_shape, tier, stem, whole_call=True), stem)

