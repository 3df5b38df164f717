"""Scale-out (issue 44, agent/evaluation/executor.py): a sweep on a local dask cluster of two CPU workers, each pinned to a core
of its own, gives the in-process executor's verdicts (a configuration that does not compile, one that segfaults, one
that computes the wrong result, the rest measured); a worker killed while it evaluates is survived (its chunk goes to
a worker again); a chunk whose workers die twice is recorded `lost` and the sweep ends cleanly. Real compiler, real
child processes, real dask processes; the kills are SIGKILLs of the worker processes found with psutil."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from agent.evaluation.executor import Dask, ExecutorError, Local, worker_envs
from agent.sweep.run import sweep
from tests.test_kill_safety import _gone
from tests.test_sweep import planted_task
from tests.userrepo import agent
from tools.task import load_task

pytestmark = pytest.mark.slow

# 7 configurations besides the initial (0, 16, 16, 16): (0,8,16,16) segfaults, (0,16,16,32) does not compile,
# (1,16,16,32) computes a wrong result; the other four are right
HEAD = ("#if LOOP_ORDER == 0 && BLOCK_M == 16 && BLOCK_K == 32\n#error planted: does not compile\n#endif\n"
        "#if LOOP_ORDER == 0 && BLOCK_M == 8 && BLOCK_K == 16\n    { float* volatile p = nullptr; *p = 1.0f; }\n#endif\n")
TAIL = "#if LOOP_ORDER == 1 && BLOCK_M == 16 && BLOCK_K == 32\n    C[0] += 1.0f;\n#endif\n"
SPACE = {"LOOP_ORDER": [0, 1], "BLOCK_M": [8, 16], "BLOCK_N": [16], "BLOCK_K": [16, 32]}


def _proposal(hyp: str, search: str, replace: str) -> dict:
    """What a model answers (the proposal schema): one knob's #define changed in the kernel."""
    return {"hypothesis": hyp, "evidence": [{"metric": "knob", "value": search}],
            "predicted": {"metric": "time", "direction": "down", "speedup": 2.0},
            "edits": [{"file": "matmul.cpp", "search": search, "replace": replace}]}


LOOP = _proposal("Loop order i-k-j: B and C stream along rows", "#define LOOP_ORDER 0", "#define LOOP_ORDER 1")
TILE = _proposal("Taller row blocks: BLOCK_M 32", "#define BLOCK_M 16", "#define BLOCK_M 32")


def _verdicts(points) -> dict[tuple, str]:
    return {tuple(p["knobs"].values()) if isinstance(p, dict) else tuple(p.knobs.values()):
            p["outcome"] if isinstance(p, dict) else p.outcome for p in points}


def test_worker_shares_and_refusals():
    envs = worker_envs(2, False, cpus=[0, 1, 2, 3])
    assert [e["AGENT_CPUS"] for e in envs] == ["0,1", "2,3"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in worker_envs(2, True, gpus=["3", "5"])] == ["3", "5"]
    with pytest.raises(ExecutorError, match="1 GPU"):
        worker_envs(2, True, gpus=["0"])
    with pytest.raises(ExecutorError, match="core"):
        worker_envs(3, False, cpus=[0, 1])
    assert [d.value for d in Local().run(lambda x: x * 2, [1, 2])] == [2, 4]


