"""`agent import kernelbench PROBLEM.py [--solution NEW.py] [--into DIR] [--name NAME] [--scale F] [--knob ...]`: a task from
a KernelBench problem file (tools/kernelbench/). The files are read in a child process (they are code); the
task folder is written only when everything checked out, and never over an existing folder.

`agent export RUN --kernelbench OUT.py`: the run's best kernel as a ModelNew file, checked in a fresh process."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from rich.markup import escape

from tools.console import make_console

PROBE_TIMEOUT_S = 300.0
EVAL_TIMEOUT_S = 600.0         # the exported file's load_inline builds from scratch (torch's headers)


def register(subparsers) -> None:
    p = subparsers.add_parser("import", help="make a task from a kernel in another tool's format (kernelbench)",
                              description="Make a task folder from a KernelBench problem file and its solution.")
    p.add_argument("format", choices=["kernelbench"], help="the format of PROBLEM")
    p.add_argument("problem", type=Path, help="the problem file: Model, get_inputs, get_init_inputs, sizes")
    p.add_argument("--solution", type=Path, help="a ModelNew file that builds its kernel with load_inline (without "
                   "one: the forward as ATen calls, from torch.export, to start from)")
    p.add_argument("--into", type=Path, help="the new task folder (default: kernels/NAME in this git repository)")
    p.add_argument("--name", help="the task's name (default: the problem file's name)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the problem's sizes by this (e.g. 0.25)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a tunable #define of the kernel and the values the heuristic and sweep may give it (repeat)")
    p.set_defaults(func=import_kernelbench)
    register_export(subparsers)


def repo_root() -> Path:
    """The git repository's root (where `kernels/` goes), as the other commands find it; else this folder."""
    from agent.optimize import gitops
    try:
        return Path(gitops.open_repo(Path.cwd()).working_tree_dir)
    except gitops.GitError:
        return Path.cwd()


def _fail(msg: str) -> int:
    make_console(stderr=True).print(f"[red]import failed[/red] {escape(msg)}")
    return 2


def _scaffold_allow(sol: dict) -> dict[str, str]:
    """The scan rules the scaffolded kernel breaks by construction (its ATen calls: at::linear, at::softmax ... are
    the reference's own operators), allowed with the reason, so that its check runs; a kernel of the user's or the
    model's that still calls them is then measured against the operator it calls, at about 1x."""
    from tools.build.scan import scan_text
    hits = scan_text(sol["cuda_sources"] or sol["cpp_sources"], "kernel")
    return {h.rule: "the starting kernel agent import scaffolded calls the reference's ATen operators; drop this line "
                    "once the kernel computes them itself" for h in hits}


def import_kernelbench(args) -> int:
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
    try:
        knobs = {k.strip(): [int(v) for v in vals.split(",")] for k, _, vals in (kv.partition("=") for kv in args.knob)}
    except ValueError:
        return _fail(f"--knob {' '.join(args.knob)}: give NAME=V1,V2,... with integer values")
    into = args.into or repo_root() / "kernels" / name
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
    allow = _scaffold_allow(data["solution"]) if solution is None else {}
    try:
        done = write_task(into.resolve(), name, data, problem, solution, knobs, allow)
    except WriteError as e:
        return _fail(str(e))
    con = make_console()
    con.print(f"[green]imported[/green] {escape(str(into))}: a {done['device']} task, entry {done['entry']}, "
              f"{len(data['shapes'])} shapes ({', '.join(escape(str(s)) for s in data['shapes'])})")
    if solution is None:
        con.print("  note: no --solution: the kernel is the problem's forward as ATen calls (torch.export), correct and "
                  "naive; replace them with kernels (--proposer llm, or by hand)")
    for rule, why in allow.items():
        con.print(f"  note: task.toml {escape('[scan]')} allows {rule}: {escape(why)}")
    for line in filter(None, [data.get("note"), *data.get("dropped", [])]):
        con.print(f"  note: {escape(line)}")
    con.print(f"next: agent check {escape(str(into))}; then commit the folder and agent optimize {escape(str(into))}")
    return 0


def register_export(subparsers) -> None:
    p = subparsers.add_parser("export", help="a run's best kernel in another tool's format (--kernelbench OUT.py)",
                              description="Write a run's best kernel (or --iter N's) as a self-contained KernelBench "
                                          "ModelNew file, then load it in a fresh process and compare it with the "
                                          "problem's Model as KernelBench's evaluator does.")
    p.add_argument("run", help="a run id (or a unique prefix, or its folder)")
    p.add_argument("--kernelbench", type=Path, required=True, metavar="OUT.py", help="the file to write")
    p.add_argument("--runs-dir", type=Path)
    p.add_argument("--force", action="store_true", help="overwrite OUT.py if it exists")
    p.add_argument("--no-check", action="store_true", help="write the file without loading it in a fresh process")
    p.set_defaults(func=_export)


