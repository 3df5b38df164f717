"""Parity (DESIGN step 6): is the candidate's output the reference's, for every element, every time?

Adversarial by construction; a fast wrong kernel must not pass:
- every listed shape, plus hidden shapes drawn fresh per call (never shown to the proposer), plus the
  extremes of the task's [dims] ranges (tools/measure/ranges.py: tails, index products past 2^16, each
  dimension at its largest), each with the first distribution and one seed;
- every input distribution, several fresh seeds per call (each shape and distribution its own draw of each);
- before a keep, values past the sample: large, tiny, declared specials (tools/measure/domains.py, issue 62; on
  the large draw a few finite elements an fp32 rounding decides are let past, counted: domains.excuse);
- outputs poisoned with a NaN carrying a payload (integers: a sentinel) before each call, so an
  element left unwritten is told apart from one the kernel computed as NaN; 64 KiB of poisoned
  guard on each side of the output catches writes past its ends;
- the candidate runs before AND after the reference (which allocates and frees memory), into a
  freshly poisoned second buffer; both results are compared with the reference;
- the output and input buffers of a shape are reused across seeds with new values, so a kernel
  that caches results keyed on a pointer returns stale data and fails;
- inputs compared bitwise with clones after each call;
- a third call into an output that already holds values (an earlier result, zeros, random ones), and a
  fourth on the same buffers after a few input values changed in place, into the third's output (a
  cache keyed on part of the inputs answers for the old ones; tools/measure/buffers.py).

The parent (`run_parity`) imports no torch and no candidate code: the work runs in
`python -m tools.judge.judge parity` (tools/judge/judge.py), which calls `check()` below with the candidate's
calls made in its host; the sweep's batch child calls it in-process.
"""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from tools.measure.buffers import STATES, Buffers, changed_repeat, check_seed  # noqa: F401  (STATES: for the tests)
from tools.measure.compare import all_bits_equal, describe, disagree, error_budget, tolerance_for
from tools.measure.domains import draw, draws, is_values, scaled_atol, judged, value_shapes, STRAY
from tools.measure.ranges import reduction_extreme, range_shapes
from tools.measure.views import Offsets, draws as offset_draws, is_offset
from tools.results import ParityResult, ParityStatus, ShapeCheck
from tools.backends.jitcache import judge_env
from tools.isolation.sandbox import ProcStatus, run_python_json
from tools.task import Task, load_task, shape_label
from tools.task_messages import hidden_keys_differ


# --- parent side ----------------------------------------------------------------------------
def run_parity(task: Task, lib_path: Path, *, timeout_s: float | None = None, hidden: bool = True,
               seed: int | None = None, scratch_root: Path | None = None, extent: str = "full") -> ParityResult:
    """Check the library at lib_path against the task's reference, in a child process (`extent`: check())."""
    seed = secrets.randbits(31) if seed is None else seed
    timeout = timeout_s if timeout_s is not None else task.spec.parity.timeout_s
    args = ["parity", "--task", str(task.root), "--lib", str(Path(lib_path).resolve()), "--seed", str(seed)] + \
        (["--no-hidden"] if not hidden else []) + (["--extent", extent] if extent != "full" else [])
    t0 = time.monotonic()
    proc, data = run_python_json("tools.judge.judge", args, timeout, scratch_root, env=judge_env())
    dt = time.monotonic() - t0
    if proc.status == ProcStatus.ok and data is not None:
        try:
            return ParityResult.model_validate(data)
        except ValueError as e:
            return ParityResult(status=ParityStatus.error, seconds=dt,
                                message=f"parity child answered malformed JSON: {e}")
    return ParityResult(status=child_status(proc.status), message=child_failure("parity", proc, data), seconds=dt)


def child_status(st: ProcStatus) -> ParityStatus:
    return {ProcStatus.timeout: ParityStatus.timeout, ProcStatus.crashed: ParityStatus.crashed}.get(
        st, ParityStatus.error)


