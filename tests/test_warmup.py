"""Issue 66: parity's own work paid by a judge child while it waits for its job (tools/measure/warmup.py), on the CPU
softmax of tests/fixtures/values (its value draws declared): the checks run on the smallest listed shape with the task's
reference as the kernel (what quick parity runs), and the warm-up ends the moment the job is waiting.
On a GPU the judge runs it (tools/judge/judge.py); its seconds are measured on the card (BENCHMARKS.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tools.measure.warmup import job_waiting, wanted, warm_checks
from tools.task import load_task

HERE = Path(__file__).resolve().parent / "fixtures" / "values"
MASKING = '[[inputs]]\nname = "x"\nspecials = ["-inf"]   # masking\n'


class Counted:
    """The task module, its reference's calls counted and their shapes kept."""

    def __init__(self, mod):
        self.mod, self.shapes = mod, []

    def __getattr__(self, name):
        return getattr(self.mod, name)

    def reference(self, shape, *inputs):
        self.shapes.append(dict(shape))
        return self.mod.reference(shape, *inputs)


def _task(tmp: Path):
    root = tmp / "task"
    root.mkdir()
    shutil.copy(HERE / "task.py", root / "task.py")
    shutil.copy(HERE / "honest.cpp", root / "softmax.cpp")
    (root / "task.toml").write_text((HERE / "task.toml").read_text().replace("{inputs}", MASKING))
    return load_task(root)


def test_the_warm_up_runs_each_distribution_on_the_smallest_shape(tmp_path):
    task = _task(tmp_path)
    quick = Counted(task.module())
    line = warm_checks(task, quick, waiting=lambda: False)
    n = len(task.spec.distributions)
    assert line.startswith(f"warm-up: {n} of parity's checks on {{'M': 16, 'N': 24}}") and "stopped" not in line, line
    assert quick.shapes and all(s == {"M": 16, "N": 24} for s in quick.shapes)   # the smallest listed shape only


def test_the_warm_up_stops_when_the_job_has_come_or_its_time_is_up(tmp_path):
    task = _task(tmp_path)
    asked = []

    def after_one():
        asked.append(1)
        return len(asked) > 1
    line = warm_checks(task, task.module(), waiting=after_one)
    assert line.startswith("warm-up: 1 of") and \
        line.endswith("stopped: the agent's word came (the card is busy, or the job is here)"), line
    line = warm_checks(task, task.module(), seconds=0.0, waiting=lambda: False)
    assert "stopped: past 0 s" in line, line


def test_the_warm_up_leaves_the_random_generators_as_it_found_them(tmp_path):
    """An output-state check's random fill comes from torch's generator: a job's draws must not depend on how many
    warm-up checks ran before it came."""
    import random

    import torch
    task = _task(tmp_path)
    torch.manual_seed(5)
    random.seed(5)
    before = (torch.random.get_rng_state(), random.getstate())
    line = warm_checks(task, task.module(), waiting=lambda: False)
    assert "stopped" not in line, line
    assert torch.equal(torch.random.get_rng_state(), before[0]) and random.getstate() == before[1]


def test_only_a_gpu_tasks_child_started_for_its_build_warms_not_the_held_confirmation_child():
    root = Path(__file__).resolve().parents[1] / "kernels"
    gpu, cpu = load_task(root / "softmax"), load_task(root / "matmul_cpu")
    assert wanted(gpu, confirmation=False) and not wanted(gpu, confirmation=True)
    assert not wanted(cpu, confirmation=False) and not wanted(cpu, confirmation=True)


def test_a_task_whose_reference_raises_ends_the_warm_up_with_the_reason_and_no_exception(tmp_path):
    task = _task(tmp_path)

    class Broken(Counted):
        def reference(self, shape, *inputs):
            raise RuntimeError("no such op")
    line = warm_checks(task, Broken(task.module()), waiting=lambda: False)
    assert line.startswith("warm-up: 0 of") and "stopped: RuntimeError: no such op" in line, line


def test_job_waiting_sees_a_line_on_a_pipe_only_once_it_is_written():
    r, w = os.pipe()
    with os.fdopen(r) as reader, os.fdopen(w, "w") as writer:
        assert not job_waiting(reader)
        writer.write('{"lib": "x"}\n')
        writer.flush()
        assert job_waiting(reader)


