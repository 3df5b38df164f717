"""Read an Nsight Compute report (.ncu-rep) into a ProfileReport with the `ncu_report` module.

The module comes from the installed Nsight Compute (extras/python beside the `ncu` found on PATH),
else from the PyPI `ncu-report` wheel, which reads reports on machines without a GPU.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from types import ModuleType

from tools.profile.classify import HINTS, classify_bottleneck
from tools.profile.model import KernelProfile, ProfileEnv, ProfileReport, ProfileStatus, RuleResult, Stall
from tools.backends.toolchain import ncu_python_dirs

# --- where ncu_report comes from -----------------------------------------------------------
_MODULE: ModuleType | None = None


def load_module() -> ModuleType:
    """ncu_report from the installed Nsight Compute, else the PyPI wheel. Raises ImportError."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    for d in ncu_python_dirs():
        sys.path.insert(0, str(d))
        try:
            sys.modules.pop("ncu_report", None)
            _MODULE = importlib.import_module("ncu_report")
            return _MODULE
        except ImportError:
            pass
        finally:
            sys.path.remove(str(d))
    sys.modules.pop("ncu_report", None)
    _MODULE = importlib.import_module("ncu_report")   # the `ncu-report` wheel
    return _MODULE


def module_origin() -> str:
    try:
        return str(Path(load_module().__file__).resolve())
    except ImportError as e:
        return f"unavailable: {e}"


# --- metric names ----------------------------------------------------------------------------
M = {
    "sol_compute": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sol_memory": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram": ["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed"],
    "duration": "gpu__time_duration.sum",
    "l1_hit": "l1tex__t_sector_hit_rate.pct",
    "l2_hit": "lts__t_sector_hit_rate.pct",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
    "regs": "launch__registers_per_thread",
    "smem_static": "launch__shared_mem_per_block_static",
    "smem_dynamic": "launch__shared_mem_per_block_dynamic",
    "occ_theoretical": "sm__maximum_warps_per_active_cycle_pct",
    "occ_achieved": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "tensor": ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"],
    "bank_conflicts": ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
                       "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"],
    "sm_count": "device__attribute_multiprocessor_count",
    "gpu": "device__attribute_display_name",
}
OCC_LIMITS = {"registers": "launch__occupancy_limit_registers", "shared_memory": "launch__occupancy_limit_shared_mem",
              "warps": "launch__occupancy_limit_warps", "blocks": "launch__occupancy_limit_blocks"}
DIMS = {"grid": ("launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z"),
        "block": ("launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z")}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
STALL_SKIP = {"selected", "not_issued"}   # states, not stall reasons
_TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


class UnreadableReport(Exception):
    pass


def _value(m) -> float | int | str | None:
    if m is None or (hasattr(m, "has_value") and not m.has_value()):
        return None
    kind = m.kind()
    if kind == m.ValueKind_STRING:
        return m.as_string()
    if kind in (m.ValueKind_UINT32, m.ValueKind_UINT64):
        return int(m.as_uint64())
    return float(m.as_double())


class _Action:
    """One profiled kernel launch, with the metrics read recorded by name."""

    def __init__(self, action):
        self.a = action
        self.read: dict[str, float | int | str] = {}

    def get(self, key: str | list[str]) -> float | int | str | None:
        for name in ([key] if isinstance(key, str) else key):
            v = _value(self.a.metric_by_name(name))
            if v is not None:
                self.read[name] = v
                return v
        return None

    def num(self, key) -> float | None:
        v = self.get(M.get(key, key) if isinstance(key, str) else key)
        return float(v) if isinstance(v, (int, float)) else None

    def int_(self, key) -> int | None:
        v = self.num(key)
        return int(round(v)) if v is not None else None