def child_failure(stage: str, proc, data: dict | None, overrun: str | None = None) -> str:
    """One line (plus the stderr tail) for a child that did not answer normally; `overrun`, the stage budget that
    killed it (tools.judge.budgets.StageClock.overrun)."""
    tail = proc.tail(4).replace("\n", " | ")
    tail = f"; stderr: {tail}" if tail else " (nothing on stderr)"
    if proc.status == ProcStatus.timeout and overrun:
        return f"{stage} timed out: {overrun} (the kernel hangs or is far too slow){tail}"
    if proc.status == ProcStatus.timeout:
        return f"{stage} timed out after {proc.seconds:.1f}s (the kernel hangs or is far too slow){tail}"
    if proc.status == ProcStatus.crashed:
        return f"{stage} child crashed with {proc.signal} (the kernel faulted){tail}"
    if proc.status == ProcStatus.not_started:
        return f"{stage} child could not start: {proc.stderr.strip()}"
    if data is not None:
        return f"{stage} child printed a result but exited with code {proc.returncode}{tail}"
    return f"{stage} child printed no JSON result (exit code {proc.returncode}){tail}"


EXTENTS = ("full", "quick", "rest", "range")
ONE_SEED = ("range ", "values ", "misaligned ")     # the checks made on one seed and their own distributions