def _judge(task: str, tmp: Path, wait_for: str | None, extra: tuple = (), wait_s: float = 0.0) -> tuple[str, str]:
    """The judge child as the loop starts it (`evaluate --job-stdin`, and `extra`), given a job without a library once
    its stderr says `wait_for` (None: after `wait_s`; 0, at once, as a child started cold is): its answer, its stderr."""
    import subprocess
    import sys
    import time
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "AGENT_SCRATCH": str(tmp)}
    p = subprocess.Popen([sys.executable, "-m", "tools.judge.judge", "evaluate", "--task", str(root / task),
                          "--job-stdin", *extra], cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    err = []
    try:
        if wait_for is not None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(wait_for in ln for ln in err) and p.poll() is None:
                err.append(p.stderr.readline())
        time.sleep(wait_s)
        out, rest = p.communicate('{"lib": ""}\n', timeout=120)
    finally:
        p.kill()
    return out, "".join(err) + rest


def test_the_judge_warms_parity_before_its_job_on_a_gpu_and_not_on_the_cpu(tmp_path):
    """Real subprocess: on a GPU (the device) the prestarted judge says it ran the stand-in's checks while it waited,
    and none when its job came at once; on the CPU it runs none (its first uses cost little, and its cores build)."""
    import torch
    if torch.cuda.is_available():
        out, err = _judge("kernels/softmax", tmp_path, "warm-up:")
        assert "[judge] warm-up: 3 of parity's checks" in err and "no library given" in out, (out, err)
        assert "[judge] warm-up: 0 of parity's checks" in _judge("kernels/softmax", tmp_path, None)[1]
        # the held confirmation child (its sanitizer hosts started early) runs no kernel while it waits, its values
        # draws' search included, until the agent says the card is idle (agent/evaluation/spares.py search)
        out, err = _judge("kernels/softmax", tmp_path, None, ("--sanitize-early",), wait_s=20)
        assert "warm-up" not in err and "values searched" not in err and "no library given" in out, (out, err)
    else:
        out, err = _judge("kernels/matmul_cpu", tmp_path, None)
        assert "warm-up" not in err and "no library given" in out, (out, err)


def _asserting_softmax(tmp: Path, name: str, only_main: bool = False) -> Path:
    """kernels/softmax copied, its `name` (reference or timing_reference) replaced by one that indexes past its input on
    the GPU: a device-side assert, sticky (every later CUDA call of that process fails). `only_main`: on the main shape
    only (what the host's idle call takes; the judge's values search calls timing_reference on small shapes, and would
    lose the judge's own context first), the task's own elsewhere. Skips without a GPU."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    task = tmp / "softmax"
    shutil.copytree(Path(__file__).resolve().parents[1] / "kernels" / "softmax", task,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(task / "task.py", "a") as f:
        f.write(f"\n\n_task_{name} = {name}\n\n\ndef {name}(shape, x):   # the test's: a device-side assert, sticky\n"
                "    import torch\n"
                + (f"    if tuple(x.shape) != (8192, 4096):   # the main shape's\n        return _task_{name}(shape, x)\n"
                   if only_main else "")
                + "    return x[torch.tensor([x.shape[0] + 7], device=x.device)]\n")
    return task


@pytest.mark.gpu
def test_a_warm_up_that_loses_the_cuda_context_ends_the_child_before_its_job(tmp_path):
    """A sticky CUDA error in the task's own code during the warm-up (here its reference indexes past its input on the
    GPU: a device-side assert) leaves every later call in that process failing, the warm-up's own restoring of the
    generators included: the child says so and ends without reading its job, so the agent gives the job to a cold
    child (WarmChild.serves) and the candidate is not charged with the task's error. GPU only (the device); on the CPU
    the judge does not warm."""
    from tools.measure.warmup import LOST
    task = _asserting_softmax(tmp_path, "reference")
    work = tmp_path / "work"
    work.mkdir()
    out, err = _judge(str(task), work, "warm-up:")
    assert LOST in err and "stopped:" in err, err
    assert out.strip() == "", out          # no answer: the job line was never read



def test_while_idle_searches_once_and_not_once_a_line_is_waiting():
    """The held child's step while the card is idle (tools/measure/warmup.py while_idle): the values draws' search,
    once across the agent's idle words; a line already waiting (the card busy again, or the job) and it begins none."""
    from tools.measure.warmup import while_idle
    task = load_task(Path(__file__).resolve().parents[1] / "kernels" / "matmul_cpu")
    mod, done = task.module(), set()
    first = while_idle(task, mod, 7, done, waiting=lambda: False)
    assert first.startswith("values searched ahead: 2 of 2 shapes") and done == {"search"}, first
    assert while_idle(task, mod, 7, done, waiting=lambda: False) == "idle: nothing left to do"
    assert while_idle(task, mod, 7, set(), waiting=lambda: True) == "search: stopped before it began: a line came"


