"""One build step that pyproject.toml cannot say: the wheel carries the top-level prompts/ and AGENT.md.

They live at the top of the tree, where the design card puts them and a reader looks for them, as the
only copies. A wheel has no top level of its own, so build_py copies them into the package, under
agent/_shipped/, where agent.llm.prompts reads them through importlib.resources. An editable install and a
plain checkout read the top-level files in place (nothing is copied, so nothing can go stale).
Everything else about the package is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("AGENT.md", "prompts")     # agent.llm.prompts.SHIPPED names the same two


class BuildPyWithPrompts(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "agent" / "_shipped"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copy2(ROOT / "AGENT.md", dest / "AGENT.md")
        (dest / "prompts").mkdir()
        for f in sorted((ROOT / "prompts").glob("*.md")):
            shutil.copy2(f, dest / "prompts" / f.name)


setup(cmdclass={"build_py": BuildPyWithPrompts})
