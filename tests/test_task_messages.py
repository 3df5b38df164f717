"""The messages a new task's author meets, each one the line to act on (tools/task_messages.py): a misspelt
key before the key it left missing, with the known key it is closest to; a knob named by its name, not
its position; shapes whose keys differ refused at load, not at a KeyError in parity; make_inputs's answer
checked where parity first calls it; a mistyped task folder answered with the one it was closest to.
Each defect is made in a copy of kernels/matmul_cpu; the folder and make_inputs are run as the user runs
them, `python -m agent check` in a git repository of theirs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.userrepo import REPO, agent, make_user_repo
from tools.task import TaskError, load_task
from tools.backends.toolchain import find_cxx, find_ninja


def _task(tmp_path: Path, toml_edit=None) -> Path:
    """A copy of kernels/matmul_cpu with task.toml edited."""
    dst = tmp_path / "matmul_cpu"
    shutil.copytree(REPO / "kernels" / "matmul_cpu", dst, ignore=shutil.ignore_patterns("__pycache__"))
    if toml_edit:
        toml = dst / "task.toml"
        toml.write_text(toml_edit(toml.read_text()))
    return dst


def _load_error(task: Path) -> str:
    with pytest.raises(TaskError) as e:
        load_task(task)
    return str(e.value)


def _knob(text: str, name: str, old: str, new: str) -> str:
    """text with old replaced by new in the [[knobs]] table named name only."""
    start = text.index(f'name = "{name}"')
    end = text.find("[[knobs]]", start)
    end = len(text) if end < 0 else end
    assert old in text[start:end], (name, old)
    return text[:start] + text[start:end].replace(old, new, 1) + text[end:]


def test_a_misspelt_key_in_a_knob_is_reported_before_the_key_it_left_missing(tmp_path):
    msg = _load_error(_task(tmp_path, lambda t: _knob(t, "BLOCK_M", "default =", "defualt =")))
    assert msg.endswith('task.toml: knobs "BLOCK_M".defualt: unknown key: did you mean \'default\'?'), msg
    assert "Field required" not in msg and "knobs.1" not in msg, msg


def test_a_misspelt_key_elsewhere_is_answered_with_the_closest_known_key(tmp_path):
    msg = _load_error(_task(tmp_path, lambda t: t.replace("rounds = 8", "round = 8")))
    assert msg.endswith("task.toml: bench.round: unknown key: did you mean 'rounds'?"), msg
    # a key close to none: the keys its table takes, instead of a guess
    msg = _load_error(_task(tmp_path / "far", lambda t: t.replace("[bench]\n", "[bench]\ncolour = 1\n")))
    assert msg.endswith("task.toml: bench.colour: unknown key (a typo?); [bench] takes warmup_ms, rep_ms, rounds, "
                        "input_sets, min_gain, timeout_s, confidence"), msg


def test_a_knob_is_named_by_its_name(tmp_path):
    msg = _load_error(_task(tmp_path, lambda t: _knob(t, "BLOCK_N", "default = 16", "default = 17")))
    assert msg.endswith('task.toml: knobs "BLOCK_N": knob BLOCK_N: default 17 is not one of its '
                        "values [16, 32, 64, 128, 256]"), msg
    assert "knobs.2" not in msg, msg
    msg = _load_error(_task(tmp_path / "role", lambda t: _knob(t, "BLOCK_K", 'role = "tile"', 'role = "tiles"')))
    assert re.search(r'task\.toml: knobs "BLOCK_K"\.role: Input should be .*\'tile\'', msg), msg


def test_shapes_with_different_keys_are_refused_at_load(tmp_path):
    # before, this loaded, and parity failed on the second shape with `KeyError: 'K'`
    msg = _load_error(_task(tmp_path, lambda t: t.replace("{ M = 96,  N = 160, K = 72 }",
                                                          "{ M = 96,  N = 160, dim = 72 }")))
    assert msg.endswith("task.toml: shapes: shape 1 { M = 96, N = 160, dim = 72 } has the keys M, N, dim "
                        "but shape 0 { M = 64, N = 64, K = 64 } has M, N, K: give every shape the same keys"), msg
    assert "KeyError" not in msg


def test_a_mistyped_task_folder_is_answered_with_the_closest_one(tmp_path):
    root = make_user_repo(tmp_path / "user")
    res = agent(root, "check", "kernels/matmul_cp", timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "error: kernels/matmul_cp does not exist: did you mean kernels/matmul_cpu?" in res.stderr, res.stderr
    # a bare name is looked up under kernels/ (docs/TASKS.md section 1), and so is its suggestion
    res = agent(root, "check", "matmul_cp", timeout=120)
    assert res.returncode == 2 and "error: matmul_cp does not exist: did you mean matmul_cpu?" in res.stderr, \
        res.stdout + res.stderr
    # nothing close: the old hint, no guess
    res = agent(root, "check", "kernels/softmax_gpu", timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "kernels/softmax_gpu does not exist: give a task folder" in res.stderr and "did you mean" not in res.stderr


def test_make_inputs_returning_a_bare_tensor_is_named_in_agent_check(tmp_path):
    if not (find_cxx() and find_ninja()):
        pytest.skip("no C++ compiler or ninja here: the task cannot be built")
    root = make_user_repo(tmp_path / "user")
    py = root / "kernels" / "matmul_cpu" / "task.py"
    text = py.read_text()
    assert "return a.to(device).contiguous(), b.to(device).contiguous()" in text
    py.write_text(text.replace("return a.to(device).contiguous(), b.to(device).contiguous()",
                               "return a.to(device).contiguous()"))
    res = agent(root, "check", "kernels/matmul_cpu", "--json", timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    parity = json.loads(res.stdout)["parity"]
    assert parity["status"] == "error", parity
    assert parity["message"].startswith(
        "M=64,N=64,K=64 dist=normal: TypeError: task.py's make_inputs returned a Tensor (float32 [64, 64]); it must "
        "return a tuple or list of the inputs (tensors): return a, b; or return (x,) for one"), parity["message"]
    assert "positional arguments" not in parity["message"], parity["message"]


def test_make_inputs_returning_a_bare_tensor_is_named_by_the_bench_too(tmp_path):
    """The bench (and the probes, the profiler's target, the launch tracer) call make_inputs themselves:
    `python -m tools.measure.bench` on its own gets the same message, not `empty_output() takes 2 positional
    arguments but 64 were given`."""
    if not (find_cxx() and find_ninja()):
        pytest.skip("no C++ compiler or ninja here: the task cannot be built")
    import subprocess
    import sys
    d = _task(tmp_path)
    py = d / "task.py"
    py.write_text(py.read_text().replace("return a.to(device).contiguous(), b.to(device).contiguous()",
                                         "return a.to(device).contiguous()"))
    res = subprocess.run([sys.executable, "-m", "tools.measure.bench", str(d), "--json"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    [r] = json.loads(res.stdout)
    assert r["status"] == "error" and re.search(r"task.py's make_inputs returned a Tensor \(float32 \[\d+, \d+\]\); "
                                                r"it must return a tuple", r["message"]), r
    assert "positional arguments" not in r["message"], r["message"]


def test_hidden_shapes_without_a_key_of_the_shapes_are_named_in_agent_check(tmp_path):
    """A hidden shape lacking a key failed as `KeyError: 'K'` inside the kernel's run; now parity says
    which function returned what."""
    if not (find_cxx() and find_ninja()):
        pytest.skip("no C++ compiler or ninja here: the task cannot be built")
    root = make_user_repo(tmp_path / "user")
    py = root / "kernels" / "matmul_cpu" / "task.py"
    old = '"K": rng.randint(17, 150)}'
    assert old in py.read_text()
    py.write_text(py.read_text().replace(old, '"k": rng.randint(17, 150)}'))
    res = agent(root, "check", "kernels/matmul_cpu", "--json", timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    parity = json.loads(res.stdout)["parity"]
    assert parity["status"] == "error", parity
    assert re.fullmatch(r"task.py's hidden_shapes returned \{ M = \d+, N = \d+, k = \d+ \} with the keys M, N, k, "
                        r"but task.toml's shapes have M, N, K: give hidden shapes the same keys", parity["message"]), \
        parity["message"]
