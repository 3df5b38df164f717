"""compute-sanitizer memcheck on a CUDA candidate about to be kept (tools/judge/sanitize.py, issue 40).

On CI (no GPU, no sanitizer): the host runs under a wrapper command, ends on its own and leaves no process; the
shapes memcheck takes are small, tails first; the parser quotes the first invalid access of a real report (the
sanitizer's own, on tail_rmw.cu, tests/fixtures/sanitizer/); a machine without the sanitizer says so. On the
device (`-m gpu`): the adversaries of the memcheck form fail `invalid_access`, the honest kernel passes."""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import pytest

from tools.judge import sanitize, sanitize_shapes
from tools.task import load_task, shape_size

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "tests" / "fixtures" / "cuda_cheats" / "softmax"


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_a_wrapped_host_computes_then_ends_on_its_own(tmp_path):
    """The host started under a wrapper (as under compute-sanitizer): the wrapper's environment reaches it, its
    calls are right, and closing its requests ends it (the wrapper's report is written at that exit)."""
    import torch

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.hostclient import HostClient, Remote
    task, lib = make_task(tmp_path, "correct")
    mod = task.module()
    root = tmp_path / "judge"
    root.mkdir()
    # a wrapper that, like compute-sanitizer, runs the host as its child and exits with its code
    wrap = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
    host = HostClient(task.root, root, wrap=wrap, env={"AGENT_WRAPPED": "yes"})
    try:
        host.ask({"op": "load", "id": "candidate", "path": str(lib)})
        pid = host.info["pid"]
        assert pid != host.proc.pid            # the host runs under the wrapper, not forked from this process
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        assert b"AGENT_WRAPPED=yes" in env
        shape = dict(task.spec.shapes[0])
        inputs = mod.make_inputs(shape, 1, "cpu", task.spec.distributions[0])
        out = torch.empty_like(mod.empty_output(shape, *inputs))
        Remote(host).run("candidate", shape, out, *inputs)
        assert torch.allclose(out, mod.reference(shape, *inputs).to(out.dtype), atol=1e-3, rtol=1e-3)
        assert host.finish(timeout=30) == 0
    finally:
        host.close()
    assert not os.path.exists(f"/proc/{pid}")


def test_memcheck_takes_small_shapes_and_the_tails():
    task = load_task(ROOT / "kernels" / "softmax")
    got = sanitize_shapes.shapes(task.spec, task.module(), random.Random(7))
    assert 10 <= len(got) <= sanitize_shapes.MAX_SHAPES
    sizes = [s["M"] * s["N"] for s, _ in got]
    assert max(sizes) <= sanitize_shapes.MAX_ELEMENTS
    labels = [label for _, label in got]
    assert "M=333,N=4097" in labels and "shrunk M=2048,N=1000" in labels   # listed shapes with ragged rows
    assert "shrunk M=512,N=4096" in labels and "M=8192,N=4096" not in labels   # the largest: its rows as they are
    assert any(label.startswith("hidden ") for label in labels)
    tails = {s["N"] for s, label in got if label.startswith("range ")}
    assert {1, 2, 3} <= tails                                           # rows shorter than a vector
    assert len(set(labels)) == len(labels)


