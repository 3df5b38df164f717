"""What the model is told of the machine, the toolchain and the harness (issue 43): a strong engineer asks for the GPU's
limits or the CPU's ISA and caches before tiling anything, the tolerance before trading precision, and the harness's
contract before deciding what a call may assume. Built once per run by the LLM proposer, rendered into the iteration
prompt (prompts/iteration.md `machine`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.records.envinfo import first_line, gpu_clocks
from tools.backends.device import nvcc_info
from tools.task import Task

# the ISA extensions a CPU kernel's author chooses between (of /proc/cpuinfo's flags)
ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile",
       "asimd", "sve", "sve2")


def cpu_facts() -> list[str]:
    """The CPU's model, logical cores, ISA extensions and caches (Linux: /proc/cpuinfo, /sys)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        info = ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", info, re.M)
    have = [f for f in ISA if flags and f in flags.group(1).split()]
    caches = [f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''} {size}"
              for level, kind, size in cache_levels()]
    return [f"CPU: {model.group(1).strip() if model else 'unknown model'}{core(info)}, {os.cpu_count()} logical cores"
            f"{topology()}; ISA extensions: {', '.join(have) or 'none of ' + ', '.join(ISA[:5])}"
            + (f"; caches per core: {', '.join(caches)}" if caches else "") + clock(info) + "; " + hw_counters()]


# perf_event_open's number where the counters could be asked for (x86-64, arm64)
PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


def hw_counters() -> str:
    """Whether this process can open a hardware counter (perf_event_open, instructions retired, user space only): a
    model asked for IPC and cache misses (issue 63). Many VMs expose no PMU (ENOENT); perf_event_paranoid 3 refuses."""
    import ctypes
    import errno
    import struct
    nr = PERF_EVENT_OPEN.get(os.uname().machine)
    if nr is None:
        return f"hardware counters: not tried on {os.uname().machine}"
    # perf_event_attr, its first 64 bytes (PERF_ATTR_SIZE_VER0): type HARDWARE, config INSTRUCTIONS, flags
    # disabled | exclude_kernel | exclude_hv
    attr = ctypes.create_string_buffer(struct.pack("IIQQQQQ", 0, 64, 1, 0, 0, 0, 1 | 1 << 5 | 1 << 6) + bytes(16))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, attr, 0, -1, -1, 0)
    if fd >= 0:
        os.close(fd)
        return ("hardware counters: this machine lets a process open them (perf_event_open), but the harness does "
                "not collect them for a candidate: the figures' share of the measured peaks is the profile")
    err = ctypes.get_errno()
    why = {errno.ENOENT: "no hardware PMU is exposed, a VM's usual case",
           errno.EACCES: "refused by perf_event_paranoid", errno.EPERM: "refused by perf_event_paranoid or seccomp",
           errno.ENOSYS: "the syscall is absent"}.get(err, errno.errorcode.get(err, str(err)))
    return f"hardware counters: none readable here ({why}): the figures' share of the measured peaks is the profile"


def core(info: str) -> str:
    """The family and model numbers /proc/cpuinfo gives (a VM's model name may be only "AMD EPYC"), and for AMD's the
    core they number (a model asked which microarchitecture it was tuning for, issue 63)."""
    fam = re.search(r"^cpu family\s*:\s*(\d+)", info, re.M)
    mod = re.search(r"^model\s*:\s*(\d+)", info, re.M)
    if not (fam and mod):
        return ""
    f, m = int(fam.group(1)), int(mod.group(1))
    amd = "AuthenticAMD" in info
    zen = (("Zen or Zen+" if m < 0x30 else "Zen 2") if f == 23 else
           ("Zen 4" if 0x10 <= m <= 0x1F or 0x60 <= m <= 0xAF else "Zen 3") if f == 25 else
           "Zen 5" if f == 26 else "") if amd else ""
    return f" (family {f}, model {m}" + (f": {zen} by AMD's numbering)" if zen else ")")


def topology() -> str:
    """Whether the logical cores are SMT siblings (a model asked: one physical core with two threads, or two?)."""
    try:
        sib = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return ""
    per_core = sum(int(b) - int(a) + 1 if "-" in part else 1
                   for part in sib.split(",") if part for a, _, b in [part.partition("-")])
    return (" (the OS sees no SMT sibling: each its own core)" if per_core == 1 else
            f" ({per_core} SMT threads a physical core: a thread beside yours shares its units)")


def clock(info: str) -> str:
    """The clock the kernel has: cpufreq's maximum where the machine exposes it, and /proc/cpuinfo's current."""
    now = re.search(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)
    try:
        top = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000
    except (OSError, ValueError):
        top = None
    parts = ([f"{float(now.group(1)):.0f} MHz now"] if now else []) + ([f"{top:.0f} MHz at most"] if top else [])
    return f"; clock {', '.join(parts)}" if parts else ""


