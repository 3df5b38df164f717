"""The machine's object cache (tools/build/objcache.py) with the real compilers: the same bytes built in another folder
are linked from it, anything the compile read that changed is compiled again, __FILE__ names no folder, an object that
holds its folder's path (debug info) stays in that folder, and the cache stays under its size."""

import ctypes
import os
import shutil
from pathlib import Path

import pytest

from tests.test_build import call_fa, two_source_task
from tools.build import objcache
from tools.build.build import build
from tools.results import BuildStatus
from tools.task import load_task


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "objects"
    monkeypatch.setenv("AGENT_OBJECT_CACHE", str(folder))
    return folder


def test_the_same_bytes_in_another_folder_are_linked_and_a_change_is_compiled(tmp_path, cache):
    first = build(load_task(two_source_task(tmp_path / "one")), tmp_path / "b1")
    assert first.status == BuildStatus.ok and first.steps_run == 3, first.log
    assert len(list(cache.glob("*/*/deps.json"))) == 2          # a.cpp's and b.cpp's objects
    # another repository's copy of the same task: both objects from the cache, only the link runs
    res = build(load_task(two_source_task(tmp_path / "two")), tmp_path / "b2")
    assert res.status == BuildStatus.ok and res.steps_run == 1, res.log
    assert res.log.count("(object cache:") == 2 and call_fa(res.lib_path) == 2.0
    # the record still says which flags made each object: the same as the first build's, said linked
    here = lambda c: c.split("   #")[0].replace(str((tmp_path / "two").resolve()), str((tmp_path / "one").resolve())) \
        .replace(str((tmp_path / "b2").resolve()), str((tmp_path / "b1").resolve()))  # noqa: E731
    assert [here(c) for c in res.commands[:2]] == first.commands[:2] \
        and all("linked" in c for c in res.commands[:2]), res.commands
    # the header a.cpp includes has other bytes: a.cpp compiled, b.cpp still linked
    res = build(load_task(two_source_task(tmp_path / "three", header="#define SCALE 3.0f")), tmp_path / "b3")
    assert res.steps_run == 2 and "== a.cpp (compiled) ==" in res.log and "== b.cpp (object cache:" in res.log, res.log
    assert call_fa(res.lib_path) == 3.0
    # a candidate's edit of a.cpp: compiled
    res = build(load_task(two_source_task(tmp_path / "four", body="return SCALE * x + 1.0f;")), tmp_path / "b4")
    assert res.steps_run == 2 and "== a.cpp (compiled) ==" in res.log and call_fa(res.lib_path) == 3.0


def test_an_object_the_build_folder_holds_up_to_date_stays(tmp_path, cache):
    """The cache serves what ninja would compile, never an object the folder already holds (an incremental build
    stays one: nothing runs)."""
    task = load_task(two_source_task(tmp_path / "one"))
    build(task, tmp_path / "b1")
    build(load_task(two_source_task(tmp_path / "two")), tmp_path / "b2")
    again = build(task, tmp_path / "b1")
    assert again.status == BuildStatus.ok and again.steps_run == 0 and "(object cache:" not in again.log, again.log


def test_other_flags_are_not_linked(tmp_path, cache):
    build(load_task(two_source_task(tmp_path / "one")), tmp_path / "b1")
    d = two_source_task(tmp_path / "two")
    (d / "task.toml").write_text((d / "task.toml").read_text() + '\n[build]\nflags = ["-DX=1"]\n')  # the task's flags
    res = build(load_task(d), tmp_path / "b2")
    assert res.status == BuildStatus.ok and res.steps_run == 3 and "(object cache:" not in res.log, res.log


def test_file_is_named_as_the_task_names_it_and_an_object_that_names_its_folder_stays_there(tmp_path, cache):
    """__FILE__ (an assertion's message, TORCH_CHECK's) names the file as the task does (build.folder_free), not the
    folder it was built in: the object is the same bytes in another folder and linked from the cache. An object that
    still holds its folder (debug info: build.flags = ["-g"]) is compiled in another folder, so that what it says
    names its own file; its own folder built again takes it from the cache."""
    body = 'return SCALE * x; }\nextern "C" const char* where() { return __FILE__;'
    assert build(load_task(two_source_task(tmp_path / "one", body=body)), tmp_path / "b1").status == BuildStatus.ok
    res = build(load_task(two_source_task(tmp_path / "two", body=body)), tmp_path / "b2")
    assert res.log.count("(object cache:") == 2, res.log
    lib = ctypes.CDLL(res.lib_path)
    lib.where.restype = ctypes.c_char_p
    assert lib.where().decode() == "a.cpp"

    def debug(root: Path) -> Path:
        two_source_task(root, body=body)
        (root / "task.toml").write_text((root / "task.toml").read_text() + '[build]\nflags = ["-g"]\n')
        return root
    one = debug(tmp_path / "g1")
    first = build(load_task(one), tmp_path / "c1")
    assert first.status == BuildStatus.ok and str(one.resolve()).encode() in (tmp_path / "c1" / "obj" / "a.cpp.o").read_bytes()
    res = build(load_task(debug(tmp_path / "g2")), tmp_path / "c2")
    assert "== a.cpp (compiled) ==" in res.log and "== b.cpp (compiled) ==" in res.log, res.log
    shutil.rmtree(tmp_path / "c1")
    res = build(load_task(one), tmp_path / "c1")        # its own folders again: from the cache
    assert res.log.count("(object cache:") == 2, res.log


def test_off_stores_nothing_and_the_size_bound_evicts_the_oldest(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("AGENT_OBJECT_CACHE", "0")
    assert build(load_task(two_source_task(tmp_path / "one")), tmp_path / "b1").steps_run == 3
    assert not cache.exists()
    monkeypatch.setenv("AGENT_OBJECT_CACHE", str(cache))
    build(load_task(two_source_task(tmp_path / "two")), tmp_path / "b2")
    entries = sorted(cache.glob("*/*/deps.json"))
    assert len(entries) == 2
    old = entries[0].parent
    os.utime(old, (1, 1))                                # used longest ago
    sizes = {e.parent: sum(f.stat().st_size for f in e.parent.iterdir()) for e in entries}
    objcache.evict(cache, sum(sizes.values()) - 1)
    assert not old.exists() and all(e.parent.exists() for e in entries if e.parent != old)
    # a store killed halfway leaves a folder that the next eviction takes away once it is an hour old
    stale = cache / ".tmp-1-1"
    stale.mkdir()
    os.utime(stale, (1, 1))
    objcache.evict(cache, 1 << 30)
    assert not stale.exists()


def test_a_cache_it_cannot_read_or_write_is_a_slower_build_not_a_failed_one(tmp_path, cache):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("not a folder")                   # AGENT_OBJECT_CACHE pointing at a file
    res = build(load_task(two_source_task(tmp_path / "one")), tmp_path / "b1")
    assert res.status == BuildStatus.ok and res.steps_run == 3 and "(object cache:" not in res.log, res.log
