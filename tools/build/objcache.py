"""A machine-wide cache of compiled objects, keyed on what each compile read (issue 61).

tools.build.reuse links objects of earlier builds of the same task (`agent check`'s build into a run's, a sweep's
initial build into each configuration). Builds of the same bytes elsewhere missed it: a task imported again (`agent
import kernelbench` of a problem imported before, into another repository), a second clone, a run in another folder;
a file that includes torch's headers costs 8-25 s a compile on 2 cores. This cache keys an object as ccache's direct
mode does: the compile's rules and edge (the compilers, every flag, the precompiled header's folder), the source's
path inside the task, its bytes and the machine's CPU (`-march=native`); an entry holds the object, the compiler's
output beside it (ptxas' report) and what the compile read (ninja's dependency log): each file of the task or of the
build folder by its bytes, each file outside them (torch's headers, the compiler's, the precompiled header) by its
path, size and mtime. A build links a cached object only where every one of those is the same now; a candidate's
edit changes the bytes, and its file is compiled.

- Where: $AGENT_CACHE/objects (tools.backends.pch.cache_root); AGENT_OBJECT_CACHE=0 turns it off, a path puts it
  there instead.
- Paths: `__FILE__` (an assertion's message, TORCH_CHECK's) names no folder (tools.build.build.folder_free's
  -fmacro-prefix-map); an object that still holds its source folder's or build folder's path (debug info, nvcc's
  -lineinfo) is keyed on those folders too, so that no object names another folder's file.
- Size: at most AGENT_OBJECT_CACHE_MB megabytes (default 2048), checked at a process's first store and then at most
  once a minute (the walk stats every entry); the least recently used entries go first.
- Concurrency: an entry is written to a folder of its own and renamed into place; a hit is copied into the build's
  own folder (cached/) before it is linked, so that an entry evicted meanwhile cannot break the link.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from tools.build.reuse import ninja_deps, ninja_edge, ninja_rules, swap_folders

VERSION = 1
DEFAULT_MB = 2048
EVICT_EVERY_S = 60.0      # a process walks the cache for its size bound at most this often (its first store always)
_evicted = float("-inf")


def cache_dir() -> Path | None:
    """The cache's folder, or None where AGENT_OBJECT_CACHE=0."""
    val = os.environ.get("AGENT_OBJECT_CACHE", "")
    if val == "0":
        return None
    if val:
        return Path(val)
    from tools.backends.pch import cache_root
    return cache_root() / "objects"


@lru_cache(maxsize=1)
def _machine() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    keep = [ln for ln in lines if ln.startswith(("model name", "flags"))][:2]
    return platform.machine() + "\n" + "\n".join(keep)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _key(ninja_file: Path, build_dir: Path, src_dir: Path, rel: str, obj: str, bound: bool) -> str | None:
    """The key of `rel`'s compile in this build: its rules and edge with the two folders taken out (`bound`: left
    in), its path in the task, its bytes, the machine."""
    rules, edge = ninja_rules(ninja_file), ninja_edge(ninja_file, obj)
    try:
        data = (src_dir / rel).read_bytes()
    except OSError:
        return None
    if not rules or not edge:
        return None

    def norm(s: str) -> str:
        return s if bound else swap_folders(s, {str(build_dir): "@BUILD@", str(src_dir): "@SRC@"})
    head = json.dumps([VERSION, norm(rules), [norm(ln) for ln in edge], rel, _machine(),
                       [str(build_dir), str(src_dir)] if bound else None])
    return _sha(head.encode() + b"\0" + data)