def test_memcheck_shrinks_a_large_shape_to_its_rows_and_racecheck_takes_the_extremes_with_fewest_rows():
    """memcheck's cost goes with a call's work (attention's B=8,H=16,S=2048: 4 s of its 6-7 s on an H200); what it
    looks for, an access past an allocation's end, the last head of a smaller batch of the same rows reaches the same
    way. So a listed shape past MAX_ELEMENTS is checked with its reductions as they are and the other [dims] halved:
    every listed reduction length is still checked, the shapes within the budget as they are. racecheck's cost goes
    with the blocks (B=33,H=31,S=1 took 5.4 s): its extremes are those with the fewest rows; and with the reduction a
    block walks: its first shape is the smallest listed one, never a hidden one, whose length a random draw sets
    (hidden S=585 took 7.6 s, the listed S=333 2.3-3.0 s)."""
    task = load_task(ROOT / "kernels" / "attention_fwd")
    spec, mod = task.spec, task.module()
    for seed in range(4):
        got = sanitize_shapes.shapes(spec, mod, random.Random(seed))
        assert all(shape_size(s) <= sanitize_shapes.MAX_ELEMENTS for s, _ in got)
        assert {s["S"] for s in spec.shapes} <= {s["S"] for s, _ in got}          # S = 2048 among them
        labels = [label for _, label in got]
        assert "shrunk B=4,H=4,S=2048,D=64,causal=0" in labels and "shrunk B=8,H=8,S=512,D=64,causal=0" in labels
        assert "B=4,H=16,S=512,D=64,causal=1" in labels and "B=2,H=4,S=333,D=64,causal=1" in labels   # as listed
        race = sanitize_shapes.shapes(spec, mod, random.Random(seed), sanitize_shapes.RACE_SHAPES,
                                      sanitize_shapes.RACE_ELEMENTS, sanitize_shapes.RACE_ELEMENTS)
        ranged = [(s, sanitize_shapes.rows(spec, s)) for s, label in race if label.startswith("range ")]
        assert ranged and max(n for _, n in ranged) <= sanitize_shapes.RACE_ROWS, race    # not B=33,H=31,S=1
        assert [shape_size(s) for s, _ in ranged] == sorted(shape_size(s) for s, _ in ranged), race
        assert race[0] == ({"B": 2, "H": 4, "S": 333, "D": 64, "causal": 1}, "B=2,H=4,S=333,D=64,causal=1"), race
        assert not any("hidden " in label for _, label in race), race   # the smallest listed: its cost is known
    # where no listed shape fits (large ones and no [dims] to shrink them by: an imported task), a hidden one rather
    # than none
    soft = load_task(ROOT / "kernels" / "softmax")
    bare = soft.spec.model_copy(update={"shapes": [{"M": 8192, "N": 4096}], "dims": {}})
    race = sanitize_shapes.shapes(bare, soft.module(), random.Random(3), sanitize_shapes.RACE_SHAPES,
                                  sanitize_shapes.RACE_ELEMENTS, sanitize_shapes.RACE_ELEMENTS)
    assert race and race[0][1].startswith("hidden ") and shape_size(race[0][0]) <= sanitize_shapes.RACE_ELEMENTS, race
    # both directions of shrunk(): the reductions never change; where they alone are past the budget, no shape
    big = {"B": 8, "H": 16, "S": 2048, "D": 64, "causal": 1}
    small = sanitize_shapes.shrunk(spec, big, 1 << 21)
    assert small == {"B": 4, "H": 4, "S": 2048, "D": 64, "causal": 1}
    assert sanitize_shapes.shrunk(spec, {"B": 33, "H": 1, "S": 4096, "D": 64, "causal": 0}, 1 << 21) == \
        {"B": 5, "H": 1, "S": 4096, "D": 64, "causal": 0}       # halved rounded up: an odd count stays odd here
    assert sanitize_shapes.shrunk(spec, {"B": 1, "H": 2, "S": 65536, "D": 64, "causal": 0}, 1 << 21) is None
    soft_task = load_task(ROOT / "kernels" / "softmax")    # its hidden shapes may be past racecheck's budget: shrunk
    for seed in range(4):
        race = sanitize_shapes.shapes(soft_task.spec, soft_task.module(), random.Random(seed),
                                      sanitize_shapes.RACE_SHAPES, sanitize_shapes.RACE_ELEMENTS,
                                      sanitize_shapes.RACE_ELEMENTS)
        assert not race[0][1].startswith(("range ", "shrunk ")), race
    floor = spec.model_copy(update={"dims": {**spec.dims, "B": spec.dims["B"].model_copy(update={"min": 8})}})
    assert sanitize_shapes.shrunk(floor, big, 1 << 21) == {"B": 8, "H": 2, "S": 2048, "D": 64, "causal": 1}  # B >= min

    class Sixteens:   # a task whose valid_shape() takes 16 heads or more only: the shape is checked whole instead
        valid_shape = staticmethod(lambda shape: shape["H"] >= 16)
    assert sanitize_shapes.fit(spec, Sixteens, big, "", 1 << 21, 1 << 24) == (big, "")
    assert sanitize_shapes.fit(spec, mod, big, "", 1 << 21, 1 << 24) == (small, "shrunk ")
    assert sanitize_shapes.fit(spec, Sixteens, {**big, "B": 9}, "", 1 << 21, 1 << 24) == (None, "")   # past both
    soft = load_task(ROOT / "kernels" / "softmax").spec
    assert sanitize_shapes.shrunk(soft, {"M": 8192, "N": 4096}, 1 << 21) == {"M": 512, "N": 4096}
    assert sanitize_shapes.rows(soft, {"M": 7, "N": 100}) == 7 and sanitize_shapes.rows(spec, big) == 128
    # a task that does not say which lengths are reductions (an imported or `agent init` one: [dims] without
    # `reduction`, or no [dims]) is not shrunk: its listed shapes whole up to WHOLE_ELEMENTS, as before shrinking
    unmarked = spec.model_copy(update={"dims": {d: r.model_copy(update={"reduction": False})
                                                for d, r in spec.dims.items()}})
    for other in (unmarked, spec.model_copy(update={"dims": {}})):
        assert sanitize_shapes.shrunk(other, big, 1 << 21) is None
        labels = [label for _, label in sanitize_shapes.shapes(other, mod, random.Random(1))]
        assert "B=8,H=16,S=2048,D=64,causal=0" in labels and "B=32,H=8,S=512,D=64,causal=0" in labels
        assert not any(label.startswith("shrunk ") for label in labels)
        race = sanitize_shapes.shapes(other, mod, random.Random(1), sanitize_shapes.RACE_SHAPES,
                                      sanitize_shapes.RACE_ELEMENTS, sanitize_shapes.RACE_ELEMENTS)
        assert all(shape_size(s) <= sanitize_shapes.RACE_ELEMENTS for s, _ in race)