def _rules(action) -> list[RuleResult]:
    mod = load_module()
    kinds = {mod.MsgType_OPTIMIZATION: "OPT", mod.MsgType_WARNING: "WRN", mod.MsgType_ERR: "ERR",
             mod.MsgType_OK: "INF", mod.MsgType_NONE: ""}
    sp_kinds = {mod.SpeedupType_GLOBAL: "global", mod.SpeedupType_LOCAL: "local"}
    if not hasattr(action, "rule_results_as_dicts"):
        return []
    out = []
    for r in action.rule_results_as_dicts():
        msg = r.get("rule_message") or {}
        text = _plain(msg.get("message", ""))
        if not text:
            continue
        sp = r.get("speedup_estimation")
        out.append(RuleResult(id=r.get("rule_identifier") or r.get("name", ""), title=msg.get("title", "") or r.get("name", ""),
                              type=kinds.get(msg.get("type"), str(msg.get("type", ""))), message=text,
                              speedup=round(float(sp["speedup"]), 2) if sp else None,
                              speedup_kind=sp_kinds.get(sp["type"]) if sp else None))
    return out


_LINK = re.compile(r"@(?:url|sass|source|section):(?:[^:@]*:)*([^:@]*)@")


def _plain(message: str) -> str:
    """Rule messages carry UI links (@section:ID:text@); keep the text."""
    return " ".join(_LINK.sub(lambda m: m.group(1), message).split())


def _stalls(act: _Action) -> list[Stall]:
    vals = {}
    for name in act.a.metric_names():
        m = STALL.match(name)
        if m and m.group(1) not in STALL_SKIP:
            v = act.get(name)
            if isinstance(v, (int, float)) and v > 0:
                vals[m.group(1)] = float(v)
    total = sum(vals.values())
    if not total:
        return []
    top = sorted(vals.items(), key=lambda kv: -kv[1])[:6]
    return [Stall(reason=r, pct=round(100 * v / total, 1)) for r, v in top]


def _dims(act: _Action, which: str, total: int | None) -> tuple[int, int, int]:
    d = [act.int_(n) for n in DIMS[which]]
    if all(x is not None for x in d):
        return (d[0], d[1], d[2])
    return (total or 0, 1, 1)


def kernel_from_action(action, sm_count: int | None) -> KernelProfile:
    act = _Action(action)
    mod = load_module()
    grid_size, block_size = act.int_("grid_size"), act.int_("block_size")
    grid, block = _dims(act, "grid", grid_size), _dims(act, "block", block_size)
    dur = act.a.metric_by_name(M["duration"])
    duration_us = None
    if _value(dur) is not None:
        act.read[M["duration"]] = _value(dur)
        duration_us = float(_value(dur)) * _TIME_UNITS.get(dur.unit(), 1e-3)
    limits = {k: act.int_(v) for k, v in OCC_LIMITS.items()}
    known = {k: v for k, v in limits.items() if v is not None}
    limiter = min(known, key=lambda k: (known[k], k != "registers")) if known else None
    k = KernelProfile(
        name=action.name(mod.IAction.NameBase_FUNCTION) if hasattr(mod.IAction, "NameBase_FUNCTION") else action.name(),
        demangled=action.name(mod.IAction.NameBase_DEMANGLED) if hasattr(mod.IAction, "NameBase_DEMANGLED") else "",
        grid=grid, block=block, ctas=grid_size if grid_size is not None else grid[0] * grid[1] * grid[2],
        waves_per_sm=act.num("waves"), registers_per_thread=act.int_("regs"),
        smem_static_bytes=act.int_("smem_static"), smem_dynamic_bytes=act.int_("smem_dynamic"),
        duration_us=round(duration_us, 3) if duration_us is not None else None,
        sol_compute_pct=act.num("sol_compute"), sol_memory_pct=act.num("sol_memory"), dram_pct=act.num("dram"),
        l1_hit_pct=act.num("l1_hit"), l2_hit_pct=act.num("l2_hit"),
        occupancy_theoretical_pct=act.num("occ_theoretical"), occupancy_achieved_pct=act.num("occ_achieved"),
        occupancy_limiter=limiter, tensor_pipe_pct=act.num("tensor"), smem_bank_conflicts=act.int_("bank_conflicts"),
        stalls=_stalls(act), rules=_rules(action),
    )
    k.bottleneck, k.bottleneck_reason = classify_bottleneck(k, sm_count)
    k.metrics = dict(sorted(act.read.items()))
    return k


