"""How fast this machine is at the suite's two costs, so that a suite's wall time can be read against the machine it
ran on (issue 61). The same sources took 648-696 s on one 2-core machine and 1425-1514 s on another a day later
(BENCHMARKS.md, the tenth session): a figure against the 10-minute bar says little without this line beside it.

The suite's CPU is mostly these two (census at 43c909b: compilers 952 s of it, 875 s of that in 50 files that
include torch's headers; 139 fork servers importing torch, 315 s):

- the fork server's imports (tools/isolation/forkserver.py WARM, torch among them) in a fresh process, the garbage
  collector off as in the server: their CPU seconds (scripts/judge_costs.py warm_cpu_s, the measure behind its
  0.89 s of the seventh session), the median of three;
- one compile of a small file of the standard library's templates (SOURCE below: maps, strings, streams, random;
  -O3 -march=native; the torch-header files are template code of that kind, 25-55 s each there): its CPU seconds,
  the median of three.

    python scripts/machine_speed.py          # one line: "the fork server's imports X s CPU, a template-heavy g++ -O3 Y s CPU"
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = """#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char** argv) {
    std::map<std::string, std::vector<double>> m;
    std::mt19937 g(argc);
    std::normal_distribution<double> d;
    std::ostringstream os;
    for (int i = 0; i < 100; ++i) { m[std::to_string(i)].push_back(d(g)); os << i; }
    return os.str().size() > 3 ? (int)m.size() : 0;
}
"""


def _child_cpu(argv: list[str], **kw) -> float:
    """CPU seconds (user + system) of one child process and its children, run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True, timeout=600, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_cpu(rounds: int = 3) -> float:
    from judge_costs import warm_cpu_s      # beside this file: `python scripts/machine_speed.py` puts scripts/ first
    return statistics.median(float(warm_cpu_s(collector=False)) for _ in range(rounds))


def compile_cpu(rounds: int = 3) -> float | None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "speed.cpp"
        src.write_text(SOURCE)
        return statistics.median(_child_cpu([cxx, "-O3", "-march=native", "-fPIC", "-std=c++17", "-c", str(src),
                                             "-o", str(Path(tmp) / "m.o")]) for _ in range(rounds))


def main() -> int:
    imp, cc = import_cpu(), compile_cpu()
    print(f"the fork server's imports {imp:.2f} s CPU, a template-heavy g++ -O3 "
          + (f"{cc:.2f} s CPU" if cc is not None else "(no C++ compiler)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
