"""`agent doctor`: what this machine has for the CPU and GPU paths, with fixes."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Literal

from pydantic import BaseModel
from rich.table import Table
from rich.text import Text

from tools.console import make_console


def register(subparsers) -> None:
    d = subparsers.add_parser("doctor", help="what this machine has: GPU, compilers, ncu, torch, LLM endpoint")
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-probe", action="store_true", help="skip the ncu counter-permission probe (a few seconds)")
    d.set_defaults(func=cmd_doctor)


class DoctorRow(BaseModel):
    name: str
    status: Literal["ok", "warn", "missing"]
    detail: str = ""
    hint: str = ""
    required: bool = False          # needed for the CPU path: missing -> exit code 1


class DoctorReport(BaseModel):
    rows: list[DoctorRow]
    ok: bool                        # everything required for the CPU path is present


def _first_line(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (res.stdout or res.stderr).strip().splitlines()[0] if res.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return ""


def doctor(probe: bool = True) -> DoctorReport:
    from tools.backends import device
    from tools.backends.toolchain import find_cxx, find_ninja, toolchain_hint

    rows: list[DoctorRow] = []
    py_ok = sys.version_info >= (3, 11)
    rows.append(DoctorRow(name="python", status="ok" if py_ok else "missing", required=True,
                          detail=f"{platform.python_version()} ({sys.executable})",
                          hint="" if py_ok else "Python >= 3.11 is required"))

    gpu = device.torch_cuda_available()
    drv = device.driver_info()
    if gpu:
        lim = device.device_limits()
        rows.append(DoctorRow(name="gpu", status="ok", detail=f"{lim.name}, {lim.arch}, {lim.sm_count} SMs, "
                              f"{lim.max_smem_per_block_optin} B smem opt-in, driver {drv.version or '?'}"))
    else:
        detail = "no CUDA GPU visible" + (f" (nvidia-smi: {drv.detail})" if drv.path else "")
        rows.append(DoctorRow(name="gpu", status="missing", detail=detail,
                              hint="CPU tasks run fully; CUDA tasks compile and get the static launch check only"))

    nv = device.nvcc_info()
    rows.append(DoctorRow(name="nvcc", status="ok" if nv.found else "missing",
                          detail=f"{nv.version or '?'} ({nv.path})" if nv.found else "",
                          hint="" if nv.found else toolchain_hint("nvcc")))
    cxx = find_cxx()
    rows.append(DoctorRow(name="c++", status="ok" if cxx else "missing", required=True,
                          detail=f"{_first_line([cxx, '--version'])} ({cxx})" if cxx else "",
                          hint="" if cxx else toolchain_hint("c++")))
    nj = find_ninja()
    rows.append(DoctorRow(name="ninja", status="ok" if nj else "missing", required=True,
                          detail=f"{_first_line([nj, '--version'])} ({nj})" if nj else "",
                          hint="" if nj else toolchain_hint("ninja")))
    git = shutil.which("git")
    rows.append(DoctorRow(name="git", status="ok" if git else "missing", required=True,
                          detail=_first_line([git, "--version"]) if git else "",
                          hint="" if git else "apt-get install git (runs work in git worktrees)"))

    ncu = device.ncu_info()
    if not ncu.found:
        rows.append(DoctorRow(name="ncu", status="warn" if not gpu else "missing", detail="not found",
                              hint="install Nsight Compute (ships with the CUDA toolkit) and put ncu on PATH; "
                                   "without it profiles fall back to the torch profiler trace and ptxas"))
    else:
        row = DoctorRow(name="ncu", status="ok", detail=f"{ncu.version or '?'} ({ncu.path})")
        if gpu and probe:
            pr = device.ncu_counter_probe()
            row.detail += f"; counters: {pr.status}"
            if pr.status != "ok":
                row.status, row.hint = "warn", pr.message
        elif gpu:
            row.detail += "; counters not probed (--no-probe)"
        rows.append(row)

    rep = device.ncu_report_info(ncu.path)
    rows.append(DoctorRow(name="ncu_report", status="ok" if rep.found else "warn",
                          detail=f"{rep.detail} ({rep.path})" if rep.found else "not importable",
                          hint="" if rep.found else "pip install ncu-report, or add <Nsight Compute>/extras/python "
                                                    "to PYTHONPATH"))

    try:
        import torch
        cuda_build = torch.version.cuda or "CPU-only build"
        rows.append(DoctorRow(name="torch", status="ok", required=True,
                              detail=f"{torch.__version__}, CUDA {cuda_build}, cuda available: {gpu}",
                              hint="" if (gpu or not drv.found) else
                              "a driver is present but torch sees no GPU: install a CUDA build of torch"))
    except Exception as e:  # noqa: BLE001
        rows.append(DoctorRow(name="torch", status="missing", required=True, detail=f"{type(e).__name__}: {e}",
                              hint="pip install torch"))

    base = next(((k, os.environ[k]) for k in ("AGENT_BASE_URL", "OPENAI_BASE_URL") if os.environ.get(k)), None)
    key = bool(os.environ.get("OPENAI_API_KEY"))
    if base or key:
        detail = (f"{base[0]}={base[1]}" if base else "api.openai.com (default)") + \
            f", OPENAI_API_KEY {'set' if key else 'not set'}"
        rows.append(DoctorRow(name="llm endpoint", status="ok", detail=detail))
    else:
        rows.append(DoctorRow(name="llm endpoint", status="warn", detail="not configured",
                              hint="set OPENAI_BASE_URL (or AGENT_BASE_URL) and OPENAI_API_KEY, "
                                   "or use the offline heuristic proposer"))
    ok = not any(r.required and r.status == "missing" for r in rows)
    return DoctorReport(rows=rows, ok=ok)


def cmd_doctor(args) -> int:
    rep = doctor(probe=not args.no_probe)
    if args.json:
        print(rep.model_dump_json())
    else:
        out = make_console()
        t = Table(title="agent doctor")
        for col in ("component", "status", "detail", "fix"):
            t.add_column(col, overflow="fold")
        for r in rep.rows:
            c = {"ok": "green", "warn": "yellow", "missing": "red" if r.required else "yellow"}[r.status]
            # versions, paths and the probes' messages as they were printed to us
            t.add_row(r.name, Text(r.status, style=c), Text(r.detail), Text(r.hint))
        out.print(t)
        if not rep.ok:
            out.print("[red]something the CPU path needs is missing[/red]")
    return 0 if rep.ok else 1
