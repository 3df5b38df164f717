"""What the CLI prints is text that can be copied: what a compiler, a kernel, a model, a path or a git
ref wrote is never read as rich markup (`xr[i]` lost its `[i]`, read as italics), and output that is
not a terminal is never folded (CI logs read `unknown key (a` / `typo?)`, `agent runs` split run ids
over two lines). Every command is run as the user runs it: a subprocess with its output piped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.userrepo import agent, git, make_user_repo

# a line of C++ whose subscripts look like markup tags to rich
TYPO = "m = xr[i] > m ? xr[i] : mm;"
LONG_ID = "row-max-typo-with-a-long-descriptive-run-name"


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """A user's repository whose committed kernel does not compile (mm is not declared), with three runs
    that failed at setup: two with the default timestamp ids, one with a long id of the user's."""
    root = make_user_repo(tmp_path_factory.mktemp("text") / "user")
    src = root / "kernels" / "matmul_cpu" / "matmul.cpp"
    src.write_text(src.read_text() + "\n// the row's largest value, with a typo\n"
                   'extern "C" float row_max(const float* xr, int n) {\n'
                   "    float m = xr[0];\n"
                   f"    for (int i = 1; i < n; ++i) {TYPO}\n"
                   "    return m;\n"
                   "}\n")
    git(root, "commit", "-qam", "row_max, with a typo")
    for extra in ([], [], ["--run-id", LONG_ID]):
        res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "heuristic", "--iters", "1", "--quiet",
                    *extra, timeout=120)
        assert res.returncode == 1 and "cannot start" in res.stderr, res.stdout + res.stderr
    return root


def _line_with(text: str, needle: str) -> str:
    """The one line that holds needle whole (an assertion error with the text where none does)."""
    lines = [ln for ln in text.splitlines() if needle in ln]
    assert lines, f"{needle!r} is not on one line of:\n{text}"
    return lines[0]


def test_compiler_output_keeps_its_subscripts(broken):
    chk = agent(broken, "check", "kernels/matmul_cpu", env={"COLUMNS": "80"}, timeout=120)
    assert chk.returncode == 1 and "Traceback" not in chk.stdout + chk.stderr, chk.stdout + chk.stderr
    # the compiler quotes the line in the check table: its subscripts kept, the line not folded
    assert "compile_error" in chk.stdout
    _line_with(chk.stdout, f"for (int i = 1; i < n; ++i) {TYPO}")
    # the same quote where `agent optimize` cannot start from that kernel
    res = agent(broken, "optimize", "kernels/matmul_cpu", "--proposer", "heuristic", "--iters", "1", "--quiet",
                "--runs-dir", str(broken.parent / "other-runs"), env={"COLUMNS": "80"}, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    _line_with(res.stderr, TYPO)
    assert "cannot start" in res.stderr


def test_a_long_message_stays_on_one_line_and_a_path_keeps_its_brackets(broken, tmp_path):
    # a task under a folder whose name looks like a markup tag, at a path longer than 80 columns
    task = tmp_path / "a-folder-with-a-long-name-so-that-the-message-is-long" / "row max [copy]"
    shutil.copytree(broken / "kernels" / "matmul_cpu", task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('device = "cpu"', 'device = "cpu"\ntypo_key = 1'))
    res = agent(broken, "check", str(task), env={"COLUMNS": "80"}, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    line = _line_with(res.stderr, f"{toml}: typo_key: unknown key (a typo?)")
    assert len(line) > 80, line
    _line_with(res.stderr, "task row max [copy] (from the command line)")


@pytest.mark.parametrize("columns", ["80", "60"])
def test_runs_piped_prints_every_run_id_whole_on_one_line(broken, columns):
    ids = sorted(d.name for d in (broken / "runs").iterdir() if (d / "run.json").exists())
    assert len(ids) == 3 and LONG_ID in ids, ids
    res = agent(broken, "runs", env={"COLUMNS": columns}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for run_id in ids:
        line = _line_with(res.stdout, run_id)
        assert "failed" in line, line          # the row whole: its status on the id's line
    # no row is folded: a header, the rule, the title and one line per run
    assert len([ln for ln in res.stdout.splitlines() if ln.strip()]) == 3 + len(ids), res.stdout