def test_a_sweep_on_two_dask_workers_gives_the_in_process_verdicts(tmp_path):
    d = planted_task(tmp_path, SPACE, HEAD, TAIL)
    here = sweep(load_task(d), tmp_path / "here", jobs=2, batch=8)
    root = d.parents[1]
    res = agent(root, "sweep", "kernels/matmul_cpu", "--workers", "2", "--batch", "8", "--jobs", "2", "--json",
                timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 local dask workers" in res.stderr
    there = json.loads(res.stdout)
    assert there["workers"] == 2 and there["complete"]
    assert _verdicts(there["points"]) == _verdicts(here.points), (there["points"], here.points)
    assert _verdicts(here.points)[(0, 8, 16, 16)] == "crashed"
    assert _verdicts(here.points)[(1, 16, 16, 32)] == "parity_failed"
    evaluated = [p for p in there["points"] if p["outcome"] != "compile_failed"]
    assert {p["worker"] for p in evaluated} == {"w0 cpu0-0", "w1 cpu1-1"}
    best = [p for p in there["points"] if p["verified"]]
    assert len(best) == 1 and best[0]["outcome"] == "ok" and best[0]["knobs"] == there["verified"]


def _is_batch_child(p: psutil.Process) -> bool:
    """A batch child: started afresh (its command line) or forked by a fork server (the server's command line; its
    working directory, a scratch folder named for it, says what it is: tools/isolation/forkserver.py)."""
    cmd = " ".join(p.cmdline())
    return "tools.judge._batch_child" in cmd or ("tools.isolation.forkserver" in cmd
                                                 and Path(p.cwd()).name.startswith("batch-"))


def _batch_children() -> list[psutil.Process]:
    """The batch children running under this test process (a zombie or a process gone meanwhile is not running)."""
    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and _is_batch_child(p):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _worker_of_a_batch_child(parent: int) -> psutil.Process | None:
    """A dask worker process (under this test's cluster) that has a batch child running (above the fork server
    the child was forked from, where it was)."""
    for p in psutil.Process(parent).children(recursive=True):
        try:
            if _is_batch_child(p):
                w = p.parent()
                while w is not None and "tools.isolation.forkserver" in " ".join(w.cmdline()):
                    w = w.parent()
                return w
        except psutil.Error:
            continue
    return None


def _sweep_killing(tmp_path, kills: int):
    """A sweep on two workers in a thread, while this thread SIGKILLs the worker of the first batch child it sees,
    `kills` times (each time a fresh one: the Nanny restarts the worker)."""
    d = planted_task(tmp_path, {"LOOP_ORDER": [0, 1], "BLOCK_M": [8, 16], "BLOCK_N": [16], "BLOCK_K": [16]})
    ex = Dask(envs=worker_envs(2, False))
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(res=sweep(load_task(d), tmp_path / "sweep", jobs=2, batch=8,
                                                              executor=ex)))
    killed: list[int] = []
    try:
        t.start()
        deadline = time.monotonic() + 300
        while t.is_alive() and len(killed) < kills and time.monotonic() < deadline:
            w = _worker_of_a_batch_child(os.getpid())
            if w is not None and w.pid not in killed:
                os.kill(w.pid, signal.SIGKILL)
                killed.append(w.pid)
            time.sleep(0.05)
        t.join(timeout=300)
        # what the killed workers could not remove (their chunks' folders), in the executor's folder, not in /tmp
        out["left"] = sorted(p.name for p in Path(ex.scratch).glob("w*/agent-*")) if ex.scratch else []
    finally:
        ex.close()
    assert not t.is_alive(), "the sweep did not end"
    return out["res"], killed, (ex.scratch, out["left"])


def test_a_worker_killed_mid_candidate_is_survived(tmp_path):
    res, killed, scratch = _sweep_killing(tmp_path, kills=1)
    assert len(killed) == 1
    assert res.complete and len(res.points) == 3
    assert all(p.outcome == "ok" for p in res.points), [(p.knobs, p.outcome, p.reason) for p in res.points]
    assert res.verified is not None
    assert _gone(_batch_children) == []   # none still runs under this test once the sweep and its cluster are closed
    assert any(n.startswith("agent-chunk-") for n in scratch[1]), scratch   # the killed worker's chunk folder
    assert not Path(scratch[0]).exists()          # removed with the cluster (they were left in /tmp)


def test_a_chunk_whose_workers_die_twice_is_recorded_lost_and_the_sweep_ends(tmp_path):
    res, killed, scratch = _sweep_killing(tmp_path, kills=8)
    assert scratch[1] and not Path(scratch[0]).exists()
    assert res.complete and len(res.points) == 3
    lost = [p for p in res.points if p.outcome == "lost"]
    assert lost and all("worker died" in p.reason and not p.ok for p in lost), [(p.outcome, p.reason) for p in res.points]
    assert len(killed) >= 2


