"""Linking an earlier build's objects (tools/build/reuse.py) when that build may be days old: only what
ninja itself would not rebuild (the same compilers and flags, no file read newer than the object) and
only with the task's own files the same bytes. A CPU ctypes task whose non-editable file includes a
header from outside the task, built in about a second; the run-level path is in test_extension.py."""

import os
import shutil
import time
from pathlib import Path

import pytest

from tools.build.build import build, obj_name, write_ninja
from tools.results import BuildStatus
from tools.build.reuse import latest_builds, reusable_objects
from tools.task import load_task
from tools.backends.toolchain import find_cxx, find_ninja

pytestmark = pytest.mark.skipif(find_cxx() is None or find_ninja() is None, reason="no C++ compiler or ninja")

TASK_PY = """\
import torch
def make_inputs(shape, seed, device, dist):
    return (torch.ones(shape["N"]),)
def reference(shape, x):
    return x
def empty_output(shape, x):
    return torch.empty(shape["N"])
def run(lib, shape, out, x):
    out.copy_(x)
"""


def _task(root: Path, inc: Path, flags: str = "") -> Path:
    d = root / "t"
    d.mkdir(parents=True)
    (d / "fixed.cpp").write_text('#include "outside.h"\nextern "C" int fixed() { return OUTSIDE; }\n')
    (d / "k.cpp").write_text('extern "C" int k() { return 1; }\n')
    (d / "task.py").write_text(TASK_PY)
    (d / "task.toml").write_text(
        f'name = "t"\ndevice = "cpu"\nsources = ["fixed.cpp", "k.cpp"]\neditable = ["k.cpp"]\n'
        f'shapes = [{{ N = 4 }}]\n[tolerance.float32]\natol = 1e-4\nrtol = 1e-4\n'
        f'[build]\nflags = ["-I{inc}"{flags}]\n')
    return d


def _ours(task, src: Path, where: Path) -> Path:
    """The build.ninja a new build of `task` from `src` would write (its rules and flags)."""
    where.mkdir(parents=True, exist_ok=True)
    write_ninja(task, where, src, {"ninja": find_ninja(), "c++": find_cxx(), "nvcc": None}, None)
    return where / "build.ninja"


def test_an_old_build_is_linked_only_where_ninja_would_not_rebuild_it(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "outside.h").write_text("#define OUTSIDE 7\n")
    src = _task(tmp_path / "a", inc)
    earlier = tmp_path / "earlier"
    assert build(load_task(src), earlier).status == BuildStatus.ok
    objects = {f: obj_name(f) for f in ("fixed.cpp", "k.cpp")}

    # another checkout of the same task (a later run's worktree): every object is linked, the editable file's too
    # (its bytes are the same: a run's first build after `agent check`)
    later = tmp_path / "b" / "t"
    shutil.copytree(src, later)
    task = load_task(later)
    got = reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n1"))
    assert got == {f: (earlier / obj_name(f)).resolve() for f in ("fixed.cpp", "k.cpp")}
    res = build(task, tmp_path / "new", reuse=earlier)
    assert res.status == BuildStatus.ok and res.steps_run == 1 and res.log.count("(reused:") == 2, res.log
    # a candidate's edit: the editable file is compiled, the other still linked
    (later / "k.cpp").write_text('extern "C" int k() { return 2; }\n')
    got = reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n1"))
    assert got == {"fixed.cpp": (earlier / obj_name("fixed.cpp")).resolve()}
    res = build(task, tmp_path / "new2", reuse=earlier)
    assert res.status == BuildStatus.ok and res.steps_run == 2 and res.log.count("(reused:") == 1, res.log

    # other flags (the task's build.flags changed since): compiled, not linked
    other = _task(tmp_path / "c", inc, flags=', "-DMORE=1"')
    t2 = load_task(other)
    assert reusable_objects(t2, earlier, find_ninja(), objects, other, _ours(t2, other, tmp_path / "n2")) == {}

    # a header outside the task changed after the object was made (torch or the compiler upgraded)
    future = time.time() + 60
    os.utime(inc / "outside.h", (future, future))
    assert reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n3")) == {}
    # ... or is gone
    (inc / "outside.h").unlink()
    assert reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n4")) == {}
    (inc / "outside.h").write_text("#define OUTSIDE 7\n")
    os.utime(inc / "outside.h", (1, 1))   # back as it was: the task's own files decide below
    (later / "k.cpp").write_text((src / "k.cpp").read_text())   # the candidate's edit undone
    assert set(reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n5"))) \
        == {"fixed.cpp", "k.cpp"}
    # the earlier build's own file edited after it (a user's edit, committed, after `agent check`), and the same new
    # bytes here: the object is of the old bytes, so it is compiled
    future = time.time() + 90
    (src / "fixed.cpp").write_text((src / "fixed.cpp").read_text() + "// edited\n")
    (later / "fixed.cpp").write_text((src / "fixed.cpp").read_text())
    os.utime(src / "fixed.cpp", (future, future))
    got = reusable_objects(task, earlier, find_ninja(), objects, later, _ours(task, later, tmp_path / "n6"))
    assert got == {"k.cpp": (earlier / obj_name("k.cpp")).resolve()}, got
    # ... and in one folder (the earlier build's source folder is this build's): an edit there is seen too
    (src / "k.cpp").write_text('extern "C" int k() { return 3; }\n')
    os.utime(src / "k.cpp", (future, future))
    assert reusable_objects(load_task(src), earlier, find_ninja(), objects) == {}



def test_the_latest_builds_of_the_task_under_the_runs_folder_are_offered_newest_first(tmp_path):
    runs = tmp_path / "runs"
    task = load_task(_task(tmp_path, tmp_path))
    assert latest_builds(task, runs) == []
    for i, d in enumerate([runs / "_build" / "t", runs / "r1" / "build", runs / "r2" / "build", runs / "r3" / "build"]):
        d.mkdir(parents=True)
        if d.parent.name != "r3":              # r3: a build that never finished (no library)
            (d / "libt.so").write_bytes(b"x")
            os.utime(d / "libt.so", (1000 + i, 1000 + i))
    (runs / "_build" / "other").mkdir()
    assert latest_builds(task, runs) == [runs / "r2" / "build", runs / "r1" / "build", runs / "_build" / "t"]
    assert latest_builds(task, runs, exclude=runs / "r2" / "build", most=1) == [runs / "r1" / "build"]
    # a run another agent drives now (its lock names a live process): its build folder is rewritten per candidate,
    # never offered; once that process is gone, offered again
    import subprocess
    import sys
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (runs / "r2" / "agent.lock").write_text(f"{other.pid}\n")
        assert latest_builds(task, runs) == [runs / "r1" / "build", runs / "_build" / "t"]
    finally:
        other.kill()
        other.wait()
    assert latest_builds(task, runs)[0] == runs / "r2" / "build"