def check(task: Task, mod, lib, *, seed: int, hidden: bool = True, run=None, run_kept=None,
          extent: str = "full") -> ParityResult:
    """Run parity in this process (the child). Never raises for a fault of the candidate. `run(lib, shape, out,
    *inputs)` makes one call (default the task's own `run`, in this process; the judge passes one that makes it in
    the kernel's host, tools/judge/judge.py); `run_kept` the same into an output holding what it holds here (the
    host's poisons it otherwise; in this process `run` does). An exception with a `status` (the host died) ends
    parity with that status. `extent` (issue 39's probe budget, issue 44's cost of a rejected candidate): "full"
    every shape on every seed; "quick" the listed and hidden shapes on the first seed, what every candidate of the
    loop pays; "rest" what quick left out, run once on a candidate about to be kept: the other seeds and the
    extremes of the task's [dims] and the value draws (quick + rest = full); "range" those extremes alone."""
    import torch
    t0 = time.monotonic()
    spec = task.spec
    backend = task.backend
    if (why := backend.runnable()) is not None:
        return ParityResult(status=ParityStatus.error, message=why)
    device = backend.torch_device
    seeds, shapes, ranges, why = seeded_shapes(spec, mod, seed, hidden)
    if why is not None:
        return ParityResult(status=ParityStatus.error, message=why)
    listed = [tuple(sorted(s.items())) for s, _ in shapes]   # a range shape equal to one is not checked again
    # before a keep: values past the sample, views off the allocator's alignment (domains.py, views.py: issue 62)
    values = [(s, k) for k in ("values ", "misaligned ") for s in value_shapes(shapes)] \
        if hidden and extent in ("full", "rest") else []
    if extent == "rest" and len(seeds) < 2:
        shapes = []     # one seed: quick checked the listed and hidden shapes on all of them
    if hidden and extent != "quick":   # the extremes of the task's [dims] (tools/measure/ranges.py), new every run
        extra = [(s, "range ") for s, _ in range_shapes(spec, mod, ranges) if tuple(sorted(s.items())) not in listed]
        shapes = extra if extent == "range" else shapes + extra + values
    if not shapes:
        left = "; one seed, checked already" if extent == "rest" else ""
        return ParityResult(status=ParityStatus.ok, message=f"ok: no range shapes (task.toml declares no [dims]){left}",
                            seconds=time.monotonic() - t0)
    sync = backend.sync
    checks: list[ShapeCheck] = []
    fatal = False
    for shape, kind in shapes:
        label, is_hidden = kind + shape_label(shape), bool(kind)
        bufs = Buffers(torch)
        # a range shape is about the shape (an index's width, a tail): one distribution, one seed (a kept
        # iteration paid 0.5-0.7 s for all of them on the CPU task: BENCHMARKS.md); at a reduction's extreme
        # every distribution, since precision is about the values (an fp16 partial overflows on one, drops the
        # small terms of another: tests/fixtures/cuda_cheats/softmax/)
        dists = draws(spec) if kind == "values " else offset_draws() if kind == "misaligned " else \
            spec.distributions if kind != "range " or reduction_extreme(spec, shape) else spec.distributions[:1]
        for dist in dists:
            # a range shape on one seed; a listed or hidden one on the first in quick, the others in rest
            for s in seeds[:1] if kind in ONE_SEED or extent == "quick" else seeds[1:] if extent == "rest" else seeds:
                t1, s = time.monotonic(), check_seed(s, shape, dist)
                bufs.misalign = Offsets(spec, dist, s, mod) if is_offset(dist) else None
                parts = {"draw": 0.0, "calls": 0.0}   # where the check's seconds went (the rest: reference, compares)
                try:
                    c = one_check(task, mod, lib, shape, label, dist, s, device, bufs, sync, _timed(parts, run or mod.run),
                                  _timed(parts, run_kept or (mod.run if run is None else None)), parts)
                except Exception as e:  # the task's run raised (launcher error, bad symbol, ...)
                    msg = " ".join(str(e).split())[:400]
                    status = getattr(e, "status", None)
                    c = {"status": status or "error", "message": f"{label} dist={dist}: {type(e).__name__}: {msg}"}
                    fatal = backend.gpu or status is not None   # the context may be poisoned, the host is gone: stop
                if c["status"] != "ok" and "message" not in c:
                    c["message"] = describe(label, dist, c, *c.pop("tol"))
                if c["status"] != "ok" and bufs.misalign is not None:
                    c["message"] += f" ({bufs.misalign.text()})"
                c.pop("tol", None)
                checks.append(ShapeCheck(shape=shape, label=label, dist=dist, seed=s, hidden=is_hidden,
                                         ok=c["status"] == "ok", seconds=round(time.monotonic() - t1, 4),
                                         parts={k: round(v, 4) for k, v in parts.items()},
                                         **{k: v for k, v in c.items() if k != "ok"}))
                if c["status"] != "ok":
                    break
            else:
                continue
            break
        if fatal:
            break
    bad = [c for c in checks if not c.ok]
    if bad:
        first = bad[0]
        more = f" (+{len(bad) - 1} more failing shapes)" if len(bad) > 1 else ""
        return ParityResult(status=first.status, message=first.message + more, checks=checks,
                            seconds=time.monotonic() - t0)
    sample = [c for c in checks if not is_values(c.dist)] or checks   # the errors on the sample: the value draws' scale
    worst = max(sample, key=lambda c: c.max_rel_err or 0.0)
    ratios = [c.err_ratio for c in checks if c.err_ratio is not None]
    budget = (f"; RMS error at most {max(ratios):.2g}x the error budget's yardstick" if ratios else "") + (
        f"; {n} elements of values:large past tolerance, let past (1 in {STRAY} at most: domains.excuse)"
        if (n := sum(c.excused for c in checks)) else "")
    n_seeds = {"quick": 1, "rest": len(seeds) - 1}.get(extent, len(seeds))
    each = f"{len(spec.distributions)} distributions x {n_seeds} seed{'s' * (n_seeds != 1)}" + (
        f" (the other {len(seeds) - 1} before a keep)" if extent == "quick" and len(seeds) > 1 else "")
    n_range = sum(kind in ONE_SEED for _, kind in shapes)
    each = ("(one seed each)" if n_range == len(shapes) else
            f"({each} each, one seed on the {n_range} range, value and view shapes)" if n_range else f"x {each}")
    msg = (f"ok: {len(checks)} checks on {len(shapes)} shapes {each}; worst max abs err "
           f"{max(c.max_abs_err or 0 for c in sample):.3g}, max rel err {worst.max_rel_err or 0:.3g} ({worst.label}){budget}")
    return ParityResult(status=ParityStatus.ok, message=msg, checks=checks, seconds=time.monotonic() - t0)