def test_a_chunk_carries_what_a_worker_on_another_host_needs(tmp_path):
    """A chunk for a dask worker carries the task's folder and the libraries as bytes: evaluated after every file it
    came from is gone (a worker on a host that cannot read this one's files), its verdicts stand; the folder it was
    unpacked in is removed after."""
    import shutil
    import tempfile

    from agent.evaluation.executor import pack_folder
    from agent.sweep.batches import Chunk, Shipped, evaluate_chunk
    from tools.build.build import build
    d = planted_task(tmp_path, tail=TAIL.replace("LOOP_ORDER == 1 && BLOCK_M == 16 && BLOCK_K == 32", "1"))
    (d / "build").mkdir()
    (d / "build" / "junk.o").write_bytes(b"x" * 100)
    right = load_task(planted_task(tmp_path / "r"))
    wrong = load_task(d)
    libs = [build(t, tmp_path / f"b{k}").lib_path for k, t in enumerate((right, wrong))]
    data = [open(p, "rb").read() for p in libs]
    shipped = Shipped(task=pack_folder(right.root), baseline=data[0], name="libmatmul_cpu.so")
    chunk = Chunk(libs=["/nonexistent/a.so", "/nonexistent/b.so"], contexts=[None, None], indices=[7, 9], data=data)
    shutil.rmtree(tmp_path / "b0")
    shutil.rmtree(tmp_path / "b1")
    shutil.rmtree(right.root)
    before = set(os.listdir(tempfile.gettempdir()))
    got = dict(evaluate_chunk("/nonexistent/task", "/nonexistent/base.so", 4, chunk, shipped=shipped))
    assert got[7].status.value == "ok" and got[9].status.value == "parity_failed", got
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("agent-chunk-")]


def test_optimize_with_two_candidates_on_two_workers_gives_the_in_process_verdicts(tmp_path):
    """`agent optimize --candidates 2`: the heuristic's two best moves in one iteration, the loop order (3-4x) and a
    smaller tile planted not to compile; here and on two dask workers alike, the loop order is kept, the other is
    recorded compile_failed with its ref, and on the workers the kept one names its worker."""
    from agent.records.schema import Decision
    from agent.records.store import read_iterations
    from tests.userrepo import git
    d = planted_task(tmp_path, head="#if BLOCK_M == 8\n#error planted: does not compile\n#endif\n")
    root = d.parents[1]
    git(root, "add", "kernels")
    git(root, "commit", "-qm", "plant")   # a run starts from the user's HEAD
    runs = {}
    for run, extra in (("here", []), ("there", ["--workers", "2"])):
        res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "heuristic", "--candidates", "2",
                    "--iters", "1", "--target", "100x", "--quiet", "--run-id", run, *extra, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        [rec] = read_iterations(root / "runs" / run)
        runs[run] = rec
        assert rec.decision == Decision.kept and rec.proposal.hypothesis.startswith("LOOP_ORDER 0->1"), rec.reason
        [other] = rec.candidates
        assert other.outcome == "compile_failed" and "planted" in other.reason, other
        assert other.hypothesis.startswith("BLOCK_M 16->8") and other.ref.endswith(f"/{run}/candidate/1.2")
    assert runs["here"].worker == "" and runs["there"].worker.startswith("w")
    shown = agent(root, "show", "there", "--iter", "1")
    assert shown.returncode == 0 and "candidate 2" in shown.stdout and "compile_failed" in shown.stdout, shown.stdout
    bad = agent(root, "optimize", "kernels/matmul_cpu", "--workers", "2")
    assert bad.returncode == 2 and "--candidates K" in bad.stderr


def test_a_models_second_candidate_is_asked_knowing_the_first(tmp_path):
    """With --candidates 2 and a model (the real client, a scripted server), the second request's history lists the
    first proposal as being evaluated beside it; both are evaluated, the faster kept, the other recorded."""
    from agent.records.schema import Decision
    from agent.records.store import read_iterations
    from tests.fake_openai import FakeOpenAI
    from tests.userrepo import configure_llm, make_user_repo

    root = make_user_repo(tmp_path / "user")
    first, second = LOOP, TILE
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url, timeout_s=5.0, max_attempts=2)
        srv.push_proposal(first)
        srv.push_proposal(second)
        res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "llm", "--candidates", "2", "--iters", "1",
                    "--target", "100x", "--quiet", "--run-id", "k2", timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        reqs = srv.chat_requests
    assert len(reqs) == 2
    told = reqs[1].body["messages"][-1]["content"]
    assert "[pending]" in told and first["hypothesis"] in told and "propose another change" in told
    assert "[pending]" not in reqs[0].body["messages"][-1]["content"]
    [rec] = read_iterations(root / "runs" / "k2")
    assert rec.decision == Decision.kept and rec.proposal.hypothesis == first["hypothesis"], rec.reason
    [other] = rec.candidates
    assert other.hypothesis == second["hypothesis"] and other.outcome == "not_faster" and other.speedup
    assert rec.usage.calls == 2


