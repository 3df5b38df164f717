"""`python -m tools.profile TASK [--lib PATH] [--tier 1|2] [--shape I] [--json]` or
`python -m tools.profile --from-report FILE.ncu-rep`: prints the ProfileReport JSON (without --lib, the
task is built first, as the other instruments do).
Exit code 0 for ok/fallback, 1 for a failure status (the JSON says which), 2 for bad arguments."""

from __future__ import annotations

import argparse
import sys

from tools.profile.model import ProfileStatus


def add_arguments(p: argparse.ArgumentParser, lib_required: bool) -> None:
    p.add_argument("task", nargs="?", help="task folder (kernels/NAME)")
    p.add_argument("--from-report", metavar="FILE", help="convert an existing .ncu-rep (any kernels in it)")
    p.add_argument("--lib", required=False, help="compiled library of the task" + ("" if lib_required else " (default: build it)"))
    p.add_argument("--tier", type=int, choices=(1, 2), default=1, help="1: SOL, launch, occupancy (~10 passes); 2: + workload analyses, stalls")
    p.add_argument("--shape", type=int, default=None, help="shape index (default: the task's main shape)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out-dir", default=None, help="where the .ncu-rep and ncu.log go")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--launches-per-call", type=int, default=1)
    p.add_argument("--no-fallback", action="store_true", help="report the ncu failure instead of the torch-profiler fallback")
    p.add_argument("--bare", action="store_true", help="also time the program without ncu (overhead)")


def run(args, lib_path: str | None):
    """-> ProfileReport for parsed args (shared by `agent profile`)."""
    from tools.profile import profile_task, read_report
    from tools.task import load_task
    if args.from_report:
        return read_report(args.from_report)
    task = load_task(args.task)
    return profile_task(task, lib_path, tier=args.tier, shape=args.shape, timeout_s=args.timeout, out_dir=args.out_dir,
                        warmup=args.warmup, launches_per_call=args.launches_per_call, fallback=not args.no_fallback,
                        measure_bare=args.bare)


def ok(report) -> bool:
    return report.status in (ProfileStatus.ok, ProfileStatus.fallback)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.profile", description=__doc__)
    add_arguments(p, lib_required=False)
    # JSON is what this prints anyway; taken as the other instruments take it (`agent profile` has its own)
    p.add_argument("--json", action="store_true", help="print JSON (the default here)")
    args = p.parse_args(argv)
    if not args.from_report and not args.task:
        p.error("give TASK (and --lib, or it is built), or --from-report FILE")
    from tools.measure.parity import build_if_needed
    from tools.profile.ncu import report_json
    from tools.task import TaskError, load_task
    try:
        lib = args.lib if args.from_report else str(build_if_needed(load_task(args.task), args.lib))
        report = run(args, lib)
    except (TaskError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report_json(report))
    return 0 if ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
