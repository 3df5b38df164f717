"""tests/userrepo.py shared_by_workers: what several pytest-xdist workers' tests read is made once for the run (the
trust run, tests/test_trust.py). Driven here as two workers would drive it: two processes that ask at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ASK = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.userrepo import shared_by_workers

    class Factory:                       # what pytest's tmp_path_factory gives a worker: its own folder in the run's
        def getbasetemp(self):
            return Path({run!r}) / os.environ["PYTEST_XDIST_WORKER"]

    def make(folder):
        (folder / "made-by").write_text(os.environ["PYTEST_XDIST_WORKER"])
        time.sleep(0.5)                  # long enough for the other worker to ask meanwhile
        return {{"folder": str(folder), "by": os.environ["PYTEST_XDIST_WORKER"]}}

    print(json.dumps(shared_by_workers(Factory(), "thing", make)))
""")


def _ask(tmp_path: Path, worker: str) -> subprocess.Popen:
    (tmp_path / worker).mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", ASK.format(repo=str(REPO), run=str(tmp_path))],
                            env={**os.environ, "PYTEST_XDIST_WORKER": worker}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_workers_asking_at_once_get_one_thing_made_once(tmp_path):
    procs = [_ask(tmp_path, w) for w in ("gw0", "gw1")]
    got = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        got.append(json.loads(out.splitlines()[-1]))
    assert got[0] == got[1], got                                   # the same value, made by one of them
    made = Path(got[0]["folder"])
    assert made.parent == tmp_path and (made / "made-by").read_text() == got[0]["by"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("shared-")) == \
        ["shared-thing", "shared-thing.lock", "shared-thing.pickle"]
    # a later ask reads what was kept, and a part left by a worker that died making it is made again
    again = _ask(tmp_path, "gw2")
    assert json.loads(again.communicate(timeout=60)[0].splitlines()[-1]) == got[0]
    (tmp_path / "shared-thing.pickle").unlink()
    (made / "half-written").write_text("x")
    redo = _ask(tmp_path, "gw3")
    assert json.loads(redo.communicate(timeout=60)[0].splitlines()[-1])["by"] == "gw3"
    assert not (made / "half-written").exists()
