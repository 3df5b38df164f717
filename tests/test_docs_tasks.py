"""docs/TASKS.md against the code: its field tables list exactly the fields (and defaults) of the
task.toml models in tools/task.py, its load-error messages are the ones load_task gives, and its
example task loads, builds and passes `agent check` as a user runs it."""

import ast
import json
import re
import subprocess
import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.userrepo import agent
from tools.task import TaskError, TaskSpec, load_task
from tools.backends.toolchain import find_cxx, find_ninja

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "TASKS.md"
FIELDS_MARK = re.compile(r"^<!-- fields: (\w+) -->$", re.M)
FILE_BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```[^\n]*\n(.*?)^```$", re.M | re.S)


def _text() -> str:
    return DOC.read_text()


# --- the models and the doc's tables -------------------------------------------------------------
def _nested_models(annotation) -> list[type[BaseModel]]:
    """The pydantic models inside a field's annotation (list[Knob], dict[str, Tolerance], X | None)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def task_models() -> dict[str, type[BaseModel]]:
    """Every model task.toml is parsed into: TaskSpec and, recursively, the models of its fields."""
    found: dict[str, type[BaseModel]] = {}
    todo = [TaskSpec]
    while todo:
        m = todo.pop()
        if m.__name__ in found:
            continue
        found[m.__name__] = m
        for f in m.model_fields.values():
            todo += _nested_models(f.annotation)
    return found


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def doc_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """model name -> rows of the table after its `<!-- fields: NAME -->` marker, keyed by header."""
    tables: dict[str, list[dict[str, str]]] = {}
    for m in FIELDS_MARK.finditer(text):
        assert m.group(1) not in tables, f"two field tables for {m.group(1)}"
        lines = text[m.end():].lstrip("\n").splitlines()
        table = []
        for ln in lines:
            if not ln.startswith("|"):
                break
            table.append(ln)
        assert len(table) >= 2, f"no table after the fields marker of {m.group(1)}"
        header = _cells(table[0])
        rows = [dict(zip(header, _cells(ln))) for ln in table[2:]]
        tables[m.group(1)] = rows
    return tables


def _field_name(row: dict[str, str]) -> str:
    cell = row["Field"]
    got = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell)
    assert got, f"a field cell must be one name in backticks, got {cell!r}"
    return got.group(1)


def test_the_walk_finds_the_nested_models():
    # the walk itself: if it found only TaskSpec, the table test below would check little
    assert {"TaskSpec", "Tolerance", "Knob", "MetricsSpec", "BuildSpec", "LaunchSpec", "ParitySpec",
            "BenchSpec"} <= set(task_models())


def test_every_model_field_has_a_row_and_every_row_is_a_field():
    models, tables = task_models(), doc_tables(_text())
    assert set(tables) == set(models), (
        f"models without a field table in docs/TASKS.md: {sorted(set(models) - set(tables))}; "
        f"tables for no model: {sorted(set(tables) - set(models))}")
    problems = []
    for name, model in models.items():
        documented = [_field_name(r) for r in tables[name]]
        dupes = sorted({f for f in documented if documented.count(f) > 1})
        missing = [f for f in model.model_fields if f not in documented]
        extra = [f for f in documented if f not in model.model_fields]
        if dupes or missing or extra:
            problems.append(f"{name}: not in the doc {missing}, not in the model {extra}, twice {dupes}")
    assert not problems, "docs/TASKS.md field tables are out of date:\n" + "\n".join(problems)


def test_documented_defaults_are_the_models_defaults():
    models, tables = task_models(), doc_tables(_text())
    wrong = []
    for name, rows in tables.items():
        for row in rows:
            field = models[name].model_fields.get(_field_name(row))
            if field is None:
                continue   # reported by the test above
            cell = row["Default"].strip("`")
            where = f"{name}.{_field_name(row)}: the doc says {row['Default']!r}"
            if field.is_required():
                ok, want = cell == "required", "required"
            elif field.default is None:
                ok, want = cell == "none", "none"
            elif isinstance(field.default, BaseModel):
                continue   # a sub-table: the cell points to its section
            else:
                try:
                    ok = tomllib.loads(f"v = {cell}")["v"] == field.default
                except tomllib.TOMLDecodeError:
                    ok = False
                want = repr(field.default)
            if not ok:
                wrong.append(f"{where}, the model {want}")
    assert not wrong, "\n".join(wrong)


def test_every_function_of_the_shipped_tasks_is_documented():
    text = _text()
    for path in sorted(ROOT.glob("kernels/*/task.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                assert f"`{node.name}(" in text, f"{path.relative_to(ROOT)} defines {node.name}(), which " \
                                                 "docs/TASKS.md does not describe"


# --- the load errors of section 6.1 ----------------------------------------------------------------
BASE = '''name = "vadd"
device = "cpu"
sources = ["vadd.cpp"]
editable = ["vadd.cpp"]
shapes = [{ n = 16 }]
[tolerance.float32]
atol = 0.0
rtol = 0.0
'''
KNOB = '[[knobs]]\nname = "{name}"\nvalues = {values}\ndefault = 1\nfile = "{file}"\n'
FILES = {"vadd.cpp": "#define UNROLL 1\n", "task.py": ""}
EXT = BASE.replace('device = "cpu"', 'device = "cpu"\nform = "torch_extension"')
OPS_FILES = {"vadd.cpp": '#define UNROLL 1\nTORCH_LIBRARY(vops, m) { m.def("forward(Tensor a) -> Tensor"); }\n',
             "task.py": ""}
# (what is wrong, the task.toml, the files beside it); the doc's messages came from these
BAD = [
    ("no task.toml", None, FILES),
    ("not TOML", BASE + "oops = \n", FILES),
    ("typo", BASE.replace('device = "cpu"', 'device = "cpu"\nsourcse = ["x"]'), FILES),
    ("typo in a table", BASE + "[bench]\nround = 3\n", FILES),
    ("no name", BASE.replace('name = "vadd"\n', ""), FILES),
    ("device", BASE.replace('"cpu"', '"gpu"'), FILES),
    ("name pattern", BASE.replace('"vadd"', '"v add"'), FILES),
    ("no shapes", BASE.replace("[{ n = 16 }]", "[]"), FILES),
    ("float in a shape", BASE.replace("{ n = 16 }", "{ n = 16.5 }"), FILES),
    ("missing source", BASE.replace('["vadd.cpp"]', '["nope.cpp"]'), FILES),
    ("no module", BASE, {"vadd.cpp": FILES["vadd.cpp"]}),
    ("editable", BASE.replace('editable = ["vadd.cpp"]', 'editable = ["other.cpp"]'), FILES),
    ("editable module", BASE.replace('sources = ["vadd.cpp"]\neditable = ["vadd.cpp"]',
                                     'sources = ["vadd.cpp", "task.py"]\neditable = ["vadd.cpp", "task.py"]'), FILES),
    ("editable python", BASE.replace('sources = ["vadd.cpp"]\neditable = ["vadd.cpp"]',
                                     'sources = ["vadd.cpp", "helper.py"]\neditable = ["vadd.cpp", "helper.py"]'),
     {**FILES, "helper.py": ""}),
    ("main_shape", BASE.replace("shapes =", "main_shape = 3\nshapes ="), FILES),
    ("dtype tolerance", BASE.replace("shapes =", 'dtypes = ["float16"]\nshapes ='), FILES),
    ("atol", BASE.replace("atol = 0.0", "atol = -1"), FILES),
    ("rounds", BASE + "[bench]\nrounds = 1\n", FILES),
    ("baseline", BASE.replace("shapes =", 'baseline = "torch"\nshapes ='), FILES),
    ("no #define", BASE + KNOB.format(name="BLOCK", values="[1, 2]", file="vadd.cpp"), FILES),
    ("default", BASE + KNOB.format(name="UNROLL", values="[2, 4]", file="vadd.cpp"), FILES),
    ("knob name", BASE + KNOB.format(name="unroll", values="[1, 2]", file="vadd.cpp"), FILES),
    ("role", BASE + KNOB.format(name="UNROLL", values="[1, 2]", file="vadd.cpp") + 'role = "bogus"\n', FILES),
    ("knob file", BASE + KNOB.format(name="UNROLL", values="[1, 2]", file="x.h"), FILES),
    ("restriction name", BASE.replace("shapes =", 'restrictions = ["FOO < 2"]\nshapes =')
     + KNOB.format(name="UNROLL", values="[1, 2]", file="vadd.cpp"), FILES),
    ("restriction default", BASE.replace("shapes =", 'restrictions = ["UNROLL > 1"]\nshapes =')
     + KNOB.format(name="UNROLL", values="[1, 2]", file="vadd.cpp"), FILES),
    ("formula", BASE + '[metrics]\nflops = "2*n +"\n', FILES),
    ("formula call", BASE + '[metrics]\nflops = "abs(n)"\n', FILES),
    ("no binding", EXT, FILES),
    ("ops without entry", EXT, OPS_FILES),
    ("ops namespace", EXT + '[extension]\nentry = "other::forward"\n', OPS_FILES),
]


@pytest.mark.parametrize("what,toml,files", BAD, ids=[b[0] for b in BAD])
def test_the_documented_load_errors_are_what_load_task_says(tmp_path, what, toml, files):
    if toml is not None:
        (tmp_path / "task.toml").write_text(toml)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(TaskError) as e:
        load_task(tmp_path)
    msg = str(e.value).replace(str(tmp_path.resolve()), "<dir>").replace(str(tmp_path), "<dir>")
    assert f"`{msg}`" in _text(), f"docs/TASKS.md section 6.1 does not show load_task's message {msg!r}"


# --- the example of section 2 ------------------------------------------------------------------
def example_files() -> dict[str, str]:
    files = {name: body for name, body in FILE_BLOCK.findall(_text())}
    assert {"task.toml", "task.py"} <= set(files), f"the example's files: {sorted(files)}"
    return files


def write_example(dest: Path, knobs: dict[str, int] | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name, body in example_files().items():
        for knob, value in (knobs or {}).items():
            body = re.sub(rf"^#define {knob} -?\d+", f"#define {knob} {value}", body, flags=re.M)
        (dest / name).write_text(body)
    return dest


def test_the_example_loads(tmp_path):
    task = load_task(write_example(tmp_path / "task"))
    spec = task.spec
    assert spec.name == "vadd" and spec.device == "cpu"
    assert set(example_files()) == {"task.toml", spec.module, *spec.sources}
    assert task.read_knobs() == spec.default_knobs()   # the committed #define is the documented default


def _agent(*args: str) -> subprocess.CompletedProcess:
    # tests/userrepo.py's, as tests/test_doctor.py runs it
    return agent(ROOT, *args, timeout=300)


def _check(task_dir: Path, build_dir: Path, *extra: str) -> dict:
    if not (find_cxx() and find_ninja()):
        pytest.skip("no C++ compiler or ninja here: the example cannot be built")
    res = _agent("check", str(task_dir), "--build-dir", str(build_dir), "--json", *extra)
    assert "Traceback" not in res.stderr, res.stderr
    summary = json.loads(res.stdout)
    assert res.returncode == 0 and summary["ok"] is True, f"agent check failed:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}"
    return summary


@pytest.mark.slow   # about 10 s on an idle 2-core machine: torch starts, bench, probes, three more builds
def test_the_example_and_every_value_of_its_knob_pass_agent_check(tmp_path):
    # the doc says every value of UNROLL must build and pass parity, and that `--knobs each` checks it
    assert sorted(load_task(write_example(tmp_path / "t0")).spec.knobs[0].values) == [1, 2, 4, 8]
    s = _check(write_example(tmp_path / "task"), tmp_path / "build", "--knobs", "each")
    assert s["build"]["status"] == "ok" and s["launch"]["status"] == "not_applicable"
    assert s["parity"]["status"] == "ok" and s["bench"][0]["status"] == "ok"
    # the line the doc quotes: three listed shapes, two hidden, two distributions, two seeds; two value shapes, each
    # with the large and the tiny draw; two view shapes, each with its pointers at one offset and at offsets apart
    assert s["parity"]["message"].startswith("ok: 28 checks on 9 shapes (2 distributions x 2 seeds each, one seed on "
                                              "the 4 range, value and view shapes)"), s["parity"]["message"]
    assert s["bench"][0]["shape"] == {"n": 1048576}
    assert s["knobs"]["committed"] == {"UNROLL": 1}
    assert s["knobs"]["configurations"] == 3 and s["knobs"]["passed"] == 3 and s["knobs"]["failures"] == []