def test_the_parser_quotes_the_first_invalid_access():
    text = (ROOT / "tests" / "fixtures" / "sanitizer" / "memcheck_tail_rmw.log").read_text()
    n, first = sanitize.parse_log(text)
    assert n >= 1
    assert first.startswith("Invalid __global__ ") and "softmax_kernel" in first, first
    assert "out of bounds" in first and "nearest allocation" in first, first
    assert sanitize.parse_log("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == (0, "")


def test_a_machine_without_the_sanitizer_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if sanitize.find_sanitizer() is not None:
        pytest.skip("this machine has /usr/local/cuda/bin/compute-sanitizer")
    task = load_task(ROOT / "kernels" / "softmax")
    res = sanitize.memcheck(task, task.module(), {"lib": "unused"}, tmp_path, seed=1)
    assert res["status"] == "skipped" and "compute-sanitizer is not on this machine" in res["message"]


def test_a_check_that_did_not_run_is_not_a_pass(tmp_path, monkeypatch):
    """Issue 62: a sanitizer missing (here AGENT_SANITIZER names no executable) fails the parity before a keep as
    `unchecked`, named, unless the user allows the keep without it by name; then the message, the record's, says
    so, and so does the kept commit's trailer. The judge's own path (tools/judge/sanitize.py sanitized), on the CPU."""
    from agent.optimize.gitops import kept_message
    from tools.judge.sanitize import sanitized
    from tools.results import ParityResult, ParityStatus, SanitizerResult
    monkeypatch.setenv("AGENT_SANITIZER", str(tmp_path / "no-such-sanitizer"))
    monkeypatch.setenv("AGENT_SCRATCH", str(tmp_path))
    assert sanitize.find_sanitizer() is None
    task = load_task(ROOT / "kernels" / "softmax")
    ok = ParityResult(status=ParityStatus.ok, message="ok: 12 checks")
    job = {"lib": "unused", "seed": 3}
    res = sanitized(task, task.module(), job, ok, ("memcheck", "racecheck"))
    assert res.status == ParityStatus.unchecked, res.message
    assert "memcheck skipped: compute-sanitizer is not on this machine" in res.message
    assert "kept only after memcheck,racecheck ran clean" in res.message and "AGENT_ALLOW_UNCHECKED=" in res.message
    half = sanitized(task, task.module(), {**job, "allow_unchecked": ["memcheck"]}, ok, ("memcheck", "racecheck"))
    assert half.status == ParityStatus.unchecked and "after racecheck ran clean" in half.message, half.message
    allowed = sanitized(task, task.module(), {**job, "allow_unchecked": ["memcheck", "racecheck"]}, ok,
                        ("memcheck", "racecheck"))
    assert allowed.status == ParityStatus.ok and allowed.message.startswith("ok: 12 checks"), allowed.message
    assert allowed.memcheck.status == "skipped" and "AGENT_ALLOW_UNCHECKED allows memcheck" in allowed.memcheck.message
    monkeypatch.setenv("AGENT_ALLOW_UNCHECKED", "racecheck, memcheck bogus")
    assert sanitize.allowed_unchecked() == ["racecheck", "memcheck"]
    # the kept commit names what did not run (and nothing where all ran)
    a = _kept(allowed)
    assert "Unchecked: memcheck, racecheck (did not run" in kept_message("r", a, None)
    clean = allowed.model_copy(update={"memcheck": SanitizerResult(tool="memcheck", status="ok", seconds=1.0),
                                       "racecheck": None})
    assert "Unchecked" not in kept_message("r", _kept(clean), None)


def _kept(parity):
    """A kept attempt as the loop records one (a proposal, a bench with its ratio and candidate timing), this parity."""
    from agent.evaluation.attempt import Attempt
    from agent.proposal import Edit, PredictedEffect, Proposal
    from tools.results import BenchResult, BenchStatus, SpeedupCI, TimingStats
    prop = Proposal(hypothesis="VEC 8", predicted=PredictedEffect(metric="time.median_ms", direction="down", speedup=1.2),
                    edits=[Edit(file="softmax.cu", search="#define VEC 1 ", replace="#define VEC 8 ")])
    bench = BenchResult(status=BenchStatus.ok, shape={"M": 4, "N": 8}, speedup_vs_baseline=SpeedupCI(
        median=1.3, low=1.2, high=1.4, rounds=8), timings=[TimingStats(label="candidate", median_ms=0.1, p10_ms=0.09,
                                                                  p90_ms=0.11, mean_ms=0.1, reps=50)])
    return Attempt(iteration=1, run_id="r", started="t", parent_sha="p", proposal=prop, parity=parity, bench=bench)


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


ADVERSARIES = {"softmax": ("softmax", "softmax.cu"), "attention_fwd": ("attention", "attention.cu")}   # folder, file


def _built(tmp_path, name: str | None, kernel: str = "softmax"):
    """The task kernels/`kernel` with the adversary `name` (tests/fixtures/cuda_cheats/, ADVERSARIES) as its kernel
    source (None: the committed one), built: (task, library)."""
    from tools.build.build import build
    d = tmp_path / kernel
    shutil.copytree(ROOT / "kernels" / kernel, d, ignore=shutil.ignore_patterns("__pycache__"))
    if name is not None:
        folder, source = ADVERSARIES[kernel]
        shutil.copy(CHEATS.parent / folder / f"{name}.cu", d / source)
    task = load_task(d)
    b = build(task, tmp_path / "b")
    assert b.status.value == "ok", b.message
    return task, b.lib_path


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["tail_rmw", "tail_overread", "rows_past_m", None])
def test_memcheck_fails_an_access_past_an_end_and_passes_the_honest_kernel(tmp_path, name):
    from tools.judge.candidate import run_candidate
    task, lib = _built(tmp_path, name)
    _, par, _, _ = run_candidate(task, Path(lib), None, parity_extent="quick", memcheck=True,
                              scratch_root=tmp_path / "s")
    assert par.memcheck is not None and par.memcheck.seconds > 0
    if name is None:
        assert par.status.value == "ok" and par.memcheck.status == "ok", par.message
    else:   # parity passes it (the output is right); memcheck does not
        assert par.status.value == "invalid_access" and par.memcheck.status == "failed", par.message
        assert "Invalid __global__" in par.message


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["long_rows_prefetch", None])
def test_memcheck_sees_a_read_past_a_tensor_whose_size_is_a_whole_allocation(tmp_path, name):
    """attention's K at B=4,H=4,S=2048 is 2 MiB, a whole allocation: a read past its end (long_rows_prefetch's last
    prefetch, only on rows of S >= 1024) lands in the next tensor's, where memcheck, which checks addresses and not
    owners, saw a valid access on an H200 until memcheck padded every allocation (sanitize.PADDING). The S = 2048 shape
    is checked shrunk (sanitize_shapes.shrunk): its rows as listed, and the read past the last head's K still caught."""
    from tools.judge.candidate import run_candidate
    task, lib = _built(tmp_path, name, "attention_fwd")
    _, par, _, _ = run_candidate(task, Path(lib), None, parity_extent="quick", memcheck=True,
                                 scratch_root=tmp_path / "s")
    assert par.memcheck is not None and par.memcheck.seconds > 0
    if name is None:
        assert par.status.value == "ok" and par.memcheck.status == "ok", par.message
    else:
        assert par.status.value == "invalid_access" and "S=2048" in par.message, par.message


