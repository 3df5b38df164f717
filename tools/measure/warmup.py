"""Parity's own GPU work paid before the job (issue 66): the judge child the loop starts while its candidate builds
(tools/judge/candidate.py prestart_candidate) runs the checks once on the task's smallest listed shape with the task's
reference standing in for the kernel, while it waits for its job.

Why: a fresh process pays for the first use of each torch kernel it launches (CUDA's lazy module loading, cuBLAS and
cuDNN handles), and parity launches many (the reference's, the draws', the comparisons'). On an H200 a fresh judge's
confirmation parity on attention_fwd took 8.33 s and the same checks on other seeds in the same process 5.81 and
5.91 s: SDPA's first calls were 2.0 s of the 8.33 s, 0.16 s once warm (softmax: 3.06 s, then 1.98 s; BENCHMARKS.md).
Nothing of the candidate runs here, and nothing here reaches a verdict: the stand-in's checks are thrown away; the job's
checks are the same code on their own seeds and shapes, and the random generators are put back as they were (an
output-state check's random fill is drawn from torch's). The warm-up stops as soon as the job is waiting on stdin (a
child started cold is given its job at once and pays nothing) or its time is up; a job that comes during a check waits
for that check.

Only the child started during its candidate's build warms (wanted): the evaluator's held confirmation child
(agent/evaluation/spares.py) waits beside whatever the loop does next, the next candidate's bench among it, and runs no
kernel but its values draws' search, and one call of the bench's reference in its kernel host, while the agent says the
card is idle (while_idle, below). Warmed as it started, it made the first bench after the initial measurement 2.47 s
instead of 1.37 on an H200: the bench's rounds shared the card with the warm-up (BENCHMARKS.md, issue 66 slice 8).
"""

from __future__ import annotations

import random
import select
import sys
import time

SECONDS = 8.0    # at most this long, between two checks
LOST = "the CUDA context is lost"   # a sticky CUDA error in the task's own code: the child must not take a job


class Generators:
    """The random generators (Python's, torch's, each CUDA device's) as they were when made, for work of the task's
    own that must leave them so; and whether that work left the CUDA context lost (a sticky error: every later call
    of the process fails, putting the CUDA generators back among them)."""

    def __init__(self, gpu: bool):
        import torch
        self.gpu, self.lost = bool(gpu and torch.cuda.is_available()), False
        self.states = (random.getstate(), torch.random.get_rng_state(),
                       torch.cuda.get_rng_state_all() if self.gpu else None)

    def check_lost(self) -> bool:
        """After the task's code raised: whether the context is lost (a synchronize fails)."""
        import torch
        if self.gpu:
            try:
                torch.cuda.synchronize()
            except Exception:   # its job would fail every check on the candidate's account: a cold child takes it
                self.lost = True
        return self.lost

    def put_back(self) -> bool:
        """The generators as they were, and the work's memory back to the card; whether the context is lost."""
        import torch
        random.setstate(self.states[0])
        torch.random.set_rng_state(self.states[1])
        if self.gpu and not self.lost:
            try:
                torch.cuda.set_rng_state_all(self.states[2])
                torch.cuda.empty_cache()
            except Exception:
                self.lost = True
        return self.lost


def wanted(task, confirmation: bool) -> bool:
    """Whether a judge child started before its job warms: on a GPU, and not the held confirmation child (above)."""
    return bool(task.backend.gpu) and not confirmation


def job_waiting(stream=None) -> bool:
    """Whether the job has already come on `stream` (default stdin); False where it cannot be told."""
    try:
        return bool(select.select([stream or sys.stdin], [], [], 0)[0])
    except (OSError, ValueError, TypeError):
        return False


def stand_in(mod):
    """The task's `run` with its reference in the kernel's place: the reference's values written into the output."""
    import torch

    def run(lib, shape, out, *inputs):
        exp = mod.reference(shape, *inputs)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        exps = [exp] if isinstance(exp, torch.Tensor) else list(exp)
        for o, e in zip(outs, exps):
            o.copy_(e)
    return run


def warm_checks(task, mod, seconds: float = SECONDS, waiting=job_waiting) -> str:
    """Parity's checks (tools/measure/parity.py) once per distribution on the smallest listed shape, the stand-in as
    the kernel: what the loop's quick parity runs. Returns one line: how many checks in how many seconds, and why it
    stopped early where it did. Never raises: a task whose checks cannot run here says so in its job."""
    import torch

    from tools.measure.buffers import Buffers
    from tools.measure.parity import one_check
    from tools.task import shape_size
    t0 = time.monotonic()
    spec, backend = task.spec, task.backend
    if not spec.shapes:
        return "warm-up: no listed shape"
    shape = dict(min(spec.shapes, key=shape_size))
    run, done, why = stand_in(mod), 0, ""
    gens = Generators(backend.gpu)
    try:
        for dist in spec.distributions:
            if waiting():
                why = "; stopped: the agent's word came (the card is busy, or the job is here)"
                break
            if time.monotonic() - t0 > seconds:
                why = f"; stopped: past {seconds:g} s"
                break
            one_check(task, mod, None, shape, "warm-up", dist, 1, backend.torch_device, Buffers(torch), backend.sync,
                      run, run)
            done += 1
    except Exception as e:   # the task's own code on its own shape: the job's checks will say what is wrong
        why = f"; stopped: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        gens.check_lost()
    finally:
        if gens.put_back():
            why += f"; {LOST}"
    return f"warm-up: {done} of parity's checks on {shape} in {time.monotonic() - t0:.2f} s{why}"


