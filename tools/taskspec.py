"""task.toml's sections below the task itself (tools/task.py's TaskSpec): tolerances, knobs, the build, the
launch check, parity, the bench, an extension's entry, the FLOP/byte formulas, the dimensions' ranges and the
inputs' values."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tools.expr import compile_expr


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerance(Strict):
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class Knob(Strict):
    """A tunable constant, written in the source as `#define NAME VALUE` in `file`."""

    name: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$")
    values: list[int] = Field(min_length=1)
    default: int
    file: str
    description: str = ""
    # what moving the knob does, so the heuristic proposer can tie a metric to it:
    #   split   - raising it raises the CTA count (KV splits, split-K)      -> small grid
    #   tile    - raising it lowers the CTA count, raises reuse and smem/regs -> small grid (down), compute (up)
    #   threads - threads or warps per CTA                                    -> latency, occupancy
    #   pad     - shared-memory row padding                                   -> bank conflicts
    #   vector  - elements per memory access                                  -> memory throughput
    #   tensor  - 0/1: the tensor-core path                                   -> compute-bound, tensor pipe idle
    #   order   - loop order / algorithm variant                              -> explored
    #   other   - explored when no rule fires
    role: Literal["split", "tile", "threads", "pad", "vector", "tensor", "order", "other"] = "other"

    @model_validator(mode="after")
    def _default_in_values(self) -> "Knob":
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default} is not one of its values {self.values}")
        return self


class BuildSpec(Strict):
    flags: list[str] = []          # extra compiler flags (after the defaults)
    # the C++ compiler's defaults before `flags`: the agent's (a torch extension's: torch's own flags then -O3
    # -march=native; tools.build.build.cxx_flags_of), or only the ones torch.utils.cpp_extension.load_inline passes
    # (its -fPIC and -std, no -O), which an imported KernelBench CPU solution is built and timed with by KernelBench
    # (`flags` then holds its extra_cflags)
    defaults: Literal["agent", "load_inline"] = "agent"
    arch: str | None = None        # e.g. "sm_90"; None: the GPU's own, else sm_90 for compile-only
    # nvcc's arch-specific target where the architecture has one (sm_90a on Hopper: wgmma, TMA, setmaxnreg; the code
    # then runs on that architecture only, the one built for); false: the generic target, as torch's load_inline builds
    # for by default (an imported KernelBench CUDA solution: what KernelBench builds must build here alike)
    arch_specific: bool = True
    timeout_s: float = 120.0


class LaunchSpec(Strict):
    # CTAs of the main kernel on the main shape must be at least min_ctas_per_sm * SM count
    min_ctas_per_sm: float = Field(default=1.0, ge=0)
    # reject a candidate whose CTA count falls below this fraction of its parent's
    collapse_ratio: float = Field(default=0.25, ge=0, le=1)


# the source scan's rules, by name (tools/build/scan.py defines each; a test holds the two lists equal)
SCAN_RULES = ("system_state", "file_io", "threads_processes", "new_streams", "mutable_static", "dynamic_loading",
              "clocks", "host_output", "reference_library")


class ScanSpec(Strict):
    """[scan]: the rules of the source scan before a candidate's build (tools/build/scan.py) the task allows, each
    by name with the reason: allow = { host_output = "why" }."""
    allow: dict[str, str] = {}

    @field_validator("allow")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if k not in SCAN_RULES]
        if bad:
            raise ValueError(f"no scan rule named {', '.join(bad)} (the rules: {', '.join(SCAN_RULES)})")
        empty = [k for k, why in v.items() if not str(why).strip()]
        if empty:
            raise ValueError(f"say why the kernel needs {', '.join(empty)}: allow = {{ {empty[0]} = \"why\" }}")
        return v


class ParitySpec(Strict):
    seeds: int = Field(default=2, ge=1)
    hidden_shapes: int = Field(default=2, ge=0)   # extra shapes from task.hidden_shapes(), never shown
    timeout_s: float = 180.0
    allow_files: dict[str, str] = {}   # files the kernel may write in its directory: glob -> why (issue 39)
    # the candidate's error against the reference (the truth, in a higher precision) at most this many times the
    # error of timing_reference (the same computation in the working precision) against it: fewer bits lost
    error_budget: float | None = Field(default=None, gt=1)
    # the bytes every input's and the output's address is a multiple of, where the kernel needs more than the
    # element's own (0): parity's misaligned views hold it (tools/measure/views.py, issue 62), the prompt says it
    align: int = Field(default=0, ge=0, le=4096)

    @field_validator("align")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"align = {v}: a power of two (bytes), or 0 for the element's own alignment")
        return v


class BenchSpec(Strict):
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    rounds: int = Field(default=10, ge=2)      # ABAB rounds for candidate-vs-best
    input_sets: int = Field(default=4, ge=1)   # rotated so that repeats do not measure a warm cache
    min_gain: float = Field(default=0.02, ge=0)
    timeout_s: float = 300.0
    # the speedup interval's coverage; the loop's re-bench of a doubtful candidate asks for 0.99 (agent/evaluation/attempt.py)
    confidence: float = Field(default=0.95, ge=0.5, lt=1.0)

    def timeout_for(self, rounds: int | None) -> float:
        """timeout_s, grown with the rounds where more than these are asked (a re-bench, a confirmation's)."""
        return self.timeout_s * max(1.0, (rounds or 0) / self.rounds)


class ExtensionSpec(Strict):
    """A kernel in the form of a PyTorch C++/CUDA extension (form = "torch_extension"): the module the
    sources build (PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)) and the function the task calls."""
    # the module's function (pybind11), or "ns::op": an op registered with TORCH_LIBRARY(ns, m) (torch.ops.ns.op)
    entry: str = Field(default="forward", pattern=r"^([A-Za-z_][A-Za-z0-9_]*::)?[A-Za-z_][A-Za-z0-9_]*$")
    # TORCH_EXTENSION_NAME; default: the task's name with _ext, made a C identifier
    name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class MetricsSpec(Strict):
    flops: str | None = None   # arithmetic over the shape's fields, e.g. "4*B*H*S*S*D"
    bytes: str | None = None

    @field_validator("flops", "bytes")
    @classmethod
    def _parses(cls, v: str | None) -> str | None:
        if v is not None:
            compile_expr(v, allowed=None)
        return v


class DimRange(Strict):
    """[dims] NAME = { min, max, reduction }: the values a dimension may take (issue 39). Parity adds shapes
    at the range's extremes; `reduction` marks a length summed over (its longest value is checked too)."""
    min: int = Field(default=1, ge=0)
    max: int = Field(ge=1)
    reduction: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "DimRange":
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class InputSpec(Strict):
    """[[inputs]]: the values one of make_inputs' inputs (in its order) may hold, which parity draws past the sample
    before a keep (issue 62, tools/measure/domains.py): `max` the largest magnitude callers pass (default: up to
    where the reference stays finite), `specials` the non-finite values it is defined on (softmax: "-inf", masking),
    `values = false` for an input that is not a value (an index or a mask held as floats: left as drawn); `align`
    the bytes its address is a multiple of, where it is more than [parity] align (tools/measure/views.py)."""
    name: str = ""
    max: float | None = Field(default=None, gt=0)
    specials: list[Literal["-inf", "inf", "nan"]] = []
    values: bool = True
    align: int = Field(default=0, ge=0, le=4096)

    _power_of_two = field_validator("align")(ParitySpec._power_of_two.__func__)


class ArgSpec(Strict):
    """One parameter of the kernel's extern "C" function, in the function's order ([signature] args): a tensor
    (input or output: dtype and shape) or a scalar (int: its value an expression over the shape; float: a constant)."""
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: Literal["input", "output", "int", "float", "stream"]
    dtype: str | None = None              # input, output: torch's name without torch. ("float32", "int64")
    shape: list[str | int] = []           # input, output: each an integer or an expression over the shape's fields
    value: str | float | None = None      # int: an expression over the shape (default: the name); float: the value
    ctype: str | None = None              # int, float: the C type of the prototype ("int", "int64_t", "double")

    @model_validator(mode="after")
    def _kind_fields(self) -> "ArgSpec":
        tensor = self.kind in ("input", "output")
        if tensor and (self.dtype is None or not self.shape):
            raise ValueError(f"{self.name}: an {self.kind} needs dtype and shape")
        if not tensor and (self.dtype is not None or self.shape):
            raise ValueError(f"{self.name}: dtype and shape are for inputs and outputs, not a {self.kind}")
        if self.kind == "float" and not isinstance(self.value, (int, float)):
            raise ValueError(f"{self.name}: a float needs its value (a number)")
        return self


class SignatureSpec(Strict):
    """The kernel's extern "C" function as the generated task.py calls it (tools/signature.py; `agent init`)."""
    function: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    reference: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")   # module:function
    args: list[ArgSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_output(self) -> "SignatureSpec":
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"argument names repeat: {names}")
        outs = [a.name for a in self.args if a.kind == "output"]
        if len(outs) != 1:
            raise ValueError(f"one output is declared here, not {len(outs)} ({outs}): a kernel with several outputs "
                             "needs a task.py of its own (docs/TASKS.md section 4)")
        if not any(a.kind == "input" for a in self.args):
            raise ValueError("no input declared")
        return self