def test_with_at_once_the_models_k_requests_go_out_together(tmp_path):
    """--at-once: the two requests reach the scripted server before either is answered (each answer waits 2 s), each
    told it is one of two and asked for its rank; both proposals are built and evaluated, the faster kept."""
    from agent.records.schema import Decision
    from agent.records.store import read_iterations
    from tests.fake_openai import FakeOpenAI
    from tests.userrepo import configure_llm, make_user_repo

    root = make_user_repo(tmp_path / "user")
    loop, tile = LOOP, TILE
    with FakeOpenAI() as srv:
        configure_llm(root, srv.base_url, timeout_s=10.0, max_attempts=1)
        srv.push_proposal(loop, delay_s=2.0)
        srv.push_proposal(tile, delay_s=2.0)
        res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "llm", "--candidates", "2", "--at-once",
                    "--iters", "1", "--target", "100x", "--quiet", "--run-id", "k2", timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        reqs = srv.chat_requests
    assert len(reqs) == 2 and abs(reqs[1].at - reqs[0].at) < 1.5, [r.at for r in reqs]   # not one after the other
    told = [r.body["messages"][-1]["content"] for r in reqs]
    assert all("asked at the same time" in t for t in told)
    assert {"number 1 in promise" in t for t in told} == {True, False}
    assert not any(loop["hypothesis"] in t or tile["hypothesis"] in t for t in told)   # neither saw the other
    [rec] = read_iterations(root / "runs" / "k2")
    assert rec.decision == Decision.kept and rec.proposal.hypothesis == loop["hypothesis"], rec.reason
    [other] = rec.candidates
    assert other.hypothesis == tile["hypothesis"] and other.outcome == "not_faster"
    assert rec.usage.calls == 2
    bad = agent(root, "optimize", "kernels/matmul_cpu", "--at-once")
    assert bad.returncode == 2 and "--candidates K" in bad.stderr
    bad = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "heuristic", "--candidates", "2", "--at-once")
    assert bad.returncode == 2 and "asks no model" in bad.stderr


def test_the_dask_executor_says_which_worker_runs_each_item():
    """The live view's source: `started(index, worker)` for every item, with the worker that then reports it."""
    ex = Dask(envs=worker_envs(2, False))
    seen: dict[int, set] = {}
    try:
        done = list(ex.run(time.sleep, [1.0, 1.0, 1.0], started=lambda i, w: seen.setdefault(i, set()).add(w)))
    finally:
        ex.close()
    assert sorted(d.index for d in done) == [0, 1, 2] and not any(d.error or d.lost for d in done)
    labels = {"w0 cpu0-0", "w1 cpu1-1"}
    assert set(seen) == {0, 1, 2} and all(ws <= labels for ws in seen.values()), seen
    assert all(d.worker in seen[d.index] for d in done), (done, seen)


def test_what_an_item_puts_on_the_landing_channel_arrives_before_the_item_is_done():
    """Issue 66: a sweep's verdicts as they land, not per chunk at its end: what a dask worker's item puts on the
    executor's landing channel (a distributed.Queue) is handed over here while the item still runs, each with its
    worker's label, in order, and nothing is left behind when the block ends; the local executor's the same."""
    for ex in (Dask(envs=worker_envs(1, False)), Local()):
        heard: list[tuple[float, str, str]] = []
        try:
            with ex.landing(lambda text, worker: heard.append((time.monotonic(), text, worker))) as put:
                talk = lambda n: [put(str(i)) or time.sleep(0.6) for i in range(n)] and n   # noqa: E731 (by value)
                done = list(ex.run(talk, [3]))
                finished = time.monotonic()
        finally:
            ex.close()
        assert [d.value for d in done] == [3] and not any(d.error or d.lost for d in done), done
        assert [t for _, t, _ in heard] == ["0", "1", "2"], heard
        label = worker_envs(1, False)[0]["AGENT_WORKER"] if isinstance(ex, Dask) else "local"
        assert {w for _, _, w in heard} == {label}, heard
        assert heard[0][0] < finished - 1.0, (heard, finished)    # the first text came 1.2 s before the item's end