def test_the_parser_quotes_the_first_race_and_counts_racechecks_errors_not_its_warnings():
    text = (ROOT / "tests" / "fixtures" / "sanitizer" / "racecheck_shared_red_reuse.log").read_text()
    n, first = sanitize.parse_log(text)
    assert n == 8     # "RACECHECK SUMMARY: 8 hazards displayed (8 errors, 0 warnings)"
    assert first.startswith("Error: Race reported between Write access at group_sum") and "group_max" in first, first
    warned = ("========= COMPUTE-SANITIZER\n========= Warning: Race reported between Write access at k()+0x10 in a.cu:3\n"
              "=========     and Write access at k()+0x10 in a.cu:3 [4 hazards]\n=========\n"
              "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n")
    assert sanitize.parse_log(warned) == (0, "")


def test_racecheck_takes_the_small_shapes_and_runs_only_where_shared_memory_is_used(tmp_path):
    from tools.judge.judge import uses_shared_memory
    task = load_task(ROOT / "kernels" / "softmax")
    got = sanitize_shapes.shapes(task.spec, task.module(), random.Random(7), sanitize_shapes.RACE_SHAPES,
                                 sanitize_shapes.RACE_ELEMENTS, sanitize_shapes.RACE_ELEMENTS)
    assert 1 <= len(got) <= sanitize_shapes.RACE_SHAPES
    assert all(s["M"] * s["N"] <= sanitize_shapes.RACE_ELEMENTS for s, _ in got)
    cmd = sanitize.command("compute-sanitizer", Path("r.log"), "racecheck")
    assert cmd[cmd.index("--tool") + 1] == "racecheck" and "--leak-check" not in cmd and "--padding" not in cmd
    for takes in (True, False):   # every allocation padded as parity's guard is, where the tool takes --padding;
        tool = tmp_path / f"sanitizer-{takes}"    # racecheck leaves torch's own kernels alone where it can be told to
        tool.write_text("#!/bin/sh\necho '  --padding arg (=0)   Size in bytes for padding buffer'\n"
                        "echo '  --kernel-name-exclude arg     key1=val1'\n" if takes else
                        "#!/bin/sh\necho '  --leak-check arg'\n")
        tool.chmod(0o755)
        mem = sanitize.command(str(tool), Path("m.log"))
        assert (int(mem[mem.index("--padding") + 1]) >= 1 << 16) if takes else "--padding" not in mem, mem
        race = sanitize.command(str(tool), Path("r.log"), "racecheck")
        excluded = [race[i + 1] for i, a in enumerate(race) if a == "--kernel-name-exclude"]
        assert excluded == (["kns=2at6native", "kns=at_cuda_detail"] if takes else []), race
        assert "--kernel-name-exclude" not in mem, mem    # memcheck: every kernel, torch's too
    plain = {"kernels": [{"name": "k", "smem_static_bytes": 0}]}
    no_dyn = {"ok": True, "launches": [{"kernel": "k", "smem_dynamic_bytes": 0}]}
    assert not uses_shared_memory(plain, no_dyn)
    assert uses_shared_memory({"kernels": [{"name": "k", "smem_static_bytes": 32}]}, no_dyn)
    assert uses_shared_memory(plain, {"ok": True, "launches": [{"kernel": "k", "smem_dynamic_bytes": 4096}]})
    assert uses_shared_memory(None, None)    # not known: racecheck runs


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["shared_red_reuse", None])
def test_racecheck_fails_a_shared_memory_race_and_passes_the_honest_kernel(tmp_path, name):
    task, lib = _built(tmp_path, name)
    res = sanitize.memcheck(task, task.module(), {"lib": lib}, tmp_path, 1, "racecheck")
    assert res["tool"] == "racecheck" and res["seconds"] > 0
    assert res["status"] == ("ok" if name is None else "failed"), res["message"]