def seeded_shapes(spec, mod, seed: int, hidden: bool) -> tuple[list[int], list[tuple[dict, str]], random.Random, str | None]:
    """check()'s seeds, shapes (kind "" or "hidden ") and [dims] extremes' generator from `seed`; why not, or None."""
    rng = random.Random(seed)
    seeds = [rng.getrandbits(31) for _ in range(spec.parity.seeds)]
    shapes: list[tuple[dict, str]] = [(dict(s), "") for s in spec.shapes]
    if hidden and spec.parity.hidden_shapes and hasattr(mod, "hidden_shapes"):
        extra = list(mod.hidden_shapes(random.Random(rng.getrandbits(32))))[:spec.parity.hidden_shapes]
        if (why := hidden_keys_differ([shapes[0][0]], extra)) is not None:
            return seeds, shapes, rng, why
        shapes += [(dict(s), "hidden ") for s in extra]
    return seeds, shapes, random.Random(rng.getrandbits(32)), None


def _timed(parts: dict, fn):
    """fn, its seconds added to parts["calls"] (a call through the host returns when the host has answered)."""
    if fn is None:
        return None

    def call(*a):
        t = time.monotonic()
        try:
            return fn(*a)
        finally:
            parts["calls"] += time.monotonic() - t
    return call


def one_check(task, mod, lib, shape, label, dist, seed, device, bufs: Buffers, sync, run, run_kept,
              parts: dict | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    inputs = bufs.adopt(draw(task.spec, mod, shape, seed, device, dist))
    if parts is not None:     # the inputs made (a values draw: its search for the edge where the user's call overflows)
        parts["draw"] += time.monotonic() - t0
    clones = tuple(x.clone() if hasattr(x, "clone") else x for x in inputs)
    s1, s2 = bufs.order()
    out1 = bufs.out(s1, mod.empty_output(shape, *inputs))
    atol, rtol = tolerance_for(task, out1)
    base = {"tol": [atol, rtol]}
    sync()
    run(lib, shape, out1, *inputs)
    sync()
    if not all_bits_equal(zip(inputs, clones)):
        return {**base, "status": "input_mutated",
                "message": f"{label} dist={dist}: the kernel changed its inputs (they must be read-only)"}
    exp = mod.reference(shape, *inputs)   # allocates and frees: leftovers are useless to the candidate
    if is_values(dist):                   # atol scaled with the output, as the draw scaled the inputs (domains.py)
        atol = base["tol"][0] = scaled_atol(exp, atol, rtol)
    sync()
    out2 = bufs.out(s2, mod.empty_output(shape, *inputs))
    run(lib, shape, out2, *inputs)
    sync()
    if not all_bits_equal(zip(inputs, clones)):
        return {**base, "status": "input_mutated",
                "message": f"{label} dist={dist}: the kernel changed its inputs on its second call"}
    if (oob := bufs.out_of_bounds((0, 1), label, dist, out1.numel())) is not None:
        return {**base, **oob}
    c1 = judged(dist, out1, exp, atol, rtol)   # compare's account; on values:large a few elements let past
    base["excused"] = c1.pop("excused", 0)
    if c1["status"] != "ok":
        return {**base, **c1}
    c2 = judged(dist, out2, exp, atol, rtol)
    if c2["status"] != "ok":
        line = describe(label, dist, c2, atol, rtol)
        return {**base, **c2, "status": "nondeterministic",
                "message": f"first call matched the reference, the second did not ({c2['status']}): {line}"}
    d = disagree(out1, out2, exp, atol, rtol)
    if d:
        return {**base, **c1, "status": "nondeterministic", "mismatches": d["mismatches"],
                "worst_index": d["worst_index"], "expected": d["first"], "got": d["second"],
                "message": f"{label} dist={dist}: two calls on the same inputs disagree in {d['mismatches']} "
                           f"elements beyond tolerance; at {d['worst_index']}: {d['first']:.6g} vs {d['second']:.6g}"}
    # precision and caches on the sample, not on the domain's edges (tools/measure/domains.py)
    why = None if is_values(dist) else error_budget(task, mod, shape, inputs, out1, exp)
    if why is not None and why["status"] != "ok":
        return {**base, **c1, **why, "message": f"{label} dist={dist}: {why['message']}"}
    ratio = why["err_ratio"] if why else None
    if run_kept is not None:
        # a third call into an output that already holds values: an earlier call's result, zeros or
        # random ones. A kernel whose result depends on them ("resume rows already done", "skip the
        # zero-fill of a clean buffer") is right into the poison and wrong into a buffer the caller reuses.
        out3 = bufs.out(s2, out2)   # the second call's buffer, poisoned again (its guards too), then filled
        held = bufs.fill_state(out3)
        run_kept(lib, shape, out3, *inputs)
        sync()
        if (oob := bufs.out_of_bounds((s2,), label, dist, out3.numel())) is not None:
            return {**base, **oob}
        c3 = judged(dist, out3, exp, atol, rtol)
        if c3["status"] != "ok":
            line = describe(label, dist, c3, atol, rtol)
            return {**base, **c3, "status": "output_state", "message": f"into an output that held {held} before "
                    f"the call, the result was wrong ({c3['status']}): {line}: it must not depend on what the "
                    "output holds"}
        if not is_values(dist) and (why := changed_repeat(task, mod, lib, (shape, label, dist, seed, device), bufs, (s2, out3), exp,
                                   run_kept, sync)):
            return {**base, **why}
    bufs.stale = exp
    return {**base, **c1, "err_ratio": ratio, "max_abs_err": max(c1["max_abs_err"], c2["max_abs_err"]),
            "max_rel_err": max(c1["max_rel_err"], c2["max_rel_err"])}


def build_if_needed(task: Task, lib: str | None) -> Path:   # the CLIs' (parity, bench, profile) own build
    if lib:
        return Path(lib)
    try:
        from tools.build.build import build   # imported only when no --lib is given
    except ImportError:
        raise SystemExit("tools.build.build is not available in this checkout: pass --lib PATH") from None
    from tools.isolation.scratch import process_dir
    res = build(task, process_dir(f"build-{task.name}-"))
    if res.status != "ok" or not res.lib_path:
        raise SystemExit(f"build failed ({res.status}): {res.message}")
    return Path(res.lib_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.measure.parity", description="Check a kernel library against the "
                                 "task's reference (every shape, distribution and fresh seeds).")
    ap.add_argument("task", help="task folder, e.g. kernels/matmul_cpu")
    ap.add_argument("--lib", help="the compiled library (default: build the task's sources)")
    ap.add_argument("--seed", type=int, help="fix the seeds (default: fresh each call)")
    ap.add_argument("--no-hidden", action="store_true", help="skip the hidden shapes")
    ap.add_argument("--extent", choices=EXTENTS, default="full", help="full: every shape on every seed; quick: the "
                    "listed and hidden ones on the first seed (what the loop checks first); rest: what quick left out "
                    "(the other seeds, the extremes of [dims], the value draws); range: the extremes alone")
    ap.add_argument("--timeout", type=float, help="seconds (default: task.toml parity.timeout_s)")
    ap.add_argument("--json", action="store_true", help="print the ParityResult as JSON")
    a = ap.parse_args(argv)
    task = load_task(a.task)
    res = run_parity(task, build_if_needed(task, a.lib), timeout_s=a.timeout, hidden=not a.no_hidden, seed=a.seed, extent=a.extent)
    print(res.model_dump_json(indent=2)) if a.json else _print(res)
    return 0 if res.status == ParityStatus.ok else 1


def _print(res: ParityResult) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from tools.console import make_console
    con = make_console()
    if res.checks:
        t = Table("shape", "dist", "seed", "status", "max abs err", "max rel err", "RMS err / ref's", "excused")
        for c in res.checks:
            t.add_row(Text(c.label), c.dist, str(c.seed), c.status.value, _f(c.max_abs_err), _f(c.max_rel_err),
                      _f(c.err_ratio), str(c.excused or "-"))
        con.print(t)
    color = "green" if res.status == ParityStatus.ok else "red"
    con.print(f"[{color}]{res.status.value}[/{color}] {escape(res.message)} ({res.seconds:.1f}s)", highlight=False)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


if __name__ == "__main__":
    sys.exit(main())