def test_a_sweep_on_dask_workers_reports_each_configuration_as_it_lands(tmp_path):
    """Issue 66: on dask workers a chunk's configurations are recorded one by one as their batch child writes them
    (the batch's watcher thread puts each on the executor's landing channel from the worker), not all at the chunk's
    end: on each worker the first configuration's point comes well before its chunk's last (at the chunk's end they
    came within milliseconds of each other). Each configuration's screen times it for at least 0.2 s here (its bench
    budget), so a worker's points come at least that far apart; the bound is half of it, for a loaded machine."""
    d = planted_task(tmp_path, SPACE)
    ex = Dask(envs=worker_envs(2, False))
    at: dict[str, list[float]] = {}
    try:
        res = sweep(load_task(d), tmp_path / "sweep", jobs=2, batch=8, executor=ex,
                    progress=lambda n, total, p: at.setdefault(p.worker, []).append(time.monotonic()))
    finally:
        ex.close()
    assert res.complete and all(p.ok for p in res.points), [(p.knobs, p.outcome, p.reason) for p in res.points]
    assert set(at) == {e["AGENT_WORKER"] for e in worker_envs(2, False)}, at
    assert all(len(ts) >= 3 and ts[-1] - ts[0] > 0.1 * (len(ts) - 1) for ts in at.values()), at


def _optimize_killing(tmp_path, kills: int):
    """`agent optimize --candidates 2 --workers 2` (the CLI, its own process) while this test SIGKILLs a dask worker
    that is evaluating a candidate (its fork server has forked the candidate's judge), `kills` times."""
    from tests.userrepo import REPO, git
    d = planted_task(tmp_path)
    root = d.parents[1]
    git(root, "add", "kernels")
    git(root, "commit", "-qm", "plant")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "agent", "optimize", "kernels/matmul_cpu", "--proposer", "heuristic",
                             "--candidates", "2", "--workers", "2", "--iters", "1", "--target", "100x", "--quiet",
                             "--run-id", "k"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and len(killed) < kills and time.monotonic() < deadline:
            for w in psutil.Process(proc.pid).children():
                try:   # a dask worker (spawned by its Nanny) whose fork server has forked a candidate's judge
                    if "spawn_main" in " ".join(w.cmdline()) and w.pid not in killed \
                            and any(len(f.children()) for f in w.children()):
                        os.kill(w.pid, signal.SIGKILL)
                        killed.append(w.pid)
                        break
                except psutil.Error:
                    continue
            time.sleep(0.05)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, killed, root


def test_optimize_survives_a_worker_killed_mid_candidate(tmp_path):
    from agent.records.store import read_iterations
    rc, err, killed, root = _optimize_killing(tmp_path, kills=1)
    assert rc == 0, err[-3000:]
    assert len(killed) == 1
    [rec] = read_iterations(root / "runs" / "k")
    # the killed worker's candidate went to a worker again: both have a verdict, neither is lost
    assert rec.worker.startswith("w") and rec.decision.value == "kept", rec.reason
    assert [c.outcome for c in rec.candidates] != ["lost"], rec.candidates


def test_optimize_records_a_candidate_whose_workers_die_twice_as_lost_and_ends(tmp_path):
    from agent.records.store import read_iterations
    rc, err, killed, root = _optimize_killing(tmp_path, kills=8)
    assert rc == 0, err[-3000:]
    assert len(killed) >= 2
    [rec] = read_iterations(root / "runs" / "k")
    lost = [c for c in rec.candidates if c.outcome == "lost"]
    assert lost or "lost" in rec.reason, (rec.outcome, rec.reason, rec.candidates)
    assert all("worker died" in c.reason for c in lost)


