"""Where candidates are evaluated (issue 44): the executor seam, and its two implementations.

- `Local` (the default): here, one thing at a time. One machine needs nothing new installed or started.
- `Dask`: dask.distributed, one worker per GPU, each pinned through its Nanny's environment (CUDA_VISIBLE_DEVICES; a
  CPU task's worker gets its own share of the cores instead, AGENT_CPUS), each running one task at a time (nthreads=1):
  one timing per GPU, never beside another candidate's. `--workers N` starts a local cluster of N such workers;
  `--scheduler ADDRESS` uses a running one, on one host or several (docs/SCALE.md: `dask scheduler` on one host, a
  `dask worker ADDRESS --nthreads 1` per GPU, pinned the same way, on each; a chunk carries the task's folder and its
  libraries as bytes, so a worker needs none of this host's files).

Why dask.distributed: futures with `as_completed` are the shape of the work (independent candidates, each a few
seconds to a minute, results wanted as they come); a Nanny per worker restarts a worker that died, and the scheduler
gives its task to another worker; it ran 8 GPU tasks on 2 workers 1.98x faster than on one in the issue's own check;
its wheels with their dependencies are about 5 MB (Ray's alone is 79 MB).

A worker that dies (killed, its host gone) loses the task it held: the scheduler gives it to another worker once
(`distributed.scheduler.allowed-failures` = 1, set here for a local cluster); a second loss comes back as a `Done`
with `lost` set, and the caller records it. The run goes on.

Code under test never runs in a worker: a worker runs the judge's instruments (tools/judge), which start the
candidate's sandboxed children as they do here.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

POLL_S = 0.2            # how often the scheduler is asked where items run, while none has finished
ALLOWED_FAILURES = 1     # a task is given to another worker once after its worker died; a second death: lost

log = logging.getLogger("agent.executor")


class ExecutorError(Exception):
    """The executor cannot start (no dask, a scheduler that does not answer, more workers than GPUs)."""


@dataclass
class Done:
    index: int                      # the item's position in the list given to run()
    value: Any = None
    error: BaseException | None = None
    lost: str = ""                  # the worker(s) holding it died: why, as dask said
    worker: str = "local"           # which worker and GPU (or cores) evaluated it


class Executor(Protocol):
    workers: int
    where: str                      # one line for the user: what evaluates

    def run(self, fn: Callable[[Any], Any], items: list[Any],
            started: Callable[[int, str], None] | None = None) -> Iterator[Done]:
        """fn(item) for every item, each exactly once, yielded as each finishes (any order); `started(index, worker)`
        when an item is seen on a worker (again on another, if its worker died)."""
        ...

    def landing(self, landed: Callable[[str, str], None]) -> AbstractContextManager[Callable[[str], None]]:
        """A channel for what an item has to say before it is done (issue 66: a sweep's verdicts as they land, not
        per chunk at its end): gives a `put(text)` to hand fn (picklable: it runs where fn runs), and calls
        `landed(text, worker)` here for each text put, from a thread of its own, until the block ends (every text
        put by then handed over)."""
        ...

    def close(self) -> None:
        ...


def on_worker(fn: Callable[[Any], Any], item: Any) -> tuple[Any, str]:
    """What a worker runs: the item under this worker's pinning (its cores, for a CPU task: the candidate's children
    inherit them), and the worker's label with the result."""
    cpus = os.environ.get("AGENT_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    return fn(item), os.environ.get("AGENT_WORKER", "local")


class Local:
    workers = 1
    where = "this process"

    def run(self, fn: Callable[[Any], Any], items: list[Any],
            started: Callable[[int, str], None] | None = None) -> Iterator[Done]:
        for i, item in enumerate(items):
            if started:
                started(i, "local")
            yield Done(index=i, value=fn(item))

    @contextmanager
    def landing(self, landed: Callable[[str, str], None]) -> Iterator[Callable[[str], None]]:
        yield lambda text: landed(text, "local")

    def close(self) -> None:
        pass


def _put(name: str, text: str) -> None:
    """On a worker: one text on the landing queue `name` (Dask.landing), with the worker's label."""
    from distributed import Queue
    Queue(name).put([text, os.environ.get("AGENT_WORKER", "local")])


def worker_envs(n: int, gpu: bool, gpus: list[str] | None = None, cpus: list[int] | None = None) -> list[dict]:
    """Each worker's environment: its GPU (one each, from `gpus`: the visible ones), or for a CPU task its share of
    `cpus` (the cores this process may use, split in n contiguous parts)."""
    if gpu:
        have = gpus if gpus is not None else []
        if n > len(have):
            raise ExecutorError(f"--workers {n}: {len(have)} GPU(s) visible here (one worker per GPU)")
        return [{"CUDA_VISIBLE_DEVICES": have[i], "AGENT_WORKER": f"w{i} gpu{have[i]}"} for i in range(n)]
    cores = cpus if cpus is not None else sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cores and n > len(cores):
        raise ExecutorError(f"--workers {n}: {len(cores)} core(s) here; a CPU task's worker needs a core of its own")
    if not cores:
        return [{"AGENT_WORKER": f"w{i}"} for i in range(n)]
    share = [cores[len(cores) * i // n: len(cores) * (i + 1) // n] for i in range(n)]
    return [{"AGENT_CPUS": ",".join(map(str, s)), "AGENT_WORKER": f"w{i} cpu{s[0]}-{s[-1]}"} for i, s in enumerate(share)]


class Dask:
    """A local cluster of pinned workers (`envs`), or a running scheduler (`address`)."""

    def __init__(self, envs: list[dict] | None = None, address: str | None = None):
        try:
            import dask
            from distributed import Client, Nanny, Scheduler, SpecCluster
        except ImportError as e:
            raise ExecutorError(f"dask.distributed is not installed ({e}); pip install distributed") from None
        self.cluster = None
        self.scratch: str | None = None
        self.labels = {f"w{i}": e.get("AGENT_WORKER", f"w{i}") for i, e in enumerate(envs or [])}   # name -> label
        quiet = {"DASK_LOGGING__DISTRIBUTED": "error"}
        try:
            if address:
                self.client = Client(address, timeout="20s")
                self.workers = len(self.client.scheduler_info().get("workers", {}))
                self.where = f"the dask scheduler at {address} ({self.workers} workers)"
            else:
                assert envs, "a local cluster needs the workers' environments"
                dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES})
                # each local worker's temporary files (its chunks' and candidates' folders) in a folder of this
                # executor's, removed at close: a worker SIGKILLed mid-chunk cannot remove its own, and they were
                # left in /tmp (a dozen a test run); the Nanny's restart keeps the same folder
                self.scratch = tempfile.mkdtemp(prefix="agent-dask-")
                for i in range(len(envs)):
                    os.mkdir(os.path.join(self.scratch, f"w{i}"))
                spec = {f"w{i}": {"cls": Nanny, "options": {
                    "nthreads": 1, "env": {**quiet, **env, "TMPDIR": os.path.join(self.scratch, f"w{i}")},
                    "name": f"w{i}", "dashboard": False,
                    "silence_logs": logging.ERROR}} for i, env in enumerate(envs)}
                self.cluster = SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard": False,
                                                                                    "dashboard_address": ":0"}},
                                           workers=spec, silence_logs=logging.ERROR)
                self.client = Client(self.cluster)
                self.workers = len(envs)
                self.where = f"{self.workers} local dask workers ({', '.join(e['AGENT_WORKER'] for e in envs)})"
        except (OSError, TimeoutError, RuntimeError) as e:
            self.close()
            raise ExecutorError(f"dask could not start: {' '.join(str(e).split())[:300]}") from None

    def run(self, fn: Callable[[Any], Any], items: list[Any],
            started: Callable[[int, str], None] | None = None) -> Iterator[Done]:
        from distributed import as_completed
        futs = {self.client.submit(on_worker, fn, item, pure=False): i for i, item in enumerate(items)}
        seen: set[tuple[int, str]] = set()
        done = as_completed(list(futs))
        try:
            while not done.is_empty():
                if started:
                    for i, worker in self._placed(futs):
                        if (i, worker) not in seen:
                            seen.add((i, worker))
                            started(i, worker)
                batch = done.next_batch(block=False) if done.has_ready() else []
                for fut in batch:
                    yield self._done(fut, futs[fut])
                if not batch:
                    time.sleep(POLL_S)
        finally:   # an interrupt: what is queued is cancelled, what runs ends with its worker's cluster
            for fut in futs:
                fut.cancel()

    @contextmanager
    def landing(self, landed: Callable[[str, str], None]) -> Iterator[Callable[[str], None]]:
        """Through a distributed.Queue of this block's own (small msgpack data, through the scheduler), read every
        POLL_S by a thread here: all that waits at once (get(batch=True): a get that times out is logged by the
        scheduler as an error)."""
        from distributed import Queue
        q = Queue(f"agent-landing-{uuid.uuid4().hex}", client=self.client)
        stop = threading.Event()

        def read() -> None:
            while True:
                last = stop.is_set()         # set before this read: what was put before the block ended is in it
                try:
                    items = q.get(batch=True)
                except Exception as e:       # the scheduler did not answer this time: the chunk's end brings it all
                    log.debug("dask landing queue: %s", e)
                    items = []
                for text, worker in items:
                    landed(text, worker)
                if last:
                    return
                stop.wait(POLL_S)
        t = threading.Thread(target=read, name="dask-landing", daemon=True)
        t.start()
        try:
            yield partial(_put, q.name)
        finally:
            stop.set()
            t.join()

    def _placed(self, futs: dict) -> list[tuple[int, str]]:
        """(item, worker label) for each item a worker is running now, as the scheduler says."""
        try:
            now, info = self.client.processing(), self.client.scheduler_info().get("workers", {})
        except Exception as e:  # the scheduler did not answer this time: the progress line waits for the next
            log.debug("dask processing(): %s", e)
            return []
        index = {f.key: i for f, i in futs.items()}
        name = lambda addr: str(info.get(addr, {}).get("name", addr))   # noqa: E731
        return [(index[k], self.labels.get(name(a), name(a))) for a, keys in now.items() for k in keys if k in index]

    @staticmethod
    def _done(fut, i: int) -> Done:
        from distributed.scheduler import KilledWorker
        try:
            value, worker = fut.result()
            return Done(index=i, value=value, worker=worker)
        except KilledWorker as e:
            return Done(index=i, lost=f"its worker died {ALLOWED_FAILURES + 1} times ({e})", worker="lost")
        except Exception as e:  # the function raised on the worker: the caller's to judge, as here
            return Done(index=i, error=e)

    def close(self) -> None:
        for part in ("client", "cluster"):
            obj = getattr(self, part, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception as e:  # closing a cluster that half started: nothing more to do
                    log.debug("closing the dask %s: %s", part, e)
        if self.scratch:     # after the workers: what a killed one left behind
            shutil.rmtree(self.scratch, ignore_errors=True)


PACK_SKIP = ("__pycache__", ".git", "build")   # folders a task's files never need
PACK_MAX_BYTES = 16 << 20                       # a larger file is not a task's source (a dataset, a profile)


def pack_folder(root: Path) -> bytes:
    """A task's folder as bytes (a gzipped tar, without build products), for a worker on a host that cannot read this
    one's files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root)
            if any(part in PACK_SKIP for part in rel.parts) or not p.is_file() or p.suffix in (".so", ".o"):
                continue
            if p.stat().st_size <= PACK_MAX_BYTES:
                tar.add(p, arcname=str(rel))
    return buf.getvalue()


def unpack_folder(data: bytes, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            tar.extractall(dest, filter="data")   # no absolute paths, no links, nothing out of dest
        except TypeError:   # Python before 3.11.4: the same refusals by hand
            for m in tar.getmembers():
                if not m.isfile() and not m.isdir() or m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise ValueError(f"refused to unpack {m.name!r}") from None
            tar.extractall(dest)
    return dest


def make_executor(workers: int | None, scheduler: str | None, gpu: bool) -> Executor:
    """--workers N / --scheduler ADDRESS, or the local default."""
    if scheduler:
        return Dask(address=scheduler)
    if workers is None or workers <= 1:
        return Local()
    gpus = None
    if gpu:
        from tools.backends.device import visible_gpus
        gpus = visible_gpus()
    return Dask(envs=worker_envs(workers, gpu, gpus))