def test_while_idle_then_calls_the_benchs_reference_once_in_the_kernel_host(tmp_path):
    """Issue 66: a keep's confirmation is the first bench that times the reference, in the host its held child forked
    as it started; on an H200 its warm-up took 0.51 s against the first bench's 0.08 s (fp16 SDPA's first call in that
    process). While the card is idle, after the search, the child has its host call the reference once (a real host
    here, on the CPU task); once only; not begun where a line is waiting; a host that died says LOST (the child ends
    before its job and the agent gives the job to a cold one)."""
    from tools.judge.hostclient import HostClient
    from tools.measure.warmup import LOST, while_idle
    task = load_task(Path(__file__).resolve().parents[1] / "kernels" / "matmul_cpu")
    mod, done = task.module(), set()
    root = tmp_path / "scratch"
    root.mkdir()
    host = HostClient(task.root, root)
    try:
        first = while_idle(task, mod, 7, done, waiting=lambda: False, host=host)
        assert first.startswith("values searched ahead: 2 of 2 shapes"), first
        assert "; the reference's first call in the host: " in first and done == {"search", "reference"}, first
        assert while_idle(task, mod, 7, done, waiting=lambda: False, host=host) == "idle: nothing left to do"
        busy = while_idle(task, mod, 7, {"search"}, waiting=lambda: True, host=host)
        assert busy == "the reference's first call: not begun: a line came", busy
        host.kill()
        gone = while_idle(task, mod, 7, {"search"}, waiting=lambda: False, host=host)
        assert LOST in gone and "host" in gone, gone
    finally:
        host.close()


class Seeding:
    """A task module whose make_inputs seeds the global generators (KernelBench's task.py does)."""

    def __init__(self, mod):
        self.mod, self.called = mod, []

    def __getattr__(self, name):
        return getattr(self.mod, name)

    def make_inputs(self, shape, seed, device, dist):
        import random

        import torch
        torch.manual_seed(seed)
        random.seed(seed)
        return self.mod.make_inputs(shape, seed, device, dist)

    def timing_reference(self, shape, *inputs):
        self.called.append(dict(shape))
        return self.mod.reference(shape, *inputs)


def test_the_reference_called_once_leaves_the_random_generators_as_they_were():
    """reference_once (the host's warm_reference) calls what the bench times against, timing_reference where the task
    has one, on the shape it is given, and puts back the generators a task's make_inputs may have seeded: the job's
    draws after it are the ones they would have been."""
    import random

    import torch

    from tools.measure.warmup import reference_once
    task = load_task(Path(__file__).resolve().parents[1] / "kernels" / "matmul_cpu")
    mod = Seeding(task.module())
    main = dict(task.spec.main)
    random.seed(5)
    torch.manual_seed(5)
    before = (random.random(), torch.rand(3))
    random.seed(5)
    torch.manual_seed(5)
    assert reference_once(task, mod, main, task.spec.distributions[0]) >= 0
    after = (random.random(), torch.rand(3))
    assert mod.called == [main]
    assert before[0] == after[0] and torch.equal(before[1], after[1])


def test_a_reference_that_raises_in_the_host_is_said_and_the_child_keeps_its_job(tmp_path):
    """The task's own reference raising in the host's call (not a lost context) is said, and the child still takes its
    job (no LOST in the line): the job's bench says what is wrong with the task."""
    from tools.judge.hostclient import HostClient
    from tools.measure.warmup import LOST, host_reference
    task = tmp_path / "matmul_cpu"
    shutil.copytree(Path(__file__).resolve().parents[1] / "kernels" / "matmul_cpu", task,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(task / "task.py", "a") as f:
        f.write("\n\ndef timing_reference(shape, *inputs):\n    raise ValueError('the reference is broken')\n")
    t = load_task(task)
    root = tmp_path / "scratch"
    root.mkdir()
    host = HostClient(t.root, root)
    try:
        said = host_reference(t, host)
        assert "raised" in said and "the reference is broken" in said and LOST not in said, said
        assert host.ask({"op": "idle"})["ok"] is True        # the host still answers
    finally:
        host.close()


@pytest.mark.gpu
def test_a_reference_that_loses_the_cuda_context_in_the_host_ends_the_held_child(tmp_path):
    """GPU only (the device), through the judge child as the loop holds it (`evaluate --job-stdin`): told that the
    card is idle, it has its host call the task's timing_reference, here a device-side assert (sticky): the host
    answers that it raised and that its context is lost, and the child ends before its job (the agent then gives the
    job to a cold child, not charging the candidate). In the judge's order: its host forked before CUDA is set up (a
    host forked from this test's process, CUDA set up here, could not load the task: a different failure)."""
    import queue
    import subprocess
    import sys
    import threading
    import time

    from tools.measure.warmup import LOST
    task = _asserting_softmax(tmp_path, "timing_reference", only_main=True)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "AGENT_SCRATCH": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "tools.judge.judge", "evaluate", "--task", str(task), "--job-stdin"],
                         cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in [*p.stderr, None]], daemon=True).start()   # None: EOF
    err, said = [], None
    try:
        p.stdin.write('{"idle": true}\n')
        p.stdin.flush()
        deadline = time.monotonic() + 180
        while said is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            err.append(line)     # while_idle's line: the values search's, then the host's call, joined
            said = line if "[judge] values searched" in line or "reference's first call" in line else None
        assert said is not None, "".join(err)
        assert "raised" in said and LOST in said and "assert" in said.lower(), said
        assert p.wait(timeout=60) == 0          # ended on its own, the job line never sent
        assert p.stdout.read().strip() == ""    # and never answered one
    finally:
        p.kill()
        p.wait(timeout=30)