def _slow_wrapper(tmp_path: Path, delay: float) -> Path:
    """A stand-in for compute-sanitizer: takes its options, waits `delay` seconds (its start-up), runs the host."""
    exe = tmp_path / "fake-sanitizer"
    exe.write_text("#!/bin/bash\n"
                   '[ "$1" = --help ] && { echo "  --padding arg (=0)"; exit 0; }   # what it takes (sanitize.padded)\n'
                   f'while [ $# -gt 0 ] && [ "$1" != "{sys.executable}" ]; do shift; done\n'
                   f"echo $$ >> {tmp_path}/wrapper.pids\nsleep {delay}\nexec \"$@\"\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_the_sanitizers_start_beside_parity_and_a_failed_parity_ends_them_at_once(tmp_path, monkeypatch):
    """Issue 66: the judge starts the sanitizers' hosts before parity (their start-up paid while parity runs) and
    joins them after it; where parity fails it ends them where they are, not after their start-up or their shapes,
    and leaves no process. The judge's own class (tools/judge/sanitize.py Sanitizing), on the CPU, under a stand-in
    sanitizer that takes 30 s to start."""
    import time

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.sanitize import Sanitizing
    from tools.results import ParityResult, ParityStatus
    task, lib = make_task(tmp_path, "correct")
    monkeypatch.setenv("AGENT_SCRATCH", str(tmp_path))
    monkeypatch.setenv("AGENT_SANITIZER", str(_slow_wrapper(tmp_path, 30)))
    beside = Sanitizing(task, task.module(), {"lib": str(lib), "seed": 2}, ("memcheck", "racecheck"))
    time.sleep(1.0)                         # parity runs here, and fails
    t0 = time.monotonic()
    beside.stop()
    assert time.monotonic() - t0 < 10, "the sanitizers were waited for"
    pids = [int(p) for p in (tmp_path / "wrapper.pids").read_text().split()]
    assert len(pids) == 2 and not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert [f.result()["message"] for f in beside.futures] == [
        f"{c} stopped: its answer was not needed (parity had failed)" for c in ("memcheck", "racecheck")]
    # a parity that passes: the checks' answer joins it (here the stand-in reports nothing: clean on every shape)
    monkeypatch.setenv("AGENT_SANITIZER", str(_slow_wrapper(tmp_path, 0)))
    beside = Sanitizing(task, task.module(), {"lib": str(lib), "seed": 2}, ("memcheck",))
    try:
        par = beside.result(ParityResult(status=ParityStatus.ok, message="ok: 3 checks", seconds=1.0))
    finally:
        beside.stop()
    assert par.status == ParityStatus.ok and par.memcheck.status == "ok", par.message
    assert par.memcheck.shapes >= 1 and "memcheck clean on" in par.message
    # where its seconds went, in the record: each step once, in order, adding up to its seconds
    steps = par.memcheck.steps
    assert list(steps) == ["wait", "load", "calls", "finish", "slowest"], steps
    assert par.memcheck.slowest_shape and steps["slowest"] <= steps["calls"]
    assert abs(sum(v for k, v in steps.items() if k != "slowest") - par.memcheck.seconds) < 0.05


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_racecheck_checks_pytorchs_kernels_too_where_the_candidate_names_one(tmp_path, monkeypatch):
    """racecheck leaves PyTorch's own kernels out (sanitize.TORCH_KERNELS: the host's copies and comparisons), which
    would leave out a candidate's kernel that kept PyTorch's namespace (code copied from at::native). Such a library
    is found by its bytes, and its racecheck runs in a host of its own that checks every kernel: the one started early
    with the exclusion is ended unused. The judge's own functions, on the CPU, under a stand-in sanitizer that writes
    down its command line."""
    import time

    from tests.fixtures.cpu_faults.faults import make_task
    task, lib = make_task(tmp_path, "correct")
    named = tmp_path / "copied_from_torch.so"    # bytes after the ELF's sections: the loader ignores them
    named.write_bytes(Path(lib).read_bytes() + b"\0_ZN2at6native12_GLOBAL__N_114softmax_kernelEv\0")
    assert sanitize.names_torch_kernels(named) and not sanitize.names_torch_kernels(lib)
    assert sanitize.names_torch_kernels(tmp_path / "missing.so")     # unread: every kernel checked
    exe = tmp_path / "argv-sanitizer"
    exe.write_text("#!/bin/bash\n"
                   '[ "$1" = --help ] && { echo "  --padding arg"; echo "  --kernel-name-exclude arg"; exit 0; }\n'
                   f'echo "$*" >> {tmp_path}/argv.log\n'
                   f'while [ $# -gt 0 ] && [ "$1" != "{sys.executable}" ]; do shift; done\nexec "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("AGENT_SCRATCH", str(tmp_path))
    monkeypatch.setenv("AGENT_SANITIZER", str(exe))
    log = tmp_path / "argv.log"
    for n, path in enumerate((lib, named)):
        early = sanitize.start_hosts(task.root, tmp_path, ("racecheck",))
        deadline = time.monotonic() + 60      # the early host's stand-in has written its line (it may be ended next)
        while time.monotonic() < deadline and len(log.read_text().splitlines() if log.exists() else []) < n + 1:
            time.sleep(0.05)
        res = sanitize.memcheck(task, task.module(), {"lib": str(path)}, tmp_path, 1, "racecheck",
                                started=early["racecheck"])
        assert res["status"] == "ok", res["message"]
    lines = log.read_text().splitlines()
    # the plain library in the early host; the named one: the early host (ended), then its own without the exclusion
    assert ["kns=2at6native" in ln for ln in lines] == [True, True, False], lines
    assert all("--tool racecheck" in ln for ln in lines), lines


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_hosts_started_before_the_job_serve_the_checks_and_the_unused_ones_end(tmp_path, monkeypatch):
    """Issue 66: the confirmation's sanitizer hosts start before its candidate is known (start_hosts: on the card their
    start-up runs during the keep's Nsight Compute pass); the check asked for runs in the host started early (no
    second start), the one not asked for is ended, and none is left. Then the judge child itself (--sanitize-early,
    prestart_candidate): hosts it started and no check took (a CPU task has none) end with it."""
    import time

    from tests.fixtures.cpu_faults.faults import make_task
    from tools.judge.candidate import prestart_candidate, run_candidate
    from tools.judge.sanitize import Sanitizing, start_hosts
    from tools.results import ParityResult, ParityStatus
    task, lib = make_task(tmp_path, "correct")
    monkeypatch.setenv("AGENT_SCRATCH", str(tmp_path))
    monkeypatch.setenv("AGENT_SANITIZER", str(_slow_wrapper(tmp_path, 0)))
    pids_file = tmp_path / "wrapper.pids"
    early = start_hosts(task.root, tmp_path)
    assert sorted(early) == ["memcheck", "racecheck"]
    for _ in range(100):                      # both wrappers up before the job is known
        if pids_file.exists() and len(pids_file.read_text().split()) == 2:
            break
        time.sleep(0.1)
    beside = Sanitizing(task, task.module(), {"lib": str(lib), "seed": 2}, ("memcheck",), early)
    assert early == {}, "the checks took the started hosts (used or ended)"
    try:
        par = beside.result(ParityResult(status=ParityStatus.ok, message="ok: 3 checks", seconds=1.0))
    finally:
        beside.stop()
    assert par.status == ParityStatus.ok and par.memcheck.status == "ok" and par.memcheck.shapes >= 1, par.message
    assert par.racecheck is None
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2, "a host was started again for the check"
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    # the judge child started with --sanitize-early: its hosts start with it, and end with it where nothing took them;
    # not racecheck's where the job leaves it for after the keep (agent/optimize/revoke.py: it would sit unused)
    pids_file.unlink()
    warm = prestart_candidate(task, tmp_path / "scratch", sanitize_early=True, later=("racecheck",))
    try:
        for _ in range(300):
            if pids_file.exists() and len(pids_file.read_text().split()) >= 1:
                break
            time.sleep(0.1)
        time.sleep(0.5)                      # a second host, were one started, would have written its pid by now
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 1 and "--sanitize-early=memcheck" in warm.proc.argv, (pids, warm.proc.argv)
        got = run_candidate(task, lib, None, warm=warm, scratch_root=tmp_path / "scratch")
    finally:
        warm.close()
    assert got.parity is not None and got.parity.status == ParityStatus.ok, got.parity
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")], "a started host outlived the child"


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_a_host_started_early_that_ended_while_it_waited_is_replaced_not_charged_to_the_candidate(tmp_path,
                                                                                                 monkeypatch):
    """Issue 66: a host held for a keep's check (start_hosts; tools/judge/later.py holds one while the next candidate
    is proposed) can end while it waits (killed, out of memory). The check then starts a host of its own and answers
    on the candidate; before, it answered "could not start" and revoked a good keep. Both directions: the host that
    lives is used (one start), the dead one replaced (a second)."""
    import signal
    import time

    from tests.fixtures.cpu_faults.faults import make_task
    task, lib = make_task(tmp_path, "correct")
    monkeypatch.setenv("AGENT_SCRATCH", str(tmp_path))
    monkeypatch.setenv("AGENT_SANITIZER", str(_slow_wrapper(tmp_path, 0)))
    pids_file = tmp_path / "wrapper.pids"

    def started_pids(n: int) -> list[int]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(pids_file.read_text().split() if pids_file.exists() else []) < n:
            time.sleep(0.05)
        return [int(p) for p in pids_file.read_text().split()]

    early = sanitize.start_hosts(task.root, tmp_path, ("racecheck",))
    started_pids(1)
    job = {"lib": str(lib)}
    res = sanitize.memcheck(task, task.module(), job, tmp_path, 1, "racecheck", started=early["racecheck"])
    assert res["status"] == "ok" and len(started_pids(1)) == 1, (res["message"], "a live host was not used")
    early = sanitize.start_hosts(task.root, tmp_path, ("racecheck",))
    dead = started_pids(2)[1]
    os.kill(dead, signal.SIGKILL)
    early["racecheck"].host.proc.wait(timeout=30)
    res = sanitize.memcheck(task, task.module(), job, tmp_path, 1, "racecheck", started=early["racecheck"])
    assert res["status"] == "ok", res["message"]
    pids = started_pids(3)
    assert len(pids) == 3 and pids[1] == dead, pids
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
