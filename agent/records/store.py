"""The run log on disk: one record per iteration, appended (and fsynced) before the next iteration begins, so a
killed run can be resumed and every command that reviews runs reads the same files. A log written by a schema this
code does not know is refused with a clear message, never misread. The records themselves: agent/records/schema.py.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from agent.records.schema import SCHEMA_VERSION, IterationRecord, RunConfig, RunState


class LogError(Exception):
    pass


# --- reading and writing ------------------------------------------------------------------
def check_version(data: dict, where: str) -> None:
    v = data.get("schema_version")
    if v != SCHEMA_VERSION:
        raise LogError(f"{where}: written by log schema version {v!r}; this agent reads version "
                       f"{SCHEMA_VERSION}. Use the agent version that wrote it.")


def fsync_dir(d: Path) -> None:
    """A rename or a new file in `d` reaches the disk: the directory's own entry is synced (POSIX leaves that to the
    caller; ext4 and xfs do not promise it after a crash without it)."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Written whole to a temporary file, synced, renamed over `path`, the folder synced: after a power cut the file
    is the old one or the new one, never empty."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """write_atomic of the model's JSON. The run's state says what the records already hold, so the record it follows
    (append_iteration, synced first) is on the disk before the state that names it (issue 61)."""
    write_atomic(path, model.model_dump_json(indent=2).encode())


def mend_tail(run_dir: Path) -> tuple[Path, int] | None:
    """A last record cut short by a kill during its write (the file does not end in a newline: each record is one
    write of a line) is moved to iterations.jsonl.torn-N and the file cut back to its last whole line, so that the next
    record is never appended onto it (issue 42: `agent report` then failed on the joined line). Returns (where the
    torn bytes went, how many), or None when the file ends whole."""
    p = run_dir / "iterations.jsonl"
    data = log_bytes(p)
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    n = 1
    while (aside := run_dir / f"iterations.jsonl.torn-{n}").exists():
        n += 1
    with open(aside, "wb") as f:
        f.write(data[cut:])
        f.flush()
        os.fsync(f.fileno())
    with open(p, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return aside, len(data) - cut


def log_bytes(p: Path) -> bytes | None:
    """iterations.jsonl's bytes, None where there is none; LogError, one line naming it, where it cannot be read (a
    folder of that name, no permission): what mends the records never ends in a traceback over it."""
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LogError(f"{p}: cannot be read ({e.strerror or type(e).__name__}); the run's records cannot be mended "
                       "until it is a file again") from None


def append_iteration(run_dir: Path, rec: IterationRecord) -> None:
    mend_tail(run_dir)   # never onto a torn line (resume_run says so where it finds one)
    p = run_dir / "iterations.jsonl"
    new = not p.exists()
    with open(p, "a") as f:
        f.write(rec.model_dump_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    if new:   # the file's own entry, the first time: a synced record in a file the folder lost is lost too
        fsync_dir(run_dir)


def rewrite_iteration(run_dir: Path, rec: IterationRecord) -> None:
    """The record of `rec`'s iteration replaced by `rec` (the last line of that number: a keep revoked,
    agent/records/revoked.py), the file written whole and renamed over the old one (write_atomic): a kill leaves the old
    log or the new one. Readers then find one record an iteration, as every other. KeyError where it has none."""
    mend_tail(run_dir)
    p = run_dir / "iterations.jsonl"
    lines = (log_bytes(p) or b"").splitlines(keepends=True)
    for k in range(len(lines) - 1, -1, -1):
        try:
            n = json.loads(lines[k]).get("iteration")
        except (ValueError, AttributeError):
            continue
        if n == rec.iteration:
            lines[k] = (rec.model_dump_json() + "\n").encode()
            write_atomic(p, b"".join(lines))
            return
    raise KeyError(f"{p} holds no record of iteration {rec.iteration}")


def _load(p: Path, what: str) -> dict:
    """A run file's JSON object, or one line naming the file (a kill or a disk fault can leave it damaged)."""
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LogError(f"{p}: the run's {what} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                       "the run cannot be read until it is restored") from None
    if not isinstance(data, dict):
        raise LogError(f"{p}: the run's {what} is damaged (not a JSON object); the run cannot be read until it is "
                       "restored")
    return data


def read_config(run_dir: Path) -> RunConfig:
    p = run_dir / "run.json"
    if not p.exists():
        raise LogError(f"{run_dir}: no run.json (not a run folder?)")
    data = _load(p, "configuration")
    check_version(data, str(p))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise LogError(f"{p}: does not match the run schema: {e.errors()[0]['msg']}") from None


def read_state(run_dir: Path) -> RunState:
    p = run_dir / "state.json"
    if not p.exists():
        return RunState(status="unknown")
    data = _load(p, "state")
    check_version(data, str(p))
    try:
        return RunState.model_validate(data)
    except ValidationError as e:
        raise LogError(f"{p}: the run's state is damaged (does not match the schema: {e.errors()[0]['msg']}); the "
                       "run cannot be read until it is restored") from None


def read_iterations(run_dir: Path, notes: list[str] | None = None) -> list[IterationRecord]:
    """The run's records in iteration order. A torn last line (a kill mid-write) is left out. Any other damaged line
    raises LogError, unless `notes` is given: then it is left out and said there, in one line (the review commands
    read what they can; `agent resume --repair` sets damaged lines aside and rebuilds a kept one from its commit)."""
    p = run_dir / "iterations.jsonl"
    if not p.exists():
        return []
    out = []
    try:
        lines = p.read_bytes().decode(errors="replace").splitlines()
    except OSError as e:
        if notes is None:
            raise LogError(f"{p}: cannot be read ({e.strerror})") from None
        notes.append(f"{p}: cannot be read ({e.strerror}): no iteration record shown")
        return []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:   # json.JSONDecodeError is one
            if i == len(lines):   # a torn last line from a kill mid-write
                if notes is not None:
                    notes.append(f"{p}:{i}: the last record is cut short ({len(line)} characters, no end): left out")
                break
            if notes is None:
                raise LogError(f"{p}:{i}: not valid JSON") from None
            notes.append(f"{p}:{i}: a damaged record ({type(e).__name__}): left out")
            continue
        check_version(data, f"{p}:{i}")
        try:
            out.append(IterationRecord.model_validate(data))
        except ValidationError as e:
            if notes is None:
                raise
            err = e.errors()[0]
            notes.append(f"{p}:{i}: a record that does not match the schema ({'.'.join(map(str, err['loc']))}: "
                         f"{err['msg']}): left out")
    return sorted(out, key=lambda r: r.iteration)


def runs_dir(repo: Path) -> Path:
    return repo / "runs"


def find_run(repo: Path, run_id: str) -> Path:
    d = runs_dir(repo) / run_id
    if (d / "run.json").exists():
        return d
    matches = [p for p in runs_dir(repo).glob(f"{run_id}*") if (p / "run.json").exists()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LogError(f"no run {run_id!r} under {runs_dir(repo)} (see `agent runs`)")
    raise LogError(f"run id {run_id!r} is ambiguous: {', '.join(sorted(p.name for p in matches))}")


_HELD: list = []    # the lock files of the runs this process drives; the kernel drops the locks when it dies


def hold_run(run_dir: Path) -> None:
    """Take runs/RUN/agent.lock for the life of this process. A second agent on the same run (`agent resume`
    while the run still goes) is refused, and the holder knows that a git lock file left in the run's own
    worktree is stale: no other agent process uses it. A SIGKILLed holder leaves the file, not the lock."""
    f = open(run_dir / "agent.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise LogError(f"run {run_dir.name} is in use by another agent process (pid {pid}); "
                       "wait for it to finish or stop it, then resume") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _HELD.append(f)
