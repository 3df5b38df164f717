"""`agent import kernelbench PROBLEM.py --solution NEW.py [--into DIR] [--name NAME] [--scale F]`: a task from
a KernelBench problem file (tools/kernelbench/). The files are read in a child process (they are code); the
task folder is written only when everything checked out, and never over an existing folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from rich.markup import escape

from tools.console import make_console

PROBE_TIMEOUT_S = 300.0


def register(subparsers) -> None:
    p = subparsers.add_parser("import", help="make a task from a kernel in another tool's format (kernelbench)",
                              description="Make a task folder from a KernelBench problem file and its solution.")
    p.add_argument("format", choices=["kernelbench"], help="the format of PROBLEM")
    p.add_argument("problem", type=Path, help="the problem file: Model, get_inputs, get_init_inputs, sizes")
    p.add_argument("--solution", type=Path, help="a ModelNew file that builds its kernel with load_inline")
    p.add_argument("--into", type=Path, help="the new task folder (default: kernels/NAME in this git repository)")
    p.add_argument("--name", help="the task's name (default: the problem file's name)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the problem's sizes by this (e.g. 0.25)")
    p.set_defaults(func=_import)


def _root() -> Path:
    p = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return Path(p.stdout.strip()) if p.returncode == 0 else Path.cwd()


def _fail(msg: str) -> int:
    make_console(stderr=True).print(f"[red]import failed[/red] {escape(msg)}")
    return 2


def _import(args) -> int:
    from tools.isolation.sandbox import run_python_json
    from tools.kernelbench.writer import WriteError, write_task
    for what, f in (("problem", args.problem), ("--solution", args.solution)):
        if f is not None and not f.is_file():
            return _fail(f"{f}: {what}: no such file; fix: give the path to the .py file")
    if args.scale <= 0:
        return _fail(f"--scale {args.scale:g}: must be above 0")
    name = args.name or re.sub(r"\W", "_", args.problem.stem).strip("_") or "kernelbench"
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        return _fail(f"--name {name!r}: letters, digits, _ and - only")
    into = args.into or _root() / "kernels" / name
    if into.exists() and any(into.iterdir()):
        return _fail(f"{into}: exists and is not empty; fix: name a new folder with --into (nothing was written)")
    problem, solution = args.problem.resolve(), args.solution.resolve() if args.solution else None
    cmd = [str(problem), "--scale", str(args.scale), *(["--solution", str(solution)] if solution else [])]
    make_console(stderr=True).print(f"reading {escape(str(args.problem))} in a child process ...")
    res, data = run_python_json("tools.kernelbench.probe", cmd, PROBE_TIMEOUT_S)
    if data is None:
        return _fail(f"{args.problem}: reading it failed: {res.reason()}")
    if not data.get("ok"):
        return _fail(f"{data['file']}: {data['field']}: {data['error']}; fix: {data['fix']}")
    try:
        done = write_task(into.resolve(), name, data, problem, solution)
    except WriteError as e:
        return _fail(str(e))
    con = make_console()
    con.print(f"[green]imported[/green] {escape(str(into))}: a {done['device']} task, entry {done['entry']}, "
              f"{len(data['shapes'])} shapes ({', '.join(escape(str(s)) for s in data['shapes'])})")
    for line in filter(None, [data.get("note"), *data.get("dropped", [])]):
        con.print(f"  note: {escape(line)}")
    con.print(f"next: agent check {escape(str(into))}; then commit the folder and agent optimize {escape(str(into))}")
    return 0