def timing(task: Task) -> str:
    """How a candidate is timed and kept (attempt.decide), in numbers: the model was told "faster beyond the noise"
    and learnt what that meant from its first rejection (issue 63)."""
    b = task.spec.bench
    return (f"Timing and the keep rule: on the main shape, the candidate and the current best are each warmed for "
            f"{b.warmup_ms:g} ms, then timed in {b.rounds} rounds of about {b.rep_ms:g} ms of calls each, their order "
            f"rotated round by round, the calls going over {max(2, b.input_sets)} input sets in turn, each with an output of its own, "
            f"refilled with new values before each round (no call is handed the buffers the call before it had)"
            f"{'; the L2 flushed before each rep' if task.backend.gpu else working_set(task)}; the speedup over the best is the median of the rounds' ratios with a {b.confidence:.0%} "
            f"interval. Kept only if the interval lies above 1 and the median "
            f"is at least {b.min_gain:.0%} over it (task.toml [bench] min_gain; a run's --min-gain overrides it), and "
            f"a second interleaved bench in a fresh process shows it again. A bench whose median clears that gain "
            f"while its interval still reaches 1 is doubt, not slowness: it is benched again with twice, then four "
            f"times the rounds (99% intervals); one still undecided then is \"inconclusive\" (not kept, not called "
            f"slower). A median below the gain is rejected as within noise")


def cache_levels() -> list[tuple[str, str, str]]:
    """cpu0's caches as sysfs lists them: (level, type, size) such as ("3", "Unified", "32768K")."""
    out = []
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            out.append(tuple((d / n).read_text().strip() for n in ("level", "type", "size")))
        except OSError:
            continue
    return out


def last_level_cache() -> tuple[str, int] | None:
    """This CPU's last-level cache (L3, or L2 where there is no L3) and its size in bytes."""
    best = None
    for level, kind, size in cache_levels():
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if kind == "Instruction" or m is None:
            continue
        nbytes = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
        if best is None or int(level) > best[0]:
            best = (int(level), nbytes)
    return (f"L{best[0]}", best[1]) if best else None


def working_set(task: Task) -> str:
    """Where a CPU bench's data lives: the input sets' bytes (task.toml's byte formula on the main shape, times the
    sets) against the last-level cache (issue 63: told "a repeat does not find its inputs in the cache", a model took
    an 8 MiB working set in a 32 MiB L3 for DRAM traffic and proposed streaming stores, which lost)."""
    spec, llc = task.spec, last_level_cache()
    nbytes = spec.bytes(spec.main) if spec.metrics.bytes else None
    if not nbytes or llc is None:
        return ""
    total = nbytes * max(2, spec.bench.input_sets)
    where = ("fit in it together: a round's calls mostly find their data there, not in DRAM" if total <= llc[1] / 2
             else "are past it: each call's data comes from DRAM" if total > llc[1]
             else "take half of it or more: some of each call's data comes from DRAM")
    return (f"; the {max(2, spec.bench.input_sets)} sets hold about {total / 2**20:.1f} MiB (task.toml's bytes "
            f"formula, inputs and output, times the sets) against this CPU's {llc[0]} of {llc[1] / 2**20:.0f} MiB: they "
            f"{where}")


def gpu_facts(task: Task) -> list[str]:
    """The limits the launch check holds the kernel to (the GPU's own, or the arch table's where no GPU is here) and
    the clocks."""
    from tools.backends.device import task_limits
    lim = task_limits(task)
    if lim is None:
        return []
    where = "" if lim.source == "device" or "table" in lim.name else " (from the arch table: no GPU here)"
    out = [f"GPU: {lim.name} ({lim.arch}, {lim.sm_count} SMs){where}; per block at most {lim.max_threads_per_block} "
           f"threads and {lim.max_smem_per_block_optin // 1024} KiB of shared memory (opt-in); {lim.regs_per_sm} "
           f"registers per SM, at most {lim.max_regs_per_thread} a thread"]
    clocks = gpu_clocks()
    if clocks:
        out.append(f"SM clock now, max: {clocks} (read while the GPU idles between benches: it boosts under load; the "
                   f"clocks are left as found while timing, never locked)")
    return out


def toolchain(task: Task) -> list[str]:
    """The compilers, the build's own command lines (the -O level, -march, the standard, the defines: a model that is
    not told them guesses, issue 63) and, for a GPU, the target nvcc builds for."""
    nvcc = nvcc_info() if task.backend.gpu else None
    comp = f"nvcc {nvcc.version}" if nvcc is not None and nvcc.found else first_line(["c++", "--version"])
    flags = " ".join(task.spec.build.flags) or "none"
    out = [f"Compiler: {comp or 'unknown'}; the task's extra flags (task.toml [build] flags): {flags}"]
    from tools.backends.device import resolve_arch
    from tools.build.commands import build_commands
    commands = [readable(c, task.root) for c in build_commands(task)]
    if commands:
        out.append("The build, as the harness runs it (folders shortened): "
                   + "; ".join(f"`{c}`" for c in commands))
    if task.backend.gpu:
        arch = resolve_arch(task)
        out.append(f"Target: {arch}, " + (
            "nvcc's arch-specific target: the architecture's own instructions build (on Hopper wgmma, TMA, "
            "setmaxnreg); the code runs on this architecture only" if arch.endswith("a") else
            "the generic target (task.toml's [build] arch_specific = false: arch-specific instructions such as "
            "wgmma and TMA do not build)" if not task.spec.build.arch_specific else "the generic target"))
    return out


