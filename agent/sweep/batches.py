"""The built configurations through parity and the bench against the initial, in chunks on an executor (a chunk is
what one worker runs: evaluate_chunk, sent to dask workers by reference), and the --screen's short timing first."""

from __future__ import annotations

import json
import math
import queue
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from agent.evaluation.executor import Executor, Local, pack_folder, unpack_folder
from agent.sweep.build import Built
from agent.sweep.points import SweepPoint, one_line
from tools.judge import batch as batch_eval
from tools.results import BatchItemResult, BatchStatus
from tools.task import Task, load_task


@dataclass(frozen=True)
class Chunk:
    """Configurations evaluated together on one worker: their libraries (paths here; for a dask worker their bytes, so
    that a worker on another host needs none of this host's files), launch contexts and numbers in `built`."""
    libs: list[str]
    contexts: list[dict | None]
    indices: list[int]
    data: list[bytes] | None = None


@dataclass(frozen=True)
class Shipped:
    """What every chunk sent to a dask worker needs besides its libraries: the task's folder and the initial library."""
    task: bytes
    baseline: bytes
    name: str                 # the libraries' file name


def evaluate_chunk(task_root: str, baseline: str, batch: int, chunk: Chunk, shipped: Shipped | None = None,
                   landed: Callable[[int, BatchItemResult], None] | None = None) -> list[tuple[int, BatchItemResult]]:
    """What a worker runs (or this process, with the local executor): parity and the bench against the initial of each
    library of the chunk, `batch` per throwaway child (tools/judge/batch.py). With `shipped`, from the bytes it carries,
    unpacked in a folder of the worker's own that is removed after."""
    if shipped is None:
        return _evaluate_chunk(Path(task_root), Path(baseline), [Path(p) for p in chunk.libs], batch, chunk, landed)
    with tempfile.TemporaryDirectory(prefix="agent-chunk-") as tmp:
        root = unpack_folder(shipped.task, Path(tmp) / "task")
        (Path(tmp) / "initial").mkdir()
        base = Path(tmp) / "initial" / shipped.name
        base.write_bytes(shipped.baseline)
        libs = []
        for k, data in enumerate(chunk.data or []):
            (Path(tmp) / f"cfg-{k}").mkdir()
            libs.append(Path(tmp) / f"cfg-{k}" / shipped.name)
            libs[-1].write_bytes(data)
        return _evaluate_chunk(root, base, libs, batch, chunk, landed)


def _send(put: Callable[[str], None], k: int, r: BatchItemResult) -> None:
    """A chunk's result as it lands, to the executor's landing channel (agent/evaluation/executor.py: on a dask
    worker, through the scheduler): text."""
    put(json.dumps([k, r.model_dump(mode="json")]))


def _evaluate_chunk(root: Path, baseline: Path, libs: list[Path], batch: int, chunk: Chunk,
                    landed: Callable[[int, BatchItemResult], None] | None = None) -> list[tuple[int, BatchItemResult]]:
    task = load_task(root)
    out: list[tuple[int, BatchItemResult]] = []
    each = None if landed is None else (lambda k, r: landed(chunk.indices[k], r))
    for settled in batch_eval.evaluate(task, libs, baseline, batch=batch, contexts=chunk.contexts, landed=each):
        out += [(chunk.indices[k], r) for k, r in settled]
    return out


def evaluate_built(task: Task, built: list[Built], base_lib: Path, batch: int, ex: Executor,
                   record: Callable[[SweepPoint], None], saved: Callable[[], None],
                   say: Callable[[str], None] = lambda _: None) -> None:
    """Every built configuration through parity and the bench, in chunks: `batch` each here; on several workers an
    equal share each (at most `batch`), so that the workers finish together. A chunk whose worker died twice is
    recorded as lost, configuration by configuration."""
    local = isinstance(ex, Local)
    size = batch if local else max(1, min(batch, math.ceil(len(built) / ex.workers)))
    chunks = [Chunk(libs=[str(b.lib) for b in built[i:i + size]], contexts=[b.launch_context for b in built[i:i + size]],
                    indices=list(range(i, min(i + size, len(built)))),
                    data=None if local else [b.lib.read_bytes() for b in built[i:i + size]])
              for i in range(0, len(built), size)]
    shipped = None if local else Shipped(task=pack_folder(task.root), baseline=base_lib.read_bytes(), name=base_lib.name)
    seen: set[int] = set()
    lock = threading.Lock()    # the landing channel's thread and the chunks' ends both hand results over

    def first(k: int) -> bool:
        """Whether k is settled now, not already (each configuration is recorded once)."""
        with lock:
            new = k not in seen
            seen.add(k)
            return new

    def land(k: int, r: BatchItemResult, worker: str) -> None:
        if not first(k):
            return
        built[k].launch = r.launch or built[k].launch
        p = _point(built[k], r)
        p.worker = "" if ex.workers <= 1 and worker == "local" else worker
        record(p)
        if r.status != BatchStatus.ok:
            built[k].lib.unlink(missing_ok=True)   # only the passing ones are kept for a second look

    def heard(text: str, worker: str) -> None:
        k, r = json.loads(text)
        land(k, BatchItemResult.model_validate(r), worker)

    if built:
        say(f"evaluating {len(built)} configurations in {len(chunks)} chunk(s) of up to {size} on {ex.where} "
            "(parity, then the bench against the initial; each reports as it lands)")

    def started(n: int, worker: str) -> None:
        if not local:
            say(f"chunk {n + 1}/{len(chunks)} ({len(chunks[n].indices)} configurations) started on {worker}")
    # each configuration is recorded as its result lands (issue 66), here or on a dask worker (through the
    # executor's landing channel); a chunk's end hands over what did not land so
    with ex.landing(heard) as put:
        fn = partial(evaluate_chunk, str(task.root), str(base_lib), batch, shipped=shipped, landed=partial(_send, put))
        for done in ex.run(fn, chunks, started=started):
            if done.error is not None:
                raise done.error
            if done.lost:
                for k in (k for k in chunks[done.index].indices if first(k)):
                    b = built[k]
                    record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome="lost", reason=done.lost,
                                      build_seconds=b.build_seconds, seconds=b.seconds, worker=done.worker))
                saved()
                continue
            for k, r in done.value:
                land(k, r, done.worker)
            saved()


