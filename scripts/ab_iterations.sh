#!/usr/bin/env bash
# Seconds per iteration, two commits A/B on the CPU task: each commit in its own git worktree and user
# repository (tests/userrepo.py), `agent optimize kernels/matmul_cpu --iters 12 --target 100x
# --proposer heuristic`, alternated old/new three times; prints the median wall of the rejected
# iterations and every kept one's, from the records. Run with the project's environment active.
#   bash scripts/ab_iterations.sh OLD_REV NEW_REV
set -u
OLD=$1; NEW=$2
here=$(cd "$(dirname "$0")/.." && pwd)
rm -rf /tmp/ab; mkdir -p /tmp/ab
for v in old new; do
  rev=$OLD; [ $v = new ] && rev=$NEW
  git -C "$here" worktree add -f /tmp/ab/$v-src $rev --detach -q
done
for r in 1 2 3; do
  for v in old new; do
    src=/tmp/ab/$v-src; repo=/tmp/ab/$v-repo-$r
    (cd $src && PYTHONPATH=$src python3 -c "from tests.userrepo import make_user_repo; from pathlib import Path; make_user_repo(Path('$repo'))")
    (cd $repo && PYTHONPATH=$src timeout 600 python3 -m agent optimize kernels/matmul_cpu --iters 12 --target 100x --proposer heuristic --quiet > /tmp/ab/$v-$r.log 2>&1)
    run=$(ls -d $repo/runs/*/ | head -1)
    PYTHONPATH=$here python3 - "$run" "$v" "$r" <<'PY'
import sys, statistics
from pathlib import Path
from agent.records.store import read_iterations
recs = read_iterations(Path(sys.argv[1]))
rej = [r.wall_s for r in recs if r.decision.value != "kept" and r.bench is not None]
kept = [round(r.wall_s, 2) for r in recs if r.decision.value == "kept"]
print(sys.argv[2], "round", sys.argv[3], "rejected median %.2f (%d)" % (statistics.median(rej), len(rej)) if rej else "-", "kept", kept, flush=True)
PY
  done
done
for v in old new; do git -C "$here" worktree remove --force /tmp/ab/$v-src; done
git -C "$here" worktree prune
