"""`agent profile [TASK] [--tier 1|2] [--json]` and `agent profile --from-report FILE.ncu-rep`."""

from __future__ import annotations

from rich.markup import escape

from tools.console import make_console
from tools.profile.__main__ import add_arguments, ok, run


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="Nsight Compute profile of a task's kernel (or convert a .ncu-rep) as JSON",
                              description="Profile the task's kernel with ncu (tier 1 by default; never --set full), "
                                          "or convert a report captured elsewhere with --from-report.")
    add_arguments(p, lib_required=False)
    p.add_argument("--json", action="store_true", help="print the full JSON instead of the compact view")
    p.set_defaults(func=_cmd)


def _lib_for(args) -> str | None:
    if args.lib or args.from_report:
        return args.lib
    from tools.task import load_task
    try:
        from tools.build.build import build
    except ImportError:
        make_console(stderr=True).print("[red]no build tool in this checkout[/red]: pass --lib PATH to the compiled "
                                        "library")
        return None
    from tools.isolation.scratch import process_dir
    res = build(load_task(args.task), process_dir("agent-profile-build-"))   # profiled in this process's life
    if res.status.value != "ok" or not res.lib_path:
        first = res.message.splitlines()[0] if res.message else ""   # the compiler's words: escaped
        make_console(stderr=True).print(f"[red]build {res.status.value}[/red]: {escape(first)}")
        return None
    return res.lib_path


def _cmd(args) -> int:
    if not args.from_report and not args.task:
        make_console(stderr=True).print("[red]give a TASK folder or --from-report FILE.ncu-rep[/red]")
        return 2
    lib = _lib_for(args)
    if not args.from_report and lib is None:
        return 1
    try:
        report = run(args, lib)
    except ValueError as e:
        make_console(stderr=True).print(f"[red]error[/red] {escape(str(e))}")
        return 2
    if args.json:
        make_console().print_json(report.model_dump_json())
    else:
        from tools.profile import compact
        # a failure renders as "profile STATUS: message" + "fix: hint" (compact's own two lines)
        make_console(stderr=not ok(report)).print(compact(report), markup=False, highlight=False)
    return 0 if ok(report) else 1
