"""The wide shape (issue 40, tools/measure/ranges.py wide_shape, tools/judge/wide.py): a candidate called once on a
shape whose largest tensor passes 2^31 elements, its inputs made in the judge and in the host from one seed. On
the CPU the same steps run with a smaller bound (a 16-bit index wraps past it); the 2^31 run is the device's
(scripts/device/verify_attention.py, VERIFICATION.md)."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.fixtures.cheats.cheats import source as cheat_source
from tests.fixtures.cpu_faults.faults import compile_lib
from tests.test_ranges import _with_dims
from tools.measure.ranges import INT32_PAST, tensor_elements, wide_shape
from tools.task import load_task, shape_size

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _largest(mod, shape: dict) -> int:
    """The largest tensor's elements, from torch's fake tensors (nothing allocated): the truth the judge's cheaper
    count must agree with."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        ins = mod.make_inputs(shape, 0, "cpu", "normal")
        return max(t.numel() for t in (*ins, mod.empty_output(shape, *ins)))


@pytest.mark.parametrize("name, grown", [("softmax", "M"), ("attention_fwd", "B"), ("attention_ext", "B")])
def test_the_wide_shape_is_the_smallest_growth_of_the_main_shape_past_2_31(name, grown):
    task = load_task(ROOT / "kernels" / name)
    mod = task.module()
    shape = wide_shape(task.spec, mod)
    assert shape is not None
    assert {d: v for d, v in shape.items() if d != grown} == {d: v for d, v in task.spec.main.items() if d != grown}
    assert _largest(mod, shape) == tensor_elements(mod, shape, task.spec.dims) >= INT32_PAST > 1 << 31
    assert shape[grown] <= task.spec.dims[grown].max
    assert _largest(mod, {**shape, grown: shape[grown] - 1}) <= 1 << 31   # no larger than it must be


def test_the_element_count_follows_the_tensors_not_the_product_of_the_dimensions():
    """matmul's tensors are M x K, K x N and M x N: the product M * N * K is no tensor's size."""
    task = load_task(ROOT / "kernels" / "matmul_cpu")
    mod = task.module()
    for shape in ({"M": 4096, "N": 7, "K": 1024}, {"M": 3, "N": 4096, "K": 5}, {"M": 100, "N": 200, "K": 300}):
        assert tensor_elements(mod, shape, task.spec.dims) == _largest(mod, shape) < shape_size(shape)


def test_no_wide_shape_where_the_maxima_do_not_reach_it():
    task = load_task(ROOT / "kernels" / "matmul_cpu")     # 4096 x 4096 at most: 2^24 elements
    assert wide_shape(task.spec, task.module()) is None


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++ and Linux")
def test_the_wide_check_passes_an_honest_kernel_and_fails_one_whose_offsets_wrap(tmp_path):
    """Both directions through a real host: the inputs made there from the seed (no file for them), the output
    back, the judge's reference. C's row offsets in 16 bits (idx16_c) wrap past 2^16 elements."""
    from tools.judge.hostclient import HostClient, Remote
    from tools.judge.wide import check_wide
    task, honest = _with_dims(tmp_path)
    mod = task.module()
    past = (1 << 17) + 1
    cheat = compile_lib(cheat_source("idx16_c"), tmp_path / "idx16_c.so")
    got = {}
    for name, lib in (("honest", honest), ("idx16_c", cheat)):
        root = tmp_path / f"judge-{name}"
        root.mkdir()
        host = HostClient(task.root, root)
        try:
            host.ask({"op": "load", "id": "candidate", "path": str(lib)})
            remote = Remote(host)
            got[name] = check_wide(task, mod, remote, 5, past=past)
            # nothing of the wide shape stays behind: its buffers are forgotten on both sides
            assert remote.synced == {}
            assert not list(host.io.glob("i*.bin")), "the inputs travelled as files"
        finally:
            host.close()
    sc, line = got["honest"]
    assert sc is not None and sc.ok and sc.label.startswith("wide "), (sc, line)
    assert _largest(mod, sc.shape) >= past and "ok" in line
    bad, _ = got["idx16_c"]
    assert bad is not None and not bad.ok and bad.status.value in ("mismatch", "unwritten"), bad   # rows on rows
    assert bad.shape == sc.shape and bad.label in bad.message