def _show(repo: Path, sha: str, path: str) -> str:
    p = subprocess.run(["git", "show", f"{sha}:{path}"], cwd=repo, capture_output=True, text=True)
    if p.returncode != 0:
        raise FileNotFoundError(f"{path} at {sha[:10]}: {p.stderr.strip()[:200]}")
    return p.stdout


def _export(args) -> int:
    import json
    import tomllib

    from agent.commands.review import default_runs_dir
    from agent.review.runs import load_run, resolve_run
    from agent.records.store import LogError
    from tools.kernelbench.export import ExportError, splice
    out = args.kernelbench
    if out.exists() and not args.force:
        return _fail(f"{out}: exists; fix: another path, or --force to overwrite it")
    try:
        run = load_run(resolve_run(default_runs_dir(args), args.run))
        sha, repo, td = run.state.best_sha or run.cfg.base_sha, Path(run.cfg.repo), run.cfg.task_dir
        meta = json.loads(_show(repo, sha, f"{td}/kernelbench.json"))
        which = f"iteration {run.state.best_iteration}" if run.state.best_iteration else "the initial kernel"
        header = (f"# Exported by `agent export {run.id} --kernelbench` ({which}, commit {sha[:10]}): the load_inline\n"
                  f"# call's {meta['argument']} is the task's {meta['kernel']} at that commit.\n")
        text = splice(_show(repo, sha, f"{td}/model_new.py"), meta["argument"], _show(repo, sha, f"{td}/{meta['kernel']}"),
                      header)
        toml = tomllib.loads(_show(repo, sha, f"{td}/task.toml"))
        problem = _show(repo, sha, f"{td}/problem.py")
    except (LogError, FileNotFoundError, ExportError, ValueError) as e:
        return _fail(f"export {args.run}: {e}" + ("; fix: export a run of a task made by `agent import kernelbench`"
                                                  if "kernelbench.json" in str(e) else ""))
    out.write_text(text)
    make_console().print(f"[green]wrote[/green] {escape(str(out))} ({which} of run {escape(run.id)})")
    if args.no_check:
        return 0
    return _check_export(out, problem, toml, _pch_of(Path(run.cfg.worktree) / td))


def _pch_of(task_dir: Path) -> Path | None:
    """The precompiled torch/extension.h the run's builds made, for the export's own build: a task built as load_inline
    builds it (build.defaults) has the same flags, so gcc takes torch's headers from it (about 6 s, not 14, on 2
    cores); where the flags differ gcc ignores it and reads the headers (the build is the same either way)."""
    from tools.backends.pch import ensure, pch_flags, pch_sources
    from tools.backends.toolchain import find_cxx
    from tools.build.build import cxx_flags_of
    from tools.task import TaskError, load_task
    try:
        task, cxx = load_task(task_dir), find_cxx()
        if cxx is None or not pch_sources(task, task_dir):
            return None
        # from the machine's cache only (an earlier build of the task made it): never made here
        return ensure(cxx, pch_flags(cxx_flags_of(task, task_dir, None), task_dir), 1.0, make=False).include_dir
    except (TaskError, OSError, ImportError, ValueError):
        return None


def _check_export(out: Path, problem: str, toml: dict, pch: Path | None = None) -> int:
    """The written file loaded in a fresh process and compared with the problem's Model (tools/kernelbench/evalkb.py),
    at the task's main shape (a CPU machine's sizes may be smaller than KernelBench's). `pch`: a folder holding
    torch/extension.h.gch, offered to the export's build through CPATH (gcc looks there before torch's own folders)."""
    import os
    import tempfile

    from tools.isolation.sandbox import run_python_json
    main = toml["shapes"][toml.get("main_shape", 0)]
    sizes = ",".join(f"{k}={int(v)}" for k, v in main.items())
    env = {"CPATH": os.pathsep.join(filter(None, [str(pch), os.environ.get("CPATH")]))} if pch else None
    with tempfile.TemporaryDirectory(prefix="agent-export-") as d:
        (Path(d) / "problem.py").write_text(problem)
        res, data = run_python_json("tools.kernelbench.evalkb", [str(Path(d) / "problem.py"), str(out.resolve()),
                                                                 "--sizes", sizes], EVAL_TIMEOUT_S, env=env)
    if data is None:
        return _fail(f"{out}: the fresh-process check failed: {res.reason()}")
    if not data.get("ok"):
        return _fail(f"{out}: written, but in a fresh process it {'does not build' if not data.get('compiled') else 'is wrong'}: "
                     f"{data.get('error')}")
    make_console().print(f"checked in a fresh process as KernelBench checks a solution: built, {data['trials']} "
                         f"trials match Model at {sizes} (max abs diff {data['max_abs_diff']:.3g})")
    return 0
