"""agent/optimize/patch.py on real files in a temp task folder (the CPU matmul source as the subject)."""

import os
import shutil
from pathlib import Path

import pytest

from agent.optimize.patch import PatchStatus, apply_edits, unified_diff
from agent.proposal import Edit

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "kernels" / "matmul_cpu" / "matmul.cpp"


@pytest.fixture
def task(tmp_path):
    root = tmp_path / "task"
    root.mkdir()
    shutil.copy(SRC, root / "matmul.cpp")
    (root / "task.py").write_text("# the reference: not editable\n")
    (root / "helper.h").write_text("int a;\nint a;\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def test_exact_match_applies_and_diffs(task):
    r = apply_edits([Edit(file="matmul.cpp", search="#define BLOCK_M 16\n", replace="#define BLOCK_M 32\n")],
                    task, ["matmul.cpp"])
    assert r.ok and r.status == PatchStatus.ok
    assert r.files_changed == ["matmul.cpp"] and r.applied == [0] and r.fuzzy == []
    text = (task / "matmul.cpp").read_text()
    assert "#define BLOCK_M 32\n" in text and "#define BLOCK_M 16" not in text
    assert "-#define BLOCK_M 16\n+#define BLOCK_M 32\n" in r.diff
    assert r.diff.startswith("--- a/matmul.cpp\n+++ b/matmul.cpp\n")


def test_whitespace_tolerant_match_keeps_file_indentation(task):
    # the model dropped the indentation and added a blank line; the file's block is indented 16 spaces
    search = "for (int i = i0; i < i1; ++i)\n\n    for (int k = k0; k < k1; ++k) {\n"
    replace = "for (int i = i0; i < i1; ++i)\n    for (int k = k0; k < k1; k += 1) {\n"
    r = apply_edits([Edit(file="matmul.cpp", search=search, replace=replace)], task, ["matmul.cpp"])
    assert r.ok, r.message
    assert r.fuzzy == [0]
    text = (task / "matmul.cpp").read_text()
    assert "                for (int i = i0; i < i1; ++i)\n                    for (int k = k0; k < k1; k += 1) {\n" in text


def test_ambiguous_exact_match_fails_with_count(task):
    before = snapshot(task)
    r = apply_edits([Edit(file="helper.h", search="int a;", replace="int b;")], task, ["helper.h"])
    assert not r.ok and r.status == PatchStatus.did_not_apply
    assert "matches 2 times" in r.message
    assert snapshot(task) == before


def test_ambiguous_tolerant_match_fails_with_count(task):
    r = apply_edits([Edit(file="helper.h", search="  int a;  ", replace="int b;")], task, ["helper.h"])
    assert not r.ok and "matches 2 times (ignoring whitespace)" in r.message


def test_miss_answers_with_closest_lines(task):
    search = "                for (int i = i0; i < i1; ++i)\n                    for (int kk = k0; kk < k1; ++kk) {\n"
    r = apply_edits([Edit(file="matmul.cpp", search=search, replace="x\n")], task, ["matmul.cpp"])
    assert not r.ok and r.status == PatchStatus.did_not_apply
    assert "Did you mean these lines" in r.message
    lines = SRC.read_text().splitlines()
    n = lines.index("                    for (int k = k0; k < k1; ++k) {") + 1
    # the real lines, numbered as in the file
    assert f"{n:5d} |                     for (int k = k0; k < k1; ++k) {{" in r.message
    assert "No block applied; no file was changed" in r.message


def test_all_or_nothing_across_files(task):
    before = snapshot(task)
    edits = [Edit(file="matmul.cpp", search="#define BLOCK_N 16", replace="#define BLOCK_N 64"),
             Edit(file="helper.h", content="int c;\n"),
             Edit(file="matmul.cpp", search="#define NOT_THERE 1", replace="#define X 2")]
    r = apply_edits(edits, task, ["matmul.cpp", "helper.h"])
    assert not r.ok
    assert r.applied == [0, 1]
    assert "block 3 (matmul.cpp) did not apply" in r.message
    assert "Blocks 1, 2 would apply" in r.message
    assert snapshot(task) == before
    assert not list(task.glob("*.agent-tmp"))


def test_blocks_apply_in_order_on_the_same_file(task):
    edits = [Edit(file="matmul.cpp", search="#define BLOCK_K 16", replace="#define BLOCK_K 64"),
             Edit(file="matmul.cpp", search="#define BLOCK_K 64", replace="#define BLOCK_K 128")]
    r = apply_edits(edits, task, ["matmul.cpp"])
    assert r.ok and "#define BLOCK_K 128" in (task / "matmul.cpp").read_text()


def test_whole_file_content_rewrite(task):
    r = apply_edits([Edit(file="matmul.cpp", content="// new\n")], task, ["matmul.cpp"])
    assert r.ok and (task / "matmul.cpp").read_text() == "// new\n"


def test_no_change_is_reported(task):
    r = apply_edits([Edit(file="matmul.cpp", search="#define BLOCK_M 16", replace="#define BLOCK_M 16")],
                    task, ["matmul.cpp"])
    assert not r.ok and r.status == PatchStatus.no_change


@pytest.mark.parametrize("path", ["task.py", "../task/matmul.cpp", "/etc/passwd", "./../x.cpp",
                                  str(SRC), "sub/../../matmul.cpp"])
def test_paths_outside_editable_are_refused(task, path):
    before = snapshot(task)
    r = apply_edits([Edit(file=path, content="pwned\n")], task, ["matmul.cpp"])
    assert not r.ok and r.status == PatchStatus.outside_editable, r
    assert "No file was changed" in r.message and "matmul.cpp" in r.message
    assert snapshot(task) == before


def test_refused_edit_stops_the_other_blocks_too(task):
    before = snapshot(task)
    edits = [Edit(file="matmul.cpp", search="#define BLOCK_M 16", replace="#define BLOCK_M 8"),
             Edit(file="task.py", content="def reference(): return 0\n")]
    r = apply_edits(edits, task, ["matmul.cpp"])
    assert r.status == PatchStatus.outside_editable and "edit 2 refused" in r.message
    assert snapshot(task) == before


def test_symlinked_editable_file_is_refused(task, tmp_path):
    outside = tmp_path / "outside.cpp"
    outside.write_text("secret\n")
    os.symlink(outside, task / "link.cpp")
    r = apply_edits([Edit(file="link.cpp", content="x\n")], task, ["link.cpp"])
    assert r.status == PatchStatus.outside_editable and "symlink" in r.message
    assert outside.read_text() == "secret\n"


def test_unified_diff_helper():
    d = unified_diff("a\nb\n", "a\nc\n", "k.cu")
    assert d == "--- a/k.cu\n+++ b/k.cu\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    assert unified_diff("same\n", "same\n", "k.cu") == ""
    assert "\\ No newline at end of file" in unified_diff("a\n", "a", "k.cu")
