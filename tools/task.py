"""A kernel task: kernels/NAME/task.toml, validated by pydantic, plus its Python module.

The task.toml is the contract between the user and the agent: which files the agent may edit,
what the build compiles, the shapes parity and bench run on, tolerances, the baseline that
`--target` is measured against, the knobs the heuristic proposer may move, and the FLOP/byte
formulas behind TFLOP/s, GB/s and the roofline.

A bad task fails with one `TaskError` naming the file and the field, never a traceback.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from tools.expr import compile_expr, eval_expr
from tools.taskspec import (BenchSpec, BuildSpec, DimRange, ExtensionSpec, Knob, LaunchSpec, ScanSpec,  # noqa: F401
                            InputSpec, MetricsSpec, ParitySpec, SignatureSpec, Tolerance, Strict)
from tools.task_messages import shape_keys_differ, validation_message

Shape = dict[str, int | bool]


class TaskError(Exception):
    """A task that cannot be used, with the file and field at fault."""

    def __init__(self, path: Path | str, field: str, message: str):
        self.path, self.field, self.message = str(path), field, message
        # "-": the file as a whole, or a rule across fields (section 3.1 of docs/TASKS.md): no field to name
        super().__init__(f"{path}: {message}" if field == "-" else f"{path}: {field}: {message}")


class TaskSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]+$")
    description: str = ""
    device: Literal["cuda", "cpu"]
    # how the kernel is called: "ctypes" (a shared library with extern "C" entry points, task.py's
    # run(lib, ...)) or "torch_extension" (a pybind module built with torch's headers; tools/backends/backend.py)
    form: Literal["ctypes", "torch_extension"] = "ctypes"
    extension: ExtensionSpec | None = None
    module: str = "task.py"
    sources: list[str] = Field(min_length=1)
    editable: list[str] = Field(min_length=1)
    kernel_regex: str | None = None     # the kernels to profile / launch-check (ncu -k regex:)
    baseline: Literal["reference", "initial"] = "reference"
    # CPU threads for torch, OpenMP and MKL where the kernel and the reference run; none: 1 on a CPU
    # task, torch's own on a GPU task (tools/backends/backend.py backend_for, warm_up; BENCHMARKS.md says why)
    cpu_threads: int | None = Field(default=None, ge=1)
    dtypes: list[str] = Field(default=["float32"], min_length=1)
    distributions: list[str] = Field(default=["normal", "uniform"], min_length=1)
    shapes: list[Shape] = Field(min_length=1)
    main_shape: int = 0
    tolerance: dict[str, Tolerance]
    knobs: list[Knob] = []
    restrictions: list[str] = []
    metrics: MetricsSpec = MetricsSpec()
    build: BuildSpec = BuildSpec()
    launch: LaunchSpec = LaunchSpec()
    parity: ParitySpec = ParitySpec()
    scan: ScanSpec = ScanSpec()     # the source scan's rules the task allows (tools/build/scan.py)
    bench: BenchSpec = BenchSpec()
    dims: dict[str, DimRange] = {}   # each dimension's allowed range (parity draws its extremes: tools/measure/ranges.py)
    inputs: list[InputSpec] = []     # the values each input may hold past the sample (tools/measure/domains.py)
    signature: SignatureSpec | None = None   # the extern "C" function a generated task.py calls (tools/signature.py)

    @field_validator("shapes")
    @classmethod
    def _same_keys(cls, shapes: list[Shape]) -> list[Shape]:
        why = shape_keys_differ(shapes)
        if why:
            raise ValueError(why)
        return shapes

    @model_validator(mode="after")
    def _consistent(self) -> "TaskSpec":
        if self.extension is not None and self.form != "torch_extension":
            raise ValueError('[extension] is for form = "torch_extension"')
        if self.build.defaults == "load_inline" and self.form != "torch_extension":
            raise ValueError('build.defaults = "load_inline" is for form = "torch_extension" (torch\'s flags for torch\'s '
                             'extensions)')
        for f in self.editable:
            if f not in self.sources:
                raise ValueError(f"editable file {f!r} is not among the sources {self.sources}")
        if self.module in self.editable:    # the judge's own code: the reference a candidate is checked against
            raise ValueError(f"the task's module {self.module!r} holds the reference and the calls the judge checks a "
                             "candidate with: it cannot be editable")
        for f in self.editable:             # the judge imports the task's Python, and what it imports, unfenced
            if f.endswith((".py", ".pyc", ".so")):
                raise ValueError(f"editable file {f!r} is Python the judge could import: a candidate edits the "
                                 "sources that are compiled (and their headers)")
        if not 0 <= self.main_shape < len(self.shapes):
            raise ValueError(f"main_shape {self.main_shape} is outside the {len(self.shapes)} shapes")
        for d, r in self.dims.items():
            v = self.shapes[0].get(d)
            if v is None or isinstance(v, bool):
                raise ValueError(f"[dims] {d}: not an integer dimension of the shapes {sorted(self.shapes[0])}")
            if any(not r.min <= s[d] <= r.max for s in self.shapes):
                raise ValueError(f"[dims] {d}: a listed shape is outside [{r.min}, {r.max}]")
        for d in self.dtypes:
            if d not in self.tolerance:
                raise ValueError(f"dtype {d!r} has no [tolerance.{d}]")
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"knob names repeat: {names}")
        for k in self.knobs:
            if k.file not in self.editable:
                raise ValueError(f"knob {k.name}: file {k.file!r} is not editable")
        for r in self.restrictions:
            compile_expr(r, allowed=set(names))
        if self.signature is not None:
            if self.form != "ctypes":
                raise ValueError('[signature] is for form = "ctypes" (an extension is called through its module)')
            keys = set(self.shapes[0])
            for a in self.signature.args:
                for e in [*a.shape, *([a.value] if a.kind == "int" and isinstance(a.value, str) else [])]:
                    if isinstance(e, str):
                        compile_expr(e, allowed=keys)
                if a.kind == "int" and a.value is None and a.name not in keys:
                    raise ValueError(f"[signature] {a.name}: no shape field of that name; give its value")
        if self.knobs and not self.restriction_ok(self.default_knobs()):
            raise ValueError("the knobs' defaults break the restrictions")
        return self

    # --- knobs -----------------------------------------------------------------------------
    def default_knobs(self) -> dict[str, int]:
        return {k.name: k.default for k in self.knobs}

    def restriction_ok(self, config: dict[str, int]) -> bool:
        return all(bool(eval_expr(r, config)) for r in self.restrictions)

    def knob_space(self) -> list[dict[str, int]]:
        """Every knob configuration the restrictions allow (Kernel Tuner's search space)."""
        names = [k.name for k in self.knobs]
        out = []
        for combo in itertools.product(*(k.values for k in self.knobs)):
            cfg = dict(zip(names, combo))
            if self.restriction_ok(cfg):
                out.append(cfg)
        return out

    # --- shapes and formulas ---------------------------------------------------------------
    @property
    def main(self) -> Shape:
        return self.shapes[self.main_shape]

    @property
    def ext(self) -> ExtensionSpec:
        """The extension's names (defaults filled in), for form = "torch_extension"."""
        e = self.extension or ExtensionSpec()
        return e if e.name else e.model_copy(update={"name": re.sub(r"\W|^(?=\d)", "_", self.name) + "_ext"})

    def flops(self, shape: Shape) -> float | None:
        return float(eval_expr(self.metrics.flops, shape)) if self.metrics.flops else None

    def bytes(self, shape: Shape) -> float | None:
        return float(eval_expr(self.metrics.bytes, shape)) if self.metrics.bytes else None


def shape_label(shape: Shape) -> str:
    return ",".join(f"{k}={int(v)}" for k, v in shape.items())


def shape_size(shape: Shape) -> int:
    """The product of a shape's dimensions, a bound on the size of its tensors: a flag, or a value under 1
    (attention's `causal = 0`, an int), counts as 1 (as 0 it made every attention shape's size 0: the reentrant
    probe made 64 calls of the main shape a thread, and memcheck took shapes of any size)."""
    import math
    return math.prod(max(1, int(v)) for v in shape.values() if not isinstance(v, bool))


class Task:
    """A loaded task: the validated spec plus where it lives."""

    def __init__(self, spec: TaskSpec, root: Path):
        self.spec, self.root = spec, root

    @property
    def name(self) -> str:
        return self.spec.name

    def path(self, rel: str) -> Path:
        return self.root / rel

    @property
    def backend(self):
        """What differs between kernel forms and devices (tools/backends/backend.py)."""
        from tools.backends.backend import backend_for
        return backend_for(self)

    def module(self) -> ModuleType:
        """task.py, completed by the backend (a torch extension's task may leave out `run`)."""
        return self.backend.complete(load_module(self.root / self.spec.module, f"agent_task_{self.spec.name}"))

    def read_knobs(self, root: Path | None = None) -> dict[str, int | None]:
        """Current knob values as written in the sources (None where the #define is gone)."""
        base = root or self.root
        out: dict[str, int | None] = {}
        for k in self.spec.knobs:
            text = (base / k.file).read_text()
            m = knob_pattern(k.name).search(text)
            out[k.name] = int(m.group(2)) if m else None
        return out


def knob_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^([ \t]*#define[ \t]+{re.escape(name)}[ \t]+)(-?\d+)\b", re.M)


def load_task(path: str | Path) -> Task:
    """Load kernels/NAME (or its task.toml). Raises TaskError naming file and field."""
    p = Path(path)
    toml_path = p / "task.toml" if p.is_dir() else p
    if not toml_path.exists():
        raise TaskError(toml_path, "-", "no such file (a task is a folder with a task.toml)")
    root = toml_path.parent.resolve()
    try:
        raw = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskError(toml_path, "-", f"not valid TOML: {e}") from None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as e:
        raise TaskError(toml_path, *validation_message(e, raw, TaskSpec)) from None
    for i, f in enumerate(spec.sources):
        if not (root / f).is_file():
            raise TaskError(toml_path, f"sources.{i}", f"file {f!r} does not exist in {root}")
    if not (root / spec.module).is_file():
        raise TaskError(toml_path, "module", f"file {spec.module!r} does not exist in {root}")
    if spec.form == "torch_extension":
        _has_binding(toml_path, root, spec.sources, spec.ext)
    if spec.signature is not None:
        from tools.signature import task_mismatch
        if (why := task_mismatch(spec.signature, root, spec.sources)) is not None:
            raise TaskError(toml_path, "signature", why)
    for k in spec.knobs:
        if not knob_pattern(k.name).search((root / k.file).read_text()):
            raise TaskError(toml_path, f'knobs "{k.name}"', f"no '#define {k.name} <int>' line in {k.file}")
    return Task(spec, root)


def _has_binding(toml_path: Path, root: Path, sources: list[str], ext: ExtensionSpec) -> None:
    """A torch extension is called through its pybind11 module's entry function, or through an op it
    registers with TORCH_LIBRARY (entry = "ns::op"): a source must define what the entry names."""
    from tools.backends.torch_library import namespaces
    texts = {f: (root / f).read_text(errors="replace") for f in sources}
    found: dict[str, str] = {}          # namespace -> the file that registers it
    for f, t in texts.items():
        for ns in namespaces(t):
            found.setdefault(ext.name if ns == "TORCH_EXTENSION_NAME" else ns, f)   # type: ignore[arg-type]
    ns, _, op = ext.entry.rpartition("::")
    if ns:
        if ns in found:
            return
        have = ", ".join(f"{n} ({f})" for n, f in found.items())
        raise TaskError(toml_path, "extension.entry", f"no source registers ops in namespace {ns!r} with TORCH_LIBRARY("
                        f"{ns}, m)" + (f"; the sources register {have}: name that one, e.g. entry = "
                                       f'"{next(iter(found))}::{op}"' if found else ""))
    if any("PYBIND11_MODULE" in t for t in texts.values()):
        return
    if found:
        first, f = next(iter(found.items()))
        raise TaskError(toml_path, "extension.entry", f"{f} registers its ops with TORCH_LIBRARY({first}, m) and defines "
                        f'no Python module: set [extension] entry = "{first}::{op}", the op to call '
                        f"(torch.ops.{first}.{op})")
    raise TaskError(toml_path, "sources", "no source defines the extension's Python module or registers an op: add "
                    'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", ...); } to a source, or register '
                    'the op with TORCH_LIBRARY(myops, m) and set [extension] entry = "myops::forward"')


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskError(path, "module", "cannot be imported")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def find_tasks(kernels_dir: Path) -> list[Path]:
    return sorted(p.parent for p in kernels_dir.glob("*/task.toml"))


def first_fitting_task(kernels_dir: Path, cuda: bool) -> Path | None:
    """The first valid task that fits the machine: a cuda task where a GPU is present (else a cpu one
    there too), only a cpu task without one; of those, a ctypes task before a torch extension (the
    shipped defaults stay the measured ones). Tasks that fail to load are skipped."""
    specs: dict[Path, TaskSpec] = {}
    for path in find_tasks(kernels_dir):
        try:
            specs[path] = load_task(path).spec
        except TaskError:
            continue
    for want in (["cuda", "cpu"] if cuda else ["cpu"]):
        for form in ("ctypes", "torch_extension"):
            for path, spec in specs.items():
                if spec.device == want and spec.form == form:
                    return path
    return None