def read_report(path: str | Path, source: str = "report") -> ProfileReport:
    """Every kernel launch in the report. A missing, corrupt or empty report is report_unreadable."""
    p = Path(path)

    def fail(msg: str) -> ProfileReport:
        return ProfileReport(status=ProfileStatus.report_unreadable, source=source, message=msg,
                             hint=HINTS[ProfileStatus.report_unreadable])

    if not p.is_file():
        return fail(f"{p}: no such file")
    try:
        mod = load_module()
    except ImportError as e:
        return ProfileReport(status=ProfileStatus.report_unreadable, source=source,
                             message=f"the ncu_report module is not available: {e}",
                             hint="pip install ncu-report (or install Nsight Compute)")
    try:
        ctx = mod.load_report(str(p))
        actions = [ctx.range_by_idx(r).action_by_idx(a)
                   for r in range(ctx.num_ranges()) for a in range(ctx.range_by_idx(r).num_actions())]
    except Exception as e:   # the SWIG layer raises plain exceptions for a broken file
        return fail(f"{p}: ncu_report could not load it: {type(e).__name__}: {e}")
    if not actions:
        return fail(f"{p}: no profiled kernels in it (not an Nsight Compute report, truncated, or empty)")
    first = _Action(actions[0])
    sm_count = first.int_("sm_count")
    gpu = first.get(M["gpu"])
    try:
        kernels = [kernel_from_action(a, sm_count) for a in actions]
    except Exception as e:
        return fail(f"{p}: a kernel's metrics could not be read: {type(e).__name__}: {e}")
    return ProfileReport(status=ProfileStatus.ok, source=source, kernels=kernels,
                         env=ProfileEnv(gpu=str(gpu) if gpu is not None else None, sm_count=sm_count))


def read_report_isolated(path: str | Path, source: str = "report", timeout_s: float = 120.0,
                         held=None) -> ProfileReport:
    """read_report in a child process: ncu_report is native code, and a crash in it (it can crash in a
    process that has torch and two ncu_report builds loaded) must not take the agent down. The child
    prints the report as one JSON line. `held` (prestart_reader: a reader started earlier, its imports done) takes
    the job (the path and `source`, one JSON line) where it still can, else one is started now; either way it is
    spent."""
    from tools.isolation.sandbox import ProcStatus, child_json, run_python_json
    if held is not None and held.alive and not held.used:
        res = held.run(json.dumps([str(path), source]), timeout_s)
        data = child_json(res.stdout)
    else:
        if held is not None:
            held.close()
        res, data = run_python_json("tools.profile.reader", [str(path), "--source", source], timeout_s)
    if data is not None:
        return ProfileReport.model_validate(data)
    status = ProfileStatus.timeout if res.status == ProcStatus.timeout else ProfileStatus.report_unreadable
    return ProfileReport(status=status, source=source, message=f"{path}: the report reader {res.reason()}",
                         hint=HINTS[status])


def prestart_reader():
    """read_report_isolated's child started now, waiting for its job on stdin with this module, its models
    and ncu_report imported: 0.5-0.65 s of a keep's ncu stage on an H200 was a reader's start (BENCHMARKS.md, issue 66
    slice 21). A tools.isolation.sandbox.Prestarted; the caller closes it where it gives it no job."""
    from tools.isolation.sandbox import prestart_python
    return prestart_python("tools.profile.reader", ["--job-stdin"])


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="read a .ncu-rep into the profile JSON (one line)")
    ap.add_argument("path", nargs="?", help="the report (else, with --job-stdin, named on stdin)")
    ap.add_argument("--source", default="report")
    ap.add_argument("--job-stdin", action="store_true",
                    help="import ncu_report, then wait for [path, source] as one JSON line on stdin (prestart_reader)")
    a = ap.parse_args()
    if a.job_stdin:
        try:
            load_module()
        except ImportError:   # read_report says so, on the job
            pass
        a.path, a.source = json.loads(sys.stdin.readline() or '["", "report"]')
    if not a.path:
        ap.error("no report named")
    print(read_report(a.path, source=a.source).model_dump_json())
