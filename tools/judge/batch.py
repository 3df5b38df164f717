"""Parity and bench of many libraries, a batch per throwaway child (the parent side of
tools/judge/_batch_child.py). `agent sweep` measures hundreds of knob configurations this way.

Each library gets the loop's checks (parity with hidden shapes and a fresh seed; if it passes, the
interleaved bench against the baseline on the main shape), but a batch shares one process: the
torch import and the CUDA context are paid once per batch instead of twice per library.

What a bad kernel costs stays one configuration: the child reports each library as soon as it is
done; when it dies (a segfault, an illegal address, a hang past the watchdog or the batch timeout),
the library after the last one reported is marked crashed or timeout with the child's reason, and
the rest of the batch runs in a fresh child. After a failure that may poison the process (a CUDA
error, a write outside the output) the child stops by itself and the rest also gets a fresh one.
"""

from __future__ import annotations

import contextvars
import json
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from tools.measure.parity import child_failure
from tools.results import BatchItemResult, BatchStatus
from tools.isolation.sandbox import ProcResult, ProcStatus, python_env, run_isolated
from tools.isolation.scratch import Scratch
from tools.task import Task

CHILD = "tools.judge._batch_child"


class BatchError(Exception):
    """The batch child could not start at all (the task or the baseline library did not load)."""


def evaluate(task: Task, libs: list[Path], baseline: Path, *, batch: int = 16, limit_s: float | None = None,
             screen: bool = False, contexts: list[dict | None] | None = None, parity_only: bool = False,
             landed: Callable[[int, BatchItemResult], None] | None = None
             ) -> Iterator[list[tuple[int, BatchItemResult]]]:
    """Parity then bench of each library in `libs`, `batch` per child, in order. With `screen`, only
    a short timing of each alone (no parity, no baseline): a ranking hint for a huge space. With
    `parity_only`, no bench (`agent check --knobs`: is every allowed value right, not how fast).
    With `contexts` (one per library, agent.evaluation.evaluate.Evaluator.launch_context), each library's own
    launch plan first gets the static launch check in the child, and a rejected one runs nothing.

    Yields, after each child, the (index into libs, result) pairs it settled; every index is settled
    exactly once. `landed(index, result)`, where given, is called as each result the child writes lands (issue 66:
    a sweep reports each configuration then, not its batch at the end), from a thread of ours while the child runs
    (the caller waits in this generator meanwhile); the child-written pairs it was given are yielded again after
    the child, the parent-settled ones (the library a dead child was running) only there. `limit_s` bounds one
    library (default: the task's parity + bench timeouts, what the loop allows the two children it would run)."""
    limit = limit_s if limit_s is not None else task.spec.parity.timeout_s + task.spec.bench.timeout_s
    flags = ["--screen"] if screen else ["--parity-only"] if parity_only else []
    for start in range(0, len(libs), max(1, batch)):
        todo = list(range(start, min(start + max(1, batch), len(libs))))
        while todo:
            settled, todo = _run_child(task, libs, todo, baseline, limit, flags, contexts, landed)
            yield settled


def _run_child(task: Task, libs: list[Path], todo: list[int], baseline: Path, limit: float, flags: list[str],
               contexts: list[dict | None] | None = None, landed: Callable[[int, BatchItemResult], None] | None = None
               ) -> tuple[list[tuple[int, BatchItemResult]], list[int]]:
    """One child over `todo`; returns what it settled and what is left for a fresh child."""
    argv = [sys.executable, "-m", CHILD, "--task", str(task.root), "--baseline-lib", str(Path(baseline).resolve()),
            "--limit-s", str(limit), *flags]
    with tempfile.TemporaryDirectory(prefix="agent-batch-") as tmp:
        if contexts is not None:
            path = Path(tmp) / "contexts.json"
            path.write_text(json.dumps([contexts[i] for i in todo]))
            argv += ["--contexts", str(path)]
        watch = _Landing(Path(tmp) / "progress.jsonl", todo, landed) if landed is not None else None
        argv += ["--progress", str(watch.path)] if watch is not None else []
        argv += [str(Path(libs[i]).resolve()) for i in todo]
        # the watchdog bounds each library; the batch timeout is the backstop (plus one limit for the start)
        with Scratch(Path(tmp), "batch") as s:   # a sweep's libraries: not the user's checkout (nor the progress file)
            try:
                proc = run_isolated(argv, (len(todo) + 1) * limit, cwd=s.dir, env=python_env(None, s))
            finally:
                if watch is not None:
                    watch.stop()
    rows, stopped = parse_lines(proc, len(todo))
    settled = [(todo[k], r) for k, r in enumerate(rows)]
    rest = todo[len(rows):]
    if rest and not stopped:   # the child died while rest[0] ran
        spent = max(0.0, proc.seconds - sum(r.seconds for r in rows))
        status = BatchStatus.timeout if proc.status == ProcStatus.timeout else BatchStatus.crashed
        settled.append((rest[0], BatchItemResult(status=status, message=child_failure("evaluation", proc, None), seconds=spent)))
        rest = rest[1:]
    return settled, rest


class _Landing:
    """Reads the child's progress file (the lines it writes on its stdout, appended as written) while it runs, and
    hands each result to `landed` as it lands: on a thread of its own, polling every POLL_S."""
    POLL_S = 0.2

    def __init__(self, path: Path, todo: list[int], landed: Callable[[int, BatchItemResult], None]):
        self.path, self.todo, self.landed = path, todo, landed
        self.path.touch()
        self.offset, self.count, self.done = 0, 0, threading.Event()
        # in the caller's context: on a dask worker, its task's (where `landed`, the executor's landing channel, finds
        # the worker's client; a thread's own context is empty)
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), name="batch-landing",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.POLL_S):
            self._read()
        self._read()                            # what the child wrote last

    def _read(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(d, dict) or d.get("i") != self.count or self.count >= len(self.todo):
                continue
            d.pop("i")
            d.pop("stop", None)
            try:
                r = BatchItemResult.model_validate(d)
            except ValueError:
                continue
            self.landed(self.todo[self.count], r)
            self.count += 1

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def parse_lines(proc: ProcResult, n: int) -> tuple[list[BatchItemResult], bool]:
    """The results the child wrote, in order (at most n), and whether it stopped by itself after the last."""
    rows: list[BatchItemResult] = []
    stopped = False
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "fatal" in d:
            raise BatchError(f"{d['fatal']}; stderr: {proc.tail(4)}")
        if d.get("i") != len(rows) or len(rows) >= n:
            continue   # not a line of ours (the child writes its lines in order on a private stdout)
        stopped = bool(d.pop("stop", False))
        d.pop("i")
        rows.append(BatchItemResult.model_validate(d))
    return rows, stopped
