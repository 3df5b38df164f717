"""The shape of the code, checked: no import cycle among the project's modules (imports inside functions
count: a lazy import hides a cycle, it does not remove it), and no private name imported from another
module (a name with a leading underscore is its module's own business)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "tools")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name or None


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                targets = [f"{n.module}.{a.name}" for a in n.names] + [n.module]
            else:
                continue
            for t in targets:
                r = _resolve(t, mods)
                if r and r != m and not m.startswith(r + "."):   # a package's own submodules import it freely
                    edges[m].add(r)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for m, p in _modules().items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in PACKAGES:
                bad += [f"{m}: from {n.module} import {a.name}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


# tools/ in rooms (issue 38), floor by floor from the bottom: a module imports its own room and the
# rooms below it, never one above (an import inside a function counts). docs/ARCHITECTURE.md's module
# map follows this list. Every module of tools/ is in one.
FLOORS: list[tuple[str, ...]] = [
    # the result models every stage returns; the console; task.toml's formulas and messages
    ("tools.results", "tools.console", "tools.expr", "tools.task_messages"),
    ("tools.isolation",),          # how a child runs: sandbox, fence, scratch, fork server
    ("tools.backends",),           # compilers, headers, the GPU, the clock: what differs by form and device
    ("tools.task", "tools.taskspec", "tools.signature"),   # task.toml -> Task, with its backend; its sections
    ("tools.kernelbench",),        # KernelBench's files in (a task folder) and out (a ModelNew file)
    ("tools.build",),              # ninja: the task's sources into its library; earlier objects reused
    ("tools.measure", "tools.profile"),   # launch, parity, bench and their statistics; Nsight Compute
    ("tools.judge",),              # the judge, its host and the batch: the verdict outside the candidate
    # agent/ in rooms (issue 64), above tools/ (nothing in tools/ imports agent/)
    ("agent.proposal",),           # a proposal's vocabulary: hypothesis, evidence, predicted effect, edits
    ("agent.records",),            # what a run leaves on disk and reads back; its figures
    ("agent.evaluation", "agent.proposers"),   # a candidate to a verdict, and where it runs; the proposer contract
    ("agent.llm", "agent.sweep", "agent.review"),   # the model as a proposer; the knob space; runs reviewed
    ("agent.optimize",),           # agent optimize and resume: the session, the loop, the best
    ("agent.commands", "agent.cli", "agent.__main__"),   # the command line
]


def _floor(module: str, floors: list[tuple[str, ...]]) -> int | None:
    return next((i for i, rooms in enumerate(floors) for r in rooms if module == r or module.startswith(r + ".")),
                None)


def _upward(edges: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[str]:
    out = []
    for a, targets in edges.items():
        for b in targets:
            fa, fb = _floor(a, floors), _floor(b, floors)
            if fa is not None and fb is not None and fb > fa:
                out.append(f"{a} -> {b}")
    return sorted(out)


def test_no_room_imports_a_room_above_it():
    assert _upward(_imports(_modules()), FLOORS) == []


def test_every_module_of_tools_and_agent_is_on_a_floor():
    assert [m for m in _modules() if m.startswith(("tools.", "agent.")) and _floor(m, FLOORS) is None] == []


# agent/'s top level holds few modules (issue 64: 23 modules on ten floors made a newcomer read the whole list)
AGENT_TOP_LIMIT = 8


def test_agent_is_in_rooms_each_saying_its_job():
    top = sorted(p.stem for p in (ROOT / "agent").glob("*.py"))
    assert len(set(top) - {"__init__", "__main__", "cli"}) <= AGENT_TOP_LIMIT, top
    rooms = sorted(p.parent for p in (ROOT / "agent").glob("*/__init__.py") if p.parent.name != "_shipped")
    assert len(rooms) >= 4, rooms
    for room in rooms:
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        # the docstring names every module of its room
        missing = [p.stem for p in room.glob("*.py") if p.stem != "__init__" and p.stem not in doc]
        assert doc and missing == [], (room.name, missing)


def test_the_floor_check_sees_an_import_that_runs_upward():
    floors = [("t.low",), ("t.mid", "t.side"), ("t.high",)]
    edges = {"t.low.a": {"t.mid.b"}, "t.mid.b": {"t.low.a", "t.side.c"}, "t.high": {"t.mid.b"}, "t.other": {"t.high"},
             "t.side.c": {"t.high"}}
    assert _upward(edges, floors) == ["t.low.a -> t.mid.b", "t.side.c -> t.high"]


# Size limits that keep each module one job: the loop reads as its steps (DESIGN.md "One iteration"),
# each of its functions fits a screen; an instrument in tools/ that outgrows 350 lines is doing two jobs.
LINE_LIMITS = {"agent/optimize/loop.py": 300, "agent/*.py": 350, "agent/*/*.py": 350, "tools/*.py": 350,
               "tools/*/*.py": 350}
FUNCTION_LIMIT = {"agent/optimize/loop.py": 60}


def _long_functions(path: Path, limit: int) -> list[str]:
    return [f"{path.name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_modules_stay_within_their_size_limits():
    assert all(list(ROOT.glob(pattern)) for pattern in LINE_LIMITS)   # each limit applies to something
    over = [f"{p.relative_to(ROOT)}: {n} lines > {limit}" for pattern, limit in LINE_LIMITS.items()
            for p in sorted(ROOT.glob(pattern)) if (n := len(p.read_text().splitlines())) > limit]
    over += [f for rel, limit in FUNCTION_LIMIT.items() for f in _long_functions(ROOT / rel, limit)]
    assert over == []


def test_the_function_length_check_sees_a_long_function(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n" + "    x = 1\n" * 70 + "\n\ndef g():\n    return 1\n")
    assert _long_functions(p, 60) == ["m.py:1 f (71 lines)"]


# What differs between kernel forms and devices lives in tools/backends/backend.py (issue 25): nowhere else does
# the code branch on the device's name. A comparison of anything called `device` with "cuda" or "cpu"
# counts, whatever its spelling (spec.device, self.device(), p.device, a local `device`).
BACKEND_HOME = {"tools.backends.backend"}


def _device_branches(src: str, where: str) -> list[str]:
    def is_device(n: ast.AST) -> bool:
        if isinstance(n, ast.Call):
            n = n.func
        return (isinstance(n, ast.Name) and n.id == "device") or (isinstance(n, ast.Attribute) and n.attr == "device")

    out = []
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(isinstance(s, ast.Constant) and s.value in ("cuda", "cpu") for s in sides) and any(map(is_device, sides)):
                out.append(f"{where}:{n.lineno}")
    return out


def test_no_device_branch_outside_the_backends():
    bad = [b for m, p in _modules().items() if m not in BACKEND_HOME
           for b in _device_branches(p.read_text(), str(p.relative_to(ROOT)))]
    assert bad == []


def test_the_device_branch_finder_finds_each_spelling():
    src = ('a = task.spec.device == "cuda"\nb = "cpu" != p.device\nc = self.device() == "cuda"\n'
           'd = device == "cpu"\ne = x.kind == "cuda"\n')
    assert _device_branches(src, "f") == ["f:1", "f:2", "f:3", "f:4"]
