"""`agent show RUN --iter N --transcript` (agent/review/transcript.py): docs/TRANSCRIPT.md is the command's output on
the records of a real GPU run kept in tests/fixtures/repair_run/ (scripts/device/repair_softmax.py on an H100); the
doc's claim is checked by rendering them again through the CLI. A run of the CI's own (tests/test_llm_repair.py) is
rendered there too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "<!-- everything below this line is the command's output -->\n"


def _show(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", "show", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_docs_transcript_is_the_commands_output_on_the_runs_records(tmp_path):
    run = tmp_path / "repair"
    shutil.copytree(REPO / "tests" / "fixtures" / "repair_run", run)
    res = _show(str(run), "--iter", "1", "--transcript")
    assert res.returncode == 0, res.stderr
    doc = (REPO / "docs" / "TRANSCRIPT.md").read_text()
    assert MARK in doc
    assert res.stdout == doc.split(MARK, 1)[1], "docs/TRANSCRIPT.md differs from the command's output: regenerate it"
    out = res.stdout
    # every message once, in order: the system prompt once, four calls, each repair's request after the reply it answers
    assert out.count("### system") == 1 and [f"## Call {k}" in out for k in (1, 2, 3, 4)] == [True] * 4
    assert out.index("did not compile") < out.index("refused by the launch (CTA) safety check") < out.index(
        "computes the wrong result") < out.index("## The verdict")
    assert "| 3 | parity_failed |" in out and "**kept**" in out
    assert "/tmp/" not in out.split("## Call 2", 1)[1].split("### the model's reply", 1)[0]   # no scratch paths


def test_a_transcript_needs_an_iteration_and_names_what_is_missing(tmp_path):
    run = tmp_path / "repair"
    shutil.copytree(REPO / "tests" / "fixtures" / "repair_run", run)
    res = _show(str(run), "--transcript")
    assert res.returncode == 2 and "--iter N" in res.stderr and "Traceback" not in res.stderr
    for p in (run / "iter-1").glob("prompt-*.json"):
        p.unlink()
    res = _show(str(run), "--iter", "1", "--transcript")
    assert res.returncode == 2 and "no saved prompts" in res.stderr and "Traceback" not in res.stderr