def test_the_live_line_names_each_candidates_worker_then_its_verdict():
    """What the live view shows while an iteration's candidates are on the workers (agent/optimize/candidates.py Board)."""
    from types import SimpleNamespace

    from agent.evaluation.attempt import Attempt
    from agent.optimize.candidates import Board
    from agent.proposal import Proposal
    lines: list[str] = []
    cands = []
    for k, answer in ((1, LOOP), (2, TILE)):
        a = Attempt(iteration=1, run_id="r", started="", parent_sha="")
        a.proposal = Proposal.model_validate(answer)
        cands.append((k, a))
    board = Board(lines.append, cands)
    board.started(0, "w0 gpu0")
    board.started(1, "w1 gpu1")
    assert "on w0 gpu0" in lines[-1] and "on w1 gpu1" in lines[-1] and lines[-1].startswith("1 (")
    bench = SimpleNamespace(speedup_vs_baseline=SimpleNamespace(median=1.085))
    board.finished(0, "w0 gpu0", {"outcome": None, "bench": bench}, "")
    board.finished(1, "lost", None, "its worker died 2 times")
    assert "1.085x on w0 gpu0" in lines[-1] and "lost on lost" in lines[-1], lines[-1]


def _loop_order(wrapper: str) -> str:
    """matmul_cpu's kernel at LOOP_ORDER 1 (the heuristic's i-k-j move, 3-4x over the initial kernel) as
    matmul_once, under the extern "C" matmul `wrapper` given."""
    from tests.userrepo import REPO
    src = (REPO / "kernels" / "matmul_cpu" / "matmul.cpp").read_text()
    return src.replace("#define LOOP_ORDER 0", "#define LOOP_ORDER 1").replace(
        'extern "C" void matmul(', "static void matmul_once(") + wrapper


def test_where_the_fastest_candidate_fails_before_its_keep_the_next_that_passed_is_kept(tmp_path):
    """`--candidates 2`, here: candidate 1 the loop order, wrong where N < 8 (it returns without writing), which only
    a [dims] range shape has, so only the parity before a keep sees it; candidate 2 the same loop order, honest, with
    half its rows computed twice (1.5x its work: about 2-2.7x over the initial kernel, 1.5x behind the first). Both
    pass their first checks; the fastest fails before its keep, and the next goes on and is kept (before: the
    iteration ended parity_failed, the honest candidate recorded as merely slower). The record names candidate 1's
    failure and its ref."""
    from agent.proposal import Edit, PredictedEffect, Proposal
    from agent.records.schema import Decision
    from agent.records.store import read_iterations
    from tests.test_verification import verification_repo
    root = verification_repo(tmp_path / "user")
    head = '\nextern "C" void matmul(const float* A, const float* B, float* C, int M, int N, int K) {\n'
    pred = PredictedEffect(metric="time.median_ms", direction="down", speedup=3.0)
    props = [Proposal(hypothesis=hyp, predicted=pred, edits=[Edit(file="matmul.cpp", content=_loop_order(head + body))])
             for hyp, body in (
                 ("i-k-j loop order, narrow matrices skipped", "    if (N < 8) return;\n    matmul_once(A, B, C, M, N, K);\n}\n"),
                 ("i-k-j loop order, half the rows twice", "    matmul_once(A, B, C, M, N, K);\n"
                  '    asm volatile("" ::: "memory");\n    matmul_once(A, B, C, M / 2, N, K);\n}\n'))]
    (tmp_path / "props.json").write_text(json.dumps([p.model_dump() for p in props]))
    res = agent(root, "optimize", "kernels/matmul_cpu", "--proposer", "replay", "--replay", str(tmp_path / "props.json"),
                "--candidates", "2", "--iters", "1", "--target", "100x", "--quiet", "--run-id", "k2", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    [rec] = read_iterations(root / "runs" / "k2")
    [first] = rec.candidates
    assert rec.decision == Decision.kept and rec.proposal.hypothesis == props[1].hypothesis, \
        (rec.reason, first.outcome, first.reason, first.speedup)
    assert first.candidate == 1 and first.outcome == "parity_failed" and "range " in first.reason, \
        (first.outcome, first.reason, first.speedup, rec.speedup_vs_best)
    assert first.ref.endswith("/k2/candidate/1.1") and first.speedup > rec.speedup_vs_best, (first, rec.speedup_vs_best)
    assert "then, before the keep, ok" in rec.parity.message, rec.parity.message   # the kept one's own range parity