def screen_built(task: Task, chunks: Iterable[list[Built]], base_lib: Path, keep: int, batch: int,
                 record: Callable[[SweepPoint], None], say: Callable[[str], None], total: int,
                 beside: bool = True) -> list[Built]:
    """A short timing of each alone, chunk by chunk as `chunks` gives them (`beside`: the sweep's builds still under
    way, agent/sweep/run.py); returns the `keep` fastest. A configuration that fails the screen (crash, hang, wrong in
    the bench's spot checks) is recorded with that outcome; the others that are not kept, as screened_out."""
    say(f"screening {total} configurations by a short timing {'as they are built' if beside else 'once built'}; "
        f"the {keep} fastest get the full checks")
    timed: list[Built] = []
    count = 0
    for chunk in chunks:
        seen: set[int] = set()

        def land(k: int, r: BatchItemResult, chunk: list[Built] = chunk, seen: set[int] = seen) -> None:
            nonlocal count     # as each lands (issue 66): a line, not minutes of silence
            seen.add(k)
            count += 1
            b = chunk[k]
            b.seconds += r.seconds
            b.launch = r.launch or b.launch
            cand = r.bench.timing("candidate") if r.bench is not None else None
            if r.status == BatchStatus.ok and cand is not None:
                b.screen_ms = cand.median_ms
                timed.append(b)
                say(f"[screen {count}/{total}] {b.knobs} {b.screen_ms * 1e3:.1f} us alone ({r.seconds:.2f} s)")
            else:
                b.lib.unlink(missing_ok=True)
                record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome=r.status.value,
                                  reason="on the screen: " + one_line(r.message), build_seconds=b.build_seconds,
                                  eval_seconds=r.seconds, seconds=b.seconds))
        for settled in batch_eval.evaluate(task, [c.lib for c in chunk], base_lib, batch=batch, screen=True,
                                           contexts=[c.launch_context for c in chunk], landed=land):
            for k, r in settled:
                if k not in seen:
                    land(k, r)
    timed.sort(key=lambda b: b.screen_ms)
    for b in timed[keep:]:
        b.lib.unlink(missing_ok=True)
        record(SweepPoint(knobs=b.knobs, index=b.index, ok=False, outcome="screened_out", screen_ms=b.screen_ms,
                          reason=f"screen: {b.screen_ms * 1e3:.1f} us alone, not among the {keep} fastest "
                                 f"(the slowest kept: {timed[keep - 1].screen_ms * 1e3:.1f} us)",
                          build_seconds=b.build_seconds, eval_seconds=b.seconds - b.build_seconds, seconds=b.seconds))
    return sorted(timed[:keep], key=lambda b: b.index)


def as_built(q: queue.Queue, least: int, most: int, ready: Callable[[], object] = lambda: None
             ) -> Iterator[list[Built]]:
    """The configurations put on `q` as they are built (None: no more), in chunks for screen_built: `least` at least
    (a batch child's start, about 1 s, shared by that many) unless the builds are done, and at most `most`. `ready()`
    is called first (the initial's parity: its kernels off the GPU before any timing; what it raises ends the screen)."""
    ready()
    buf: list[Built] = []
    done = False
    while not done:
        while len(buf) < least:
            b = q.get()
            if b is None:
                done = True
                break
            buf.append(b)
        while not done and len(buf) < most:
            try:
                b = q.get_nowait()
            except queue.Empty:
                break
            if b is None:
                done = True
            else:
                buf.append(b)
        if buf:
            yield sorted(buf, key=lambda b: b.index)
            buf = []


def _point(b: Built, r: BatchItemResult) -> SweepPoint:
    p = SweepPoint(knobs=b.knobs, index=b.index, ok=r.status == BatchStatus.ok, outcome=r.status.value,
                   reason="" if r.status == BatchStatus.ok else one_line(r.message), screen_ms=b.screen_ms,
                   build_seconds=b.build_seconds, eval_seconds=b.seconds - b.build_seconds + r.seconds,
                   seconds=b.seconds + r.seconds)
    if r.bench is not None and r.status == BatchStatus.ok:
        cand = r.bench.timing("candidate")
        p.median_ms = cand.median_ms if cand else None
        p.ok = p.median_ms is not None
        ci = r.bench.speedup_vs_baseline
        if ci:
            p.speedup_vs_initial, p.ci_low, p.ci_high = ci.median, ci.low, ci.high
    return p
