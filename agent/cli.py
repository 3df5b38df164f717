"""`agent`: the command line. Each subcommand lives in its own module under agent/commands/,
which exposes `register(subparsers)`; the module sets `func(args) -> int` on its parser."""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.markup import escape

from tools.console import make_console

# one module per command family; each registers its own subcommands
COMMAND_MODULES = [
    "agent.commands.check",      # check
    "agent.commands.doctor",     # doctor
    "agent.commands.profile",    # profile
    "agent.commands.optimize",   # optimize, resume, sweep
    "agent.commands.review",     # runs, show, report, cherry-pick, gate
    "agent.commands.clean",      # clean
    "agent.commands.kernelbench",  # import, export
    "agent.commands.init",       # init
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agent", description="Profile-guided, self-verifying CUDA kernel optimization.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:       # that family's module is absent from this checkout: skip it
                continue
            raise
        mod.register(sub)
    return p


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kernel-agent")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from tools.task import TaskError
    try:
        return int(args.func(args) or 0)
    except TaskError as e:
        make_console(stderr=True).print(f"[red]bad task[/red] {escape(str(e))}")
        return 2
    except KeyboardInterrupt:
        make_console(stderr=True).print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