_ABS = re.compile(r"(^|[\s=,]|-I|-L)(/[^\s'\",]+)")


def readable(cmd: str, root: Path) -> str:
    """A command line with the task's folder as `.`, every other absolute path as its last two parts, and without
    -fmacro-prefix-map (the build's folder kept out of `__FILE__`: nothing the kernel's code sees)."""
    here = str(root.resolve())
    words = [w for w in cmd.replace(here + "/", "").replace(here, ".").split()
             if not w.startswith("-fmacro-prefix-map=")]
    return _ABS.sub(lambda m: m.group(1) + ".../" + "/".join(Path(m.group(2)).parts[-2:]), " ".join(words))


def tolerance(task: Task) -> str:
    spec = task.spec
    tols = "; ".join(f"{name}: atol {t.atol:g}, rtol {t.rtol:g}" for name, t in spec.tolerance.items()) or "exact"
    budget = (f"; and the RMS error at most {spec.parity.error_budget:g}x the error of the same computation in the "
              "working precision (fewer bits kept than that fails, even inside the tolerance)"
              if spec.parity.error_budget else "")
    return f"Tolerance against the reference: {tols}{budget}"


HARNESS = ("The harness: every call gets an output whose every element was poisoned before it (write them all) and "
           "inputs it must not change; it is also called into an output that already holds an earlier answer, and "
           "again after one input element changed. Before a keep the inputs and the output are also views at offsets "
           "of {align} past a 64-byte boundary, each its own (a caller's slice): no pointer is aligned beyond "
           "{unit}. Shapes range over task.toml's [dims] (rows of 1-17, odd widths, "
           "the longest reductions{wide}), beside hidden shapes you are not shown. Two threads may call at once on "
           "their own buffers{streams}: no static or global state. Before the build a scan refuses what no kernel "
           "needs (the environment, files, threads, processes{own_streams}, mutable static state (a static or inline "
           "function is not state), clocks, "
           "prints) unless task.toml allows it; the candidate runs in a process where starting a process "
           "fails{sanitizer}.")


def machine_facts(task: Task) -> str:
    gpu = task.backend.gpu
    lines = gpu_facts(task) if gpu else cpu_facts()
    lines += toolchain(task) + [timing(task), tolerance(task), values(task), *dims(task), *launch_rules(task),
              HARNESS.format(**alignment(task), wide=", and on a GPU one shape past 2^31 elements" if gpu else "",
                             own_streams=", streams of its own" if gpu else "",
                             streams=", each on a CUDA stream of its own (launch on the stream you are given)"
                             if gpu else "",
                             sanitizer="; before a keep it runs under compute-sanitizer memcheck, and racecheck "
                             "before the keep or just after it (a race found then revokes the keep)"
                             if gpu else "")]
    return "\n".join(f"- {ln}" for ln in lines)


def dims(task: Task) -> list[str]:
    """The ranges parity's shapes are drawn over (task.toml [dims]): a model told only "rows of 1-17, the longest
    reductions" guessed this task's bounds (issue 63)."""
    d = task.spec.dims
    if not d:
        return []
    return ["The sizes parity draws shapes from (task.toml [dims]): " + ", ".join(
        f"{name} {r.min}..{r.max}" + (" (a reduction: its longest is checked)" if r.reduction else "")
        for name, r in d.items())]


def launch_rules(task: Task) -> list[str]:
    """The launch check's task rules (tools/measure/launch.py), beside the device limits gpu_facts gives."""
    if not task.backend.gpu:
        return []
    ls = task.spec.launch
    return [f"The launch check on the main shape (task.toml [launch]): the main kernel's CTAs at least "
            f"{ls.min_ctas_per_sm:g} x the SM count, and at least {ls.collapse_ratio:g} x the current best's CTA count"]


def values(task: Task) -> str:
    """The values parity draws before a keep (tools/measure/domains.py), the task's declarations named."""
    declared = "; ".join(f"{i.name or f'input {n}'}: {', '.join(i.specials)}" for n, i in enumerate(task.spec.inputs)
                         if i.specials) or "none"
    return ("Values before a keep: beside the task's distributions, magnitudes up to near where the reference "
            "overflows, zeros of both signs and subnormals, and the non-finite inputs task.toml declares "
            f"({declared}); the output must hold NaN and inf exactly where the reference's does")


def alignment(task: Task) -> dict[str, str]:
    """What parity's misaligned views (tools/measure/views.py) hold the kernel's pointers to, for the prompt."""
    declared = {i.name or f"input {n}": i.align for n, i in enumerate(task.spec.inputs) if i.align > task.spec.parity.align}
    every = task.spec.parity.align
    unit = f"{every} bytes (task.toml's [parity] align)" if every else "its element's size"
    more = "".join(f"; {name}: {a} bytes" for name, a in declared.items())
    return {"align": f"whole multiples of {every} bytes" if every else "1 to 16 bytes' worth of whole elements",
            "unit": unit + more}