def _describe(dep: Path, build_dir: Path, src_dir: Path) -> dict | None:
    """One file the compile read, as the entry keeps it (None: unreadable)."""
    try:
        for kind, base in (("src", src_dir), ("build", build_dir)):
            if dep.is_relative_to(base):
                return {kind: str(dep.relative_to(base)), "sha": _sha(dep.read_bytes())}
        st = dep.stat()
        return {"abs": str(dep), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        return None


def _holds(d: dict, build_dir: Path, src_dir: Path) -> bool:
    """True when the file an entry recorded is the same here and now."""
    try:
        if "abs" in d:
            st = Path(d["abs"]).stat()
            return st.st_size == d["size"] and st.st_mtime_ns == d["mtime_ns"]
        base = src_dir if "src" in d else build_dir
        return _sha((base / d.get("src", d.get("build", ""))).read_bytes()) == d["sha"]
    except (OSError, KeyError, TypeError):
        return False


def _to_compile(ninja: str, build_dir: Path) -> set[str]:
    """The outputs ninja would make now in build_dir (a dry run: nothing run, its logs unwritten)."""
    mark = "@@objcache "
    try:
        proc = subprocess.run([ninja, "-C", str(build_dir), "-n"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "NINJA_STATUS": mark})
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {ln.split()[-1] for ln in proc.stdout.splitlines() if ln.startswith(mark)}


def lookup(ninja: str, build_dir: Path, src_dir: Path, objects: dict[str, str]) -> dict[str, Path]:
    """The cached objects among `objects` (a source -> its object's path in the build folder) that this build would
    compile (an object the folder holds up to date stays), whose every input is the same here; each copied into
    build_dir/cached/ (with its compiler output beside it). Never raises: a cache it cannot read is a cache miss."""
    try:
        return _lookup(ninja, build_dir, src_dir, objects)
    except OSError:
        return {}


def _lookup(ninja: str, build_dir: Path, src_dir: Path, objects: dict[str, str]) -> dict[str, Path]:
    root = cache_dir()
    out: dict[str, Path] = {}
    if root is None or not objects or not root.is_dir():
        return out
    ninja_file = build_dir / "build.ninja"
    found = {}          # the entries of each source's key (bound or not); a candidate's new bytes have none
    for rel, obj in objects.items():
        keys = [_key(ninja_file, build_dir, src_dir, rel, obj, bound) for bound in (False, True)]
        if dirs := [root / k for k in keys if k and (root / k).is_dir()]:
            found[rel] = dirs
    stale = _to_compile(ninja, build_dir) if found else set()    # ninja's dry run only where an entry may serve
    for rel, dirs in found.items():
        if objects[rel] not in stale:
            continue
        for entries in dirs:
            if (got := _first_valid(entries, build_dir, src_dir, objects[rel])) is not None:
                out[rel] = got
                break
    return out


def _first_valid(entries: Path, build_dir: Path, src_dir: Path, obj: str) -> Path | None:
    try:
        variants = sorted(entries.iterdir(), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return None
    name = Path(obj).name
    for v in variants:
        try:
            deps = json.loads((v / "deps.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(deps, list) or not all(isinstance(d, dict) and _holds(d, build_dir, src_dir) for d in deps):
            continue
        dest = build_dir / "cached" / name
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", ".log"):
                tmp = dest.with_name(f".{name}{suffix}.{os.getpid()}")
                shutil.copyfile(v / f"{name}{suffix}", tmp)
                os.replace(tmp, dest.with_name(name + suffix))
            os.utime(v)           # used now: the last to be evicted
        except OSError:
            continue              # evicted while we read it
        return dest
    return None


def store(ninja: str, ninja_file: Path, build_dir: Path, src_dir: Path, compiled: list[tuple[str, str]]) -> int:
    """Put the objects this build compiled (a source, its object's path in the build folder) into the cache; the
    number stored. Never raises: a cache that cannot be written is only a slower next build."""
    root = cache_dir()
    if root is None:
        return 0
    stored = 0
    for rel, obj in compiled:
        try:
            stored += _store_one(root, ninja, ninja_file, build_dir, src_dir, rel, obj)
        except OSError:
            continue
    global _evicted
    if stored and time.monotonic() - _evicted > EVICT_EVERY_S:   # a walk of the whole cache: not after every candidate
        _evicted = time.monotonic()
        try:
            evict(root, int(os.environ.get("AGENT_OBJECT_CACHE_MB") or DEFAULT_MB) << 20)
        except (OSError, ValueError):
            pass
    return stored


def _store_one(root: Path, ninja: str, ninja_file: Path, build_dir: Path, src_dir: Path, rel: str, obj: str) -> int:
    path = build_dir / obj
    deps = ninja_deps(ninja, build_dir, obj)
    if not path.is_file() or not deps:
        return 0
    described = [_describe(d, build_dir, src_dir) for d in deps]
    if any(d is None for d in described):
        return 0
    data = path.read_bytes()
    bound = str(src_dir).encode() in data or str(build_dir).encode() in data
    key = _key(ninja_file, build_dir, src_dir, rel, obj, bound)
    if key is None:
        return 0
    text = json.dumps(described, sort_keys=True)
    final = root / key / _sha(text.encode())[:16]
    if final.is_dir():
        os.utime(final)
        return 0
    tmp = root / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(parents=True)
    try:
        name = Path(obj).name
        shutil.copyfile(path, tmp / name)
        log = build_dir / f"{obj}.log"
        (tmp / f"{name}.log").write_bytes(log.read_bytes() if log.is_file() else b"")
        (tmp / "deps.json").write_text(text)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, final)
        except OSError:           # another build stored the same entry meanwhile
            return 0
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def evict(root: Path, limit: int) -> None:
    """Remove the least recently used entries until the cache holds at most `limit` bytes."""
    variants, now = [], time.time()
    for key in root.iterdir():
        if key.name.startswith(".tmp-") and now - key.stat().st_mtime > 3600:
            shutil.rmtree(key, ignore_errors=True)       # a store killed halfway
        if key.name.startswith(".") or not key.is_dir():
            continue
        for v in key.iterdir():
            try:
                size = sum(f.stat().st_size for f in v.iterdir())
                variants.append((v.stat().st_mtime_ns, size, v))
            except OSError:
                continue
    total = sum(s for _, s, _ in variants)
    for _, size, v in sorted(variants):
        if total <= limit:
            break
        shutil.rmtree(v, ignore_errors=True)
        total -= size
        try:
            v.parent.rmdir()      # the key's last entry
        except OSError:
            pass
