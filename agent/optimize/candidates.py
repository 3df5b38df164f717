"""K candidates per iteration (issue 44): `agent optimize --candidates K [--workers N | --scheduler ADDRESS]`.

The proposer is asked K times; each request is told the proposals before it (a model sees them in the history as
being evaluated beside its own; the heuristic counts their configurations as measured), so the K are different moves.
Each is applied, committed and built here in turn (builds share this host's CPUs); its library and its task folder are
taken, its commit kept under refs/agent/RUN/candidate/N.K, and the branch goes back to the best. The K are then
evaluated at once on the executor (agent/evaluation/executor.py), each in its own judge and host, on its own worker and GPU: the
static launch check, quick parity and the bench against the best, timed side by side with the best on that worker. The
fastest that passed, by that speedup, becomes the iteration's candidate: the branch moves to its commit and the loop
confirms it (the confirmation bench and the parity quick left out: the other seeds, the [dims] extremes), checks its
real launch and keeps it as any candidate. Where that fails, the next fastest that passed and that the keep rule could
keep goes on the same way (settle), so the fastest that passes everything is the one kept. The others are in the
record (`candidates`: outcome, reason, speedup, worker, ref). With K > 1 a failure is one candidate of K: no repairs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from agent.evaluation.attempt import Attempt
from agent.optimize.best import dump_results
from agent.evaluation.ended import BenchFailed, IterationEnded
from agent.evaluation.evaluate import Evaluator, snapshot_lib
from agent.evaluation.executor import Executor, Local, make_executor, pack_folder, unpack_folder
from agent.proposers.base import HistoryItem
from agent.records.schema import CandidateTried, StageTimes, Usage, now
from tools.backends.device import task_limits
from tools.measure.bench import never_kept
from tools.task import load_task


def evaluate_one(item: dict) -> dict:
    """On a worker: the candidate's task folder and library, and the best's library, unpacked in a folder of its own;
    launch check, quick parity and the bench against the best in one judge child (Evaluator.evaluate_candidate)."""
    with tempfile.TemporaryDirectory(prefix="agent-cand-") as tmp:
        root = unpack_folder(item["task"], Path(tmp) / "task")
        for part in ("cand", "best"):
            (Path(tmp) / part).mkdir()
            (Path(tmp) / part / item["name"]).write_bytes(item[part])
        task = load_task(root)
        ev = Evaluator(task, Path(tmp) / "build", task_limits(task), scratch_root=Path(tmp) / "scratch")
        ev.budgets, ev.keep_gain = item["budgets"], item.get("keep_gain")
        return judged(ev, Path(tmp) / "cand" / item["name"], Path(tmp) / "best" / item["name"], item["context"])


def judged(ev: Evaluator, lib: Path, best: Path, context: dict | None) -> dict:
    a = Attempt(iteration=0, run_id="", started="", parent_sha="")
    times, out = StageTimes(), {"outcome": None, "reason": "", "kind": None}
    try:
        ev.evaluate_candidate(lib, best, times, into=a, parity_extent="quick", launch_context=context)
    except IterationEnded as e:
        e.fill(a)
        out = {"outcome": e.outcome.value, "reason": e.reason, "kind": type(e)}
    return {**out, "launch": a.launch, "parity": a.parity, "bench": a.bench, "times": times,
            "dropped": a.output_dropped_bytes}


RANK = ("you are proposal {k} of {K} asked at the same time, each from the same facts: propose the change you rank "
        "number {k} in promise (1 = the most promising), so that the {K} differ")


class Prefetched:
    """A candidate's proposer when the K requests went out at once: its answer first (or its error), then the proposer
    itself (a patch repair continues the candidate's own conversation)."""

    def __init__(self, proposer, first: tuple):
        self.p, self.first = proposer, first
        self.name, self.can_repair = proposer.name, proposer.can_repair

    def propose(self, ctx):
        if self.first is None:
            return self.p.propose(ctx)
        got, err, _ = self.first
        self.first = None
        if err is not None:
            raise err
        return got

    def skip_to(self, n: int) -> None:
        self.p.skip_to(n)


class Board:
    """The live view's line while the candidates are on the workers: each one's worker and where it stands."""

    def __init__(self, show, cands: list[tuple[int, Attempt]]):
        self.show = show
        self.names = [f"{k} ({a.proposal.summary()[:24] if a.proposal else '?'})" for k, a in cands]
        self.state = ["queued"] * len(cands)

    def _show(self) -> None:
        self.show("; ".join(f"{n}: {s}" for n, s in zip(self.names, self.state)))

    def started(self, index: int, worker: str) -> None:
        self.state[index] = f"on {worker}"
        self._show()

    def finished(self, index: int, worker: str, value: dict | None, lost: str) -> None:
        b = (value or {}).get("bench")
        ci = getattr(b, "speedup_vs_baseline", None) if b is not None else None
        verdict = "lost" if lost else (value or {}).get("outcome") or (f"{ci.median:.3f}x" if ci else "passed")
        self.state[index] = f"{verdict} on {worker}"
        self._show()


class Candidates:
    def __init__(self, loop, executor: Executor):
        self.loop, self.ex = loop, executor
        self.prepared: list[tuple[Attempt, dict | None, IterationEnded | None]] = []
        self.queue: list[int] = []      # the candidates that passed and could be kept, next first (_choose)
        self.current: int | None = None
        self.workers: dict[int, str] = {}

    def settle(self, i: int, d: Path, a: Attempt, settle) -> None:
        """The K candidates (run), then the loop's `settle(i, a, lib)` (confirm, real launch) on the fastest that
        passed; where that fails, on the next one the keep rule could keep, the one that failed recorded with its
        outcome. Raises the last failure where none is left."""
        lib = self.run(i, d, a)
        while True:
            try:
                return settle(i, a, lib)
            except IterationEnded as e:
                if not self.queue:
                    raise
                lib = self.runner_up(i, d, a, e)

    def runner_up(self, i: int, d: Path, a: Attempt, failed: IterationEnded) -> Path:
        """The candidate that just failed to `settle` goes into the record with its outcome; the next in the queue
        becomes the iteration's candidate (the branch at its commit); its library's path is returned."""
        lp, n = self.loop, self.queue.pop(0)
        failed.fill(a)
        ci = a.bench.speedup_vs_baseline if a.bench is not None else None
        gone = self.current
        a.candidates = sorted([t for t in a.candidates if t.candidate != n + 1] + [CandidateTried(
            candidate=gone + 1, hypothesis=a.proposal.hypothesis if a.proposal else "", outcome=failed.outcome.value,
            reason=f"the fastest that passed its first checks, then: {failed.reason}", speedup=ci.median if ci else None,
            patch=a.patch, ref=self.prepared[gone][0].rejected_ref, worker=self.workers.get(gone, ""),
            usage=self.prepared[gone][0].usage)], key=lambda t: t.candidate)
        lp.stage(i, f"candidate {gone + 1} failed ({failed.outcome.value}): candidate {n + 1} goes on")
        a.confirm, a.confirm_error, spent = None, None, a.times
        lib = self._take(d, a, n)
        a.times = StageTimes(**{f: getattr(spent, f) + getattr(a.times, f) for f in StageTimes.model_fields})
        return lib

    def _take(self, d: Path, a: Attempt, n: int) -> Path:
        """Candidate n becomes the iteration's attempt: its results, its commit on the branch, its library."""
        lp, w = self.loop, self.prepared[n][0]
        for f in ("proposal", "patch", "patch_message", "build", "launch", "parity", "bench", "output_dropped_bytes"):
            setattr(a, f, getattr(w, f))
        a.times, a.commit_sha, a.worker, self.current = w.times, w.commit_sha, self.workers.get(n, ""), n
        lp.git.reset_to(w.commit_sha)
        lp.reload_task()
        lib = d / lp.best.lib.name
        shutil.copy2(d / f"candidate-{n + 1}" / lp.best.lib.name, lib)
        dump_results(d, a)
        return lib

    @classmethod
    def for_loop(cls, loop) -> "Candidates":
        """With the executor the run asked for (--workers N, --scheduler ADDRESS; else here)."""
        return cls(loop, make_executor(loop.cfg.workers, loop.cfg.scheduler, loop.task.backend.gpu))

    def ask_at_once(self, i: int, d: Path) -> dict[int, tuple]:
        """--at-once: the K requests together (a thread each), each told it is one of K and asked for its rank.
        {k: (the proposer's answer or None, its error or None, seconds)}."""
        from concurrent.futures import ThreadPoolExecutor

        from agent.proposers.base import ProposerError
        from agent.optimize.propose import context
        lp, n = self.loop, self.loop.cfg.candidates

        def ask(k: int) -> tuple:
            dk = d / f"candidate-{k}"
            dk.mkdir(parents=True, exist_ok=True)
            c = context(lp.task, i, dk, lp.records, lp.state, lp.best.profile, None, None, lp.run_end)
            c.history.append(HistoryItem(iteration=i, hypothesis=f"{n - 1} other proposal(s) asked with yours",
                                         outcome="pending", reason=RANK.format(k=k, K=n)))
            t0 = time.monotonic()
            try:
                return k, (lp.proposer.propose(c), None, time.monotonic() - t0)
            except ProposerError as e:
                return k, (None, e, time.monotonic() - t0)
        lp.stage(i, f"propose {n} at once")
        with ThreadPoolExecutor(n) as pool:
            return dict(pool.map(ask, range(1, n + 1)))

    def prepare(self, i: int, d: Path, k: int, earlier: list[Attempt],
                first: tuple | None = None) -> tuple[Attempt, dict | None, IterationEnded | None]:
        """Propose (told the earlier ones; with `first`, the answer asked at once with the others), apply, commit,
        build candidate k; its commit kept under a ref and the branch back at the best. Returns its attempt, what a
        worker needs to evaluate it (None: it failed here) and why."""
        from agent.optimize.propose import context, propose_and_apply
        lp = self.loop
        ak = Attempt(iteration=i, run_id=lp.cfg.run_id, started=now(), parent_sha=lp.state.best_sha or "")
        dk = d / f"candidate-{k}"
        dk.mkdir(parents=True, exist_ok=True)

        def ctx(text, kind):
            c = context(lp.task, i, dk, lp.records, lp.state, lp.best.profile, text, kind, lp.run_end)
            c.measured_knobs += [e.proposal.knobs for e in earlier if e.proposal and e.proposal.knobs]
            c.history += [HistoryItem(iteration=i, hypothesis=e.proposal.hypothesis, outcome="pending",
                                      reason="being evaluated beside your proposal in this iteration: propose another "
                                             "change") for e in earlier if e.proposal]
            return c
        try:
            proposer = Prefetched(lp.proposer, first) if first else lp.proposer
            proposal, ak.patch_message = propose_and_apply(
                proposer, ctx, lp.task_dir(), lp.task.spec.editable, lambda: lp.git.reset_to(lp.state.best_sha),
                lambda: lp.stage(i, f"propose {k}/{lp.cfg.candidates}"), (None, None), ak, dk)
            ak.times.propose += first[2] if first else 0.0
            lp.commit(dk, ak)
            lp.stage(i, f"build {k}/{lp.cfg.candidates}", proposal.summary())
            ak.build = lp.evaluator.build(ak.times)
            (dk / "build.log").write_text(ak.build.log)
            lib = snapshot_lib(ak.build.lib_path, dk / lp.best.lib.name)
            item = {"lib": lib, "context": lp.evaluator.launch_context(ak.build, lp.best.launch)}
            if not isinstance(self.ex, Local):   # a worker, maybe on another host: the files as bytes
                item.update(task=pack_folder(lp.task_dir()), cand=lib.read_bytes(), best=lp.best.lib.read_bytes(),
                            name=lp.best.lib.name, budgets=lp.evaluator.budgets, keep_gain=lp.evaluator.keep_gain)
            return ak, item, None
        except IterationEnded as e:
            e.fill(ak)
            return ak, None, e
        finally:
            if ak.commit_sha:
                ak.rejected_ref = lp.git.keep_ref("candidate", f"{i}.{k}", ak.commit_sha)
            lp.git.reset_to(lp.state.best_sha)
            lp.reload_task()

    def run(self, i: int, d: Path, a: Attempt) -> Path:
        """The K candidates; `a` becomes the fastest that passed (the branch at its commit) and its library is
        returned for the loop to confirm and keep. Raises the first failure's kind where none passed."""
        lp, k_all = self.loop, self.loop.cfg.candidates
        prepared: list[tuple[Attempt, dict | None, IterationEnded | None]] = []
        firsts = self.ask_at_once(i, d) if lp.cfg.at_once and getattr(lp.proposer, "at_once", False) else {}
        for k in range(1, k_all + 1):
            prepared.append(self.prepare(i, d, k, [p[0] for p in prepared], firsts.get(k)))
        todo = [(n, item) for n, (_, item, _) in enumerate(prepared) if item is not None]
        lp.stage(i, f"check+bench {len(todo)} on {self.ex.where}")
        results: dict[int, dict] = {}
        workers: dict[int, str] = {}
        if isinstance(self.ex, Local):   # here: the loop's own evaluator (it also watches the user's checkout)
            for n, item in todo:
                results[n] = judged(lp.evaluator, item["lib"], lp.best.lib, item["context"])
        else:
            items = [{k: v for k, v in item.items() if k != "lib"} for _, item in todo]
            board = Board(lambda line: lp.stage(i, line), [(n + 1, prepared[n][0]) for n, _ in todo])
            for done in self.ex.run(evaluate_one, items, started=board.started):
                n = todo[done.index][0]
                workers[n] = done.worker
                board.finished(done.index, done.worker, done.value, done.lost)
                results[n] = done.value if done.value is not None else {   # its worker died twice, or raised
                    "outcome": "lost" if done.lost else "bench_failed", "kind": BenchFailed,
                    "reason": done.lost or f"the worker raised {done.error!r}",
                    "launch": None, "parity": None, "bench": None, "times": StageTimes(), "dropped": 0}
        return self._choose(i, d, a, prepared, results, workers, k_all)

    def _choose(self, i, d, a, prepared, results, workers, k_all) -> Path:
        lp = self.loop
        for n, r in results.items():
            ak = prepared[n][0]
            ak.launch, ak.parity, ak.bench, ak.output_dropped_bytes = r["launch"], r["parity"], r["bench"], r["dropped"]
            for f in ("launch", "parity", "bench"):
                setattr(ak.times, f, getattr(ak.times, f) + getattr(r["times"], f))
        passed = [n for n, r in results.items() if r["outcome"] is None and r["bench"] is not None
                  and r["bench"].speedup_vs_baseline is not None]
        passed.sort(key=lambda n: -results[n]["bench"].speedup_vs_baseline.median)
        win = passed[0] if passed else None
        self.prepared, self.workers = prepared, workers   # the runners-up the rule could keep, fastest first (settle)
        self.queue = [n for n in passed[1:]
                      if never_kept(results[n]["bench"].speedup_vs_baseline, lp.cfg.min_gain) is None]
        tried = []
        for n, (ak, _, err) in enumerate(prepared):
            if n == win:
                continue
            r = results.get(n, {})
            ci = ak.bench.speedup_vs_baseline if ak.bench is not None else None
            outcome = err.outcome.value if err else r.get("outcome") or "not_faster"
            reason = err.reason if err else r.get("reason") or (
                f"passed, {ci.median:.3f}x over the best; candidate {win + 1} was faster" if ci and win is not None else "")
            tried.append(CandidateTried(candidate=n + 1, hypothesis=ak.proposal.hypothesis if ak.proposal else "",
                                        outcome=outcome, reason=reason, speedup=ci.median if ci else None,
                                        patch=ak.patch, ref=ak.rejected_ref, worker=workers.get(n, ""), usage=ak.usage))
        a.candidates = tried
        a.usage = sum((ak.usage for ak, _, _ in prepared), Usage())
        if win is None:
            first = next((err or results[n] for n, (_, _, err) in enumerate(prepared)), None)
            why = "; ".join(f"{t.candidate}: {t.outcome}" for t in tried)
            w = prepared[0][0]
            for f in ("proposal", "patch", "build", "launch", "parity", "bench", "commit_sha"):
                setattr(a, f, getattr(w, f))
            kind = first.__class__ if isinstance(first, IterationEnded) else (first.get("kind") or IterationEnded)
            raise kind(f"none of the {k_all} candidates passed ({why})")
        return self._take(d, a, win)
