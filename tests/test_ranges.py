"""Parity's shapes from the task's declared ranges (issue 39, tools/measure/ranges.py, task.toml [dims])."""

from __future__ import annotations

import math
import random

import pytest

from tests.fixtures.cheats.cheats import source as cheat_source
from tests.fixtures.cpu_faults.faults import compile_lib, make_task
from tools.measure.ranges import INDEX_CAP, range_shapes
from tools.task import TaskError, load_task

DIMS = """
[dims]
M = { min = 1, max = 4096 }
N = { min = 1, max = 4096 }
K = { min = 1, max = 1024, reduction = true }
"""


def _with_dims(tmp_path, dims: str = DIMS):
    task, honest = make_task(tmp_path, "correct", hidden=0)
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace("[tolerance.float32]", dims + "\n[tolerance.float32]"))
    return load_task(task.root), honest


def test_the_extremes_cover_tails_each_largest_dimension_and_index_products_past_2_16(tmp_path):
    task, _ = _with_dims(tmp_path)
    mod = task.module()
    got = range_shapes(task.spec, mod, random.Random(3))
    shapes = [s for s, _ in got]
    whys = [w for _, w in got]
    assert {"M": 1, "N": 1, "K": 1} in shapes
    assert any(max(s.values()) <= 17 and s != {"M": 1, "N": 1, "K": 1} for s in shapes), shapes
    for d in "MN":
        assert any(s[d] == 4096 and max(v for e, v in s.items() if e != d) <= 9 for s in shapes), (d, shapes)
    assert any(s["K"] == 1024 and w == "the longest reduction" for s, w in got)
    big = shapes[whys.index("index products past 2^16")]
    x = mod.make_inputs(big, 0, "cpu", "normal")
    assert all(t.numel() > 1 << 16 for t in (*x, mod.empty_output(big, *x))), big
    assert all(math.prod(s.values()) <= INDEX_CAP for s in shapes)
    assert range_shapes(task.spec, mod, random.Random(3)) == got            # the run's seed decides
    assert len({tuple(sorted(s.items())) for s in shapes}) == len(shapes)   # no duplicates
    mod.valid_shape = lambda s: s["M"] != 4096
    assert all(s["M"] != 4096 for s, _ in range_shapes(task.spec, mod, random.Random(3)))
    plain, _ = make_task(tmp_path / "plain", "correct")
    assert range_shapes(plain.spec, plain.module(), random.Random(3)) == []


@pytest.mark.parametrize("name", ["idx16_c", "strip8_overlap", "blocks8"])   # past 2^16, a tail, M at 4096
def test_a_kernel_wrong_only_outside_the_listed_shapes_fails_on_a_range_shape(tmp_path, name):
    """Both directions: without [dims] parity passes the kernel (every listed shape is right); with it,
    parity fails it on a shape labelled `range`; the honest kernel passes both."""
    from tools.measure.parity import run_parity
    plain, honest = make_task(tmp_path / "plain", "correct", hidden=0)
    lib = compile_lib(cheat_source(name), tmp_path / f"lib{name}.so")
    assert run_parity(plain, lib).status.value == "ok"
    task, _ = _with_dims(tmp_path)
    res = run_parity(task, lib)
    assert res.status.value in ("mismatch", "unwritten", "out_of_bounds"), res.message
    assert res.worst().label.startswith("range "), res.message
    assert run_parity(task, honest).status.value == "ok"


def test_a_listed_shape_outside_its_range_or_a_range_upside_down_is_refused_naming_the_field(tmp_path):
    for dims, needle in (("[dims]\nM = { min = 1, max = 8 }\n", "[dims] M: a listed shape is outside [1, 8]"),
                         ("[dims]\nM = { min = 9, max = 8 }\n", "min 9 is above max 8"),
                         ("[dims]\nQ = { max = 8 }\n", "[dims] Q: not an integer dimension")):
        with pytest.raises(TaskError) as e:
            _with_dims(tmp_path / needle[:6].replace(" ", "_").replace("[", "").replace("]", ""), dims)
        assert needle in str(e.value), str(e.value)
