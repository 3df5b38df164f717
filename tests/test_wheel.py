"""The package as `pip install .` gives it: the top-level prompts/ and AGENT.md are the only copies in the
tree, and a wheel built from the tree carries them (setup.py copies them under agent/_shipped/), so an
install that is not editable renders the same prompts from its own files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from agent.records.schema import Decision
from agent.records.store import read_iterations
from tests.fake_openai import FakeOpenAI
from tests.test_llm_loop import GOOD
from tests.userrepo import configure_llm, make_user_repo

REPO = Path(__file__).resolve().parent.parent
TREE = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "AGENT.md", "agent", "tools", "prompts")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree (the build writes build/ and *.egg-info where it runs, and the
    checkout is not the build's to write), with the setuptools of this environment as pyproject asks."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in TREE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (built,) = (tmp / "dist").glob("kernel_agent-*.whl")
    return built


def test_the_top_level_holds_the_prompts_and_the_rules_and_the_package_none():
    assert (REPO / "AGENT.md").is_file() and sorted((REPO / "prompts").glob("*.md"))
    assert not (REPO / "agent" / "prompts").exists() and not (REPO / "agent" / "AGENT.md").exists()
    assert not (REPO / "agent" / "_shipped").exists()


def test_a_wheel_holds_every_prompt_and_the_rules_byte_for_byte(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        expected = {f"agent/_shipped/prompts/{p.name}": p for p in (REPO / "prompts").glob("*.md")}
        expected["agent/_shipped/AGENT.md"] = REPO / "AGENT.md"
        for arc, path in expected.items():
            assert arc in names, f"{arc} is not in {wheel.name}"
            assert z.read(arc) == path.read_bytes(), arc
        # nothing at the wheel's root but the two packages and the metadata: a top-level prompts/ there
        # would land in site-packages beside every other project's files
        assert {n.split("/")[0] for n in names} <= {"agent", "tools", wheel.name.split("-")[0] + "-0.1.0.dist-info"}


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new virtual environment holding only the wheel; the dependencies (torch, openai, ...) are this
    environment's, reached through a .pth file (paths only: the editable install's finder there is not run,
    so `agent` can come only from the wheel)."""
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = [p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() not in (REPO, REPO / "tests")]
    (site / "outer-deps.pth").write_text("\n".join(deps) + "\n")
    return env_dir


@pytest.mark.slow
def test_agent_optimize_from_the_wheel_renders_its_prompts_from_the_installed_package(wheel, tmp_path):
    env_dir = _fresh_venv(tmp_path, wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENT_BASE_URL", "AGENT_MODEL",
                                                           "OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_API_KEY")}
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import agent.llm.prompts as p; print(p.PROMPTS_DIR); print(p.AGENT_RULES)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(w).is_relative_to(env_dir) and "_shipped" in w for w in where), where
    root = make_user_repo(tmp_path / "user")
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url)
        srv.push_proposal(GOOD)
        res = subprocess.run([str(env_dir / "bin" / "agent"), "optimize", "kernels/matmul_cpu", "--target", "100x",
                              "--iters", "1", "--quiet"], cwd=root, env=env, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stderr + res.stdout
        (req,) = srv.chat_requests
    system, user = req.body["messages"][0]["content"], req.body["messages"][-1]["content"]
    from agent.llm.prompts import rules_for
    rules = rules_for((REPO / "AGENT.md").read_text(), "cpu")
    assert rules in system                                   # AGENT.md's CPU rules, whole, in the system prompt
    # the iteration prompt's fixed text (each line of the template without a placeholder) is in the request
    fixed = [ln for ln in (REPO / "prompts" / "iteration.md").read_text().splitlines() if ln.strip() and "{{" not in ln]
    assert fixed and all(ln in json.dumps(user) or ln in user for ln in fixed)
    run = next(p for p in (root / "runs").iterdir() if (p / "run.json").exists())
    assert [r.decision for r in read_iterations(run)] == [Decision.kept]