def search_ahead(task, mod, seed: int, waiting=job_waiting) -> str:
    """The values:large draws' search (tools/measure/domains.py) of a parity on root `seed` before a keep, made by the
    judge child held for a keep's confirmation while the agent says the card is idle (while_idle: its model proposes,
    nvcc builds): its job's draws, on the seed it drew itself, then find the answer
    and never call the user's call (whose first calls in a process load its kernels: 1.6-2.0 s of attention's
    confirmation on an H200, issue 66 slice 17). Its GPU work is that search's calls on two small shapes (0.1 ms each
    once loaded); a job already waiting is not kept waiting. The random generators are put back as they were. Never
    raises: a task whose draws cannot be made here says so in its job."""
    from tools.measure.buffers import check_seed
    from tools.measure.domains import PREFIX, draw, value_shapes
    from tools.measure.parity import seeded_shapes
    t0, backend = time.monotonic(), task.backend
    gens = Generators(backend.gpu)
    done, todo, why = 0, [], ""
    try:
        seeds, shapes, _, why = seeded_shapes(task.spec, mod, seed, True)
        todo = [] if why else value_shapes(shapes)
        for shape in todo:
            if waiting():
                why = "the agent's word came (the card is busy, or the job is here)"
                break
            draw(task.spec, mod, shape, check_seed(seeds[0], shape, PREFIX + "large"), backend.torch_device,
                 PREFIX + "large")
            done += 1
        backend.sync()
    except Exception as e:   # the task's own code: the job's draws search again, and say what is wrong
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        gens.check_lost()
    finally:
        if gens.put_back():
            why = (why or "") + f"; {LOST}"
    return (f"values searched ahead: {done} of {len(todo)} shapes in {time.monotonic() - t0:.2f} s"
            + (f"; stopped: {why}" if why else ""))


def while_idle(task, mod, seed: int, done: set, waiting=job_waiting, host=None) -> str:
    """What the judge child held for a keep's confirmation does while the agent says the card is idle (its model
    proposes, nvcc builds: agent/evaluation/spares.py): the search of its job's values draws on root `seed`
    (search_ahead), once (`done` holds it once it has ended), stopped at its next draw as soon as a line is waiting on
    stdin (the agent's word that the card is busy again, or the job); then, once, the bench's reference arm called in
    the child's kernel host (`host`, tools/judge/hostclient.py HostClient: host_reference). Parity's first kernels are
    not warmed here: warm_checks in this child, told idle, took a kept attention iteration from 18.10 to 17.59 s on an
    H200, inside the runs' spread; in one process a cold `rest` parity cost 0.2 s more than a warm one (BENCHMARKS.md,
    issue 66 slice 17, amended)."""
    said = []
    if "search" not in done:
        if waiting():
            return "search: stopped before it began: a line came"
        said.append(search_ahead(task, mod, seed, waiting))
        if "stopped" in said[-1]:
            return said[-1]
        done.add("search")
    if host is not None and "reference" not in done:
        if waiting():
            return "; ".join(said + ["the reference's first call: not begun: a line came"])
        said.append(host_reference(task, host))
        done.add("reference")
    return "; ".join(said) or "idle: nothing left to do"


def host_reference(task, host) -> str:
    """The bench's reference arm (the task's timing_reference, else its reference) called once on the main shape in
    the judge child's kernel host, on inputs of its own, thrown away (Host.warm_reference: reference_once). The
    confirmation is the first bench of a keep that times the reference, in the host that held child forked when it
    started: its warm-up took 0.51 s against the first bench's 0.08 s on an H200, its reference's (fp16 SDPA's) first
    call in that process (its kernels' lazy loading; BENCHMARKS.md, issue 66). A host that died here ends the child
    before its job (LOST: the agent gives the job to a cold one, and the candidate is not charged)."""
    try:
        ans = host.ask({"op": "warm_reference", "shape": dict(task.spec.main), "dist": task.spec.distributions[0]})
    except RuntimeError as e:   # the task's own reference raised: the job's bench says so (LOST in it: reference_once)
        return f"the reference's first call in the host raised: {' '.join(str(e).split())[:200]}"
    except Exception as e:      # HostFailed (its `status`; not imported: the judge's room is above this one)
        return f"the reference's first call in the host: {e}; {LOST}"
    return f"the reference's first call in the host: {float(ans.get('seconds') or 0):.2f} s"


def reference_once(task, mod, shape: dict, dist: str) -> float:
    """The reference arm called once on `shape` (what the bench times against: timing_reference, else reference), on
    inputs drawn here and thrown away, the random generators put back as they were (a task.py may seed torch's global
    one); its seconds. In the kernel's host (tools/judge/host.py warm_reference), not the judge: each process pays its
    own first calls."""
    from tools.task_messages import make_inputs
    t0, backend = time.monotonic(), task.backend
    gens = Generators(backend.gpu)
    try:
        inputs = make_inputs(mod, shape, 1, backend.torch_device, dist)
        getattr(mod, "timing_reference", mod.reference)(shape, *inputs)
        backend.sync()
        del inputs
    except Exception as e:   # the task's own code; a sticky CUDA error leaves every later call failing: LOST
        if gens.check_lost():
            raise RuntimeError(f"{LOST}: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
        raise
    finally:
        lost = gens.put_back()
    if lost:    # the generators could not be put back: the call left the context lost after all
        raise RuntimeError(f"{LOST}: putting the CUDA generators back failed after the reference's call")
    return time.monotonic() - t0
