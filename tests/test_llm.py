"""The LLM proposer through the real openai client against tests/fake_openai.py (a real local server)."""

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from agent.llm.costs import estimate_tokens
from agent.optimize.patch import PatchStatus, apply_edits
from agent.proposers.base import BudgetExhausted, Context, HistoryItem, ProposalFailed
from agent.llm.proposer import LLMProposer, LLMUnusable
from agent.llm.settings import LLMSettings, Price
from tests.fake_openai import FakeOpenAI, error_body
from tools.task import load_task

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-test-SECRET-0123456789"

GOOD = {
    "hypothesis": "The i-j-k order reads B down a column (stride N floats): switching to i-k-j reads B and C along rows.",
    "evidence": [{"metric": "source.loop_order", "value": "0 (i-j-k)"}],
    "predicted": {"metric": "time", "direction": "down", "speedup": 2.0},
    "edits": [{"file": "matmul.cpp", "search": "#define LOOP_ORDER 0", "replace": "#define LOOP_ORDER 1",
               "content": None}],
}


@pytest.fixture
def srv():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def waits(monkeypatch):
    """The waits the retry machinery asked for, in order: tenacity's (its backoff, or a server's Retry-After) and the
    pause between two failed calls (agent/llm/proposer.py), each still slept. What the retries did is checked on
    these, not on the wall clock, which a loaded machine stretches."""
    asked, real = [], time.sleep

    def sleep(seconds):
        if sys._getframe(1).f_globals.get("__name__") in ("tenacity.nap", "agent.llm.proposer"):
            asked.append(seconds)
        real(seconds)
    monkeypatch.setattr(time, "sleep", sleep)
    return asked


@pytest.fixture
def task(tmp_path):
    root = tmp_path / "matmul_cpu"
    shutil.copytree(REPO / "kernels" / "matmul_cpu", root)
    return load_task(root)


def settings(srv, **kw):
    base = dict(model="fake-model", base_url=srv.base_url, api_key=KEY, timeout_s=5, max_attempts=3,
                backoff_base_s=0.01, backoff_max_s=0.05)
    base.update(kw)
    return LLMSettings(**base)


def context(task, tmp_path, iteration=1, **kw):
    d = tmp_path / "runs" / "R" / f"iter-{iteration}"
    sources = {f: (task.root / f).read_text() for f in task.spec.editable}
    return Context(task=task, iteration=iteration, sources=sources, profile=None, knobs=task.read_knobs(),
                   iter_dir=str(d), **kw)


def user_text(req) -> str:
    return req.body["messages"][-1]["content"]


def test_good_proposal_parsed_with_json_schema_and_saved_without_key(srv, task, tmp_path):
    srv.push_proposal(GOOD, prompt_tokens=1200, completion_tokens=300)
    ctx = context(task, tmp_path)
    proposal, usage = LLMProposer(settings(srv), task).propose(ctx)

    assert proposal.edits[0].replace == "#define LOOP_ORDER 1"
    assert proposal.predicted.speedup == 2.0 and proposal.proposer == "llm:fake-model"
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 1200, 300)
    [req] = srv.chat_requests
    assert req.headers["authorization"] == f"Bearer {KEY}"
    fmt = req.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "proposal"
    assert set(fmt["json_schema"]["schema"]["required"]) == {"hypothesis", "evidence", "predicted", "edits"}
    system, user = req.body["messages"]
    assert system["role"] == "system" and "One hypothesis per iteration" in system["content"]   # AGENT.md
    assert "additionalProperties" not in json.dumps(req.body["messages"])   # the schema once: in the response format
    assert "#define LOOP_ORDER 0" in user["content"] and "BLOCK_M = 16 (allowed: 8, 16, 32, 64)" in user["content"]

    saved = sorted(p.name for p in Path(ctx.iter_dir).iterdir())
    assert saved == ["prompt-1.json", "response-1.json"]
    assert json.loads((Path(ctx.iter_dir) / "prompt-1.json").read_text())["messages"] == req.body["messages"]
    body = json.loads((Path(ctx.iter_dir) / "response-1.json").read_text())["body"]
    assert json.loads(body["choices"][0]["message"]["content"]) == GOOD
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert KEY not in p.read_text(errors="replace"), p


def test_malformed_json_then_valid_repair(srv, task, tmp_path):
    srv.push_text('{"hypothesis": "tile it", "edits": [ oops')
    srv.push_text("Here it is:\n```json\n" + json.dumps(GOOD) + "\n```\n")
    proposal, usage = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert proposal.hypothesis == GOOD["hypothesis"] and usage.calls == 2
    second = srv.chat_requests[1].body["messages"]
    assert second[-2] == {"role": "assistant", "content": '{"hypothesis": "tile it", "edits": [ oops'}
    assert "not valid JSON" in second[-1]["content"]


def test_malformed_twice_fails_when_one_repair_is_allowed(srv, task, tmp_path):
    srv.push_text("I think we should tile the loops.")
    srv.push_text("{not json}")
    with pytest.raises(ProposalFailed, match="no valid proposal after 2 replies") as e:
        LLMProposer(settings(srv, schema_repairs=1), task).propose(context(task, tmp_path))
    assert len(srv.chat_requests) == 2 and e.value.usage.calls == 2


def test_malformed_until_repairs_spent(srv, task, tmp_path):
    for _ in range(3):
        srv.push_text("no json here")
    with pytest.raises(ProposalFailed, match="after 3 replies"):
        LLMProposer(settings(srv), task).propose(context(task, tmp_path))   # default: 2 repairs
    assert len(srv.chat_requests) == 3


def test_schema_violation_gets_the_exact_pydantic_error(srv, task, tmp_path):
    bad = dict(GOOD, predicted={"metric": "time", "direction": "sideways", "speedup": 1.2})
    bad["edits"] = [{"file": "matmul.cpp", "search": "x", "replace": None, "content": None}]
    srv.push_proposal(bad)
    srv.push_proposal(GOOD)
    proposal, _ = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert proposal.edits[0].search == "#define LOOP_ORDER 0"
    follow_up = user_text(srv.chat_requests[1])
    assert "- predicted.direction: Input should be 'up' or 'down'" in follow_up
    assert ("- edits.0: Value error, an edit is either search+replace or content (a whole-file rewrite), "
            "not both or neither") in follow_up


def test_rate_limit_then_success_is_retried(srv, task, tmp_path):
    srv.push(429, error_body("Rate limit reached", "rate_limit_error"))
    srv.push_proposal(GOOD)
    proposal, usage = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert proposal.hypothesis == GOOD["hypothesis"]
    assert len(srv.chat_requests) == 2 and usage.calls == 1


def test_server_errors_until_retries_are_spent_do_not_spend_the_proposal(srv, task, tmp_path, waits):
    """Issue 43: a call the endpoint fails after all its retries (3 x 500) is made again after backoff_max_s: the
    outage does not cost the iteration, the proposal comes when the endpoint is back."""
    for _ in range(3):
        srv.push(500, error_body("upstream exploded", "server_error"))
    srv.push_proposal(GOOD)
    proposal, usage = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert proposal.hypothesis == GOOD["hypothesis"] and usage.calls == 1
    assert len(srv.chat_requests) == 4
    # two backoffs within the first call (3 attempts), each at most backoff_max_s; then the pause of backoff_max_s
    # before the call again
    *backoffs, pause = waits
    assert len(backoffs) == 2 and all(0 <= w <= 0.05 for w in backoffs) and pause == 0.05, waits
    saved = json.loads((tmp_path / "runs/R/iter-1/response-1.json").read_text())
    assert saved["kind"] == "server_error" and saved["attempts"] == 3


def test_an_endpoint_that_stays_down_ends_the_run_after_endpoint_outages_calls(srv, task, tmp_path):
    for _ in range(6):
        srv.push(500, error_body("upstream exploded", "server_error"))
    with pytest.raises(LLMUnusable) as e:
        LLMProposer(settings(srv, endpoint_outages=2), task).propose(context(task, tmp_path))
    msg = str(e.value)
    assert "failed 2 calls in a row" in msg and "server error (5xx) (after 3 attempts): upstream exploded" in msg
    assert "\n" not in msg and len(srv.chat_requests) == 6


def test_reply_slower_than_the_timeout(srv, task, tmp_path, waits):
    for _ in range(2):
        srv.push_proposal(GOOD, delay_s=2.0)
    with pytest.raises(ProposalFailed, match="did not answer within the timeout .*after 2 attempts"):
        LLMProposer(settings(srv, timeout_s=0.3, max_attempts=2, endpoint_outages=1),
                    task).propose(context(task, tmp_path))
    # both attempts gave up at the timeout (a wait for the 2 s reply would have got the proposal), one backoff between
    # them, and no second call (endpoint_outages=1)
    assert len(srv.chat_requests) == 2 and len(waits) == 1 and 0 <= waits[0] <= 0.05, waits


def _each_call_held_to_its_deadline(srv, waits, tmp_path, deadline_s: float) -> None:
    """endpoint_outages (3) calls, each one attempt ended by its deadline (the reason saved for it), the pause of
    backoff_max_s between them. A call not held to its deadline reads the drip for a minute or more: each call's span
    in the server's log (its request to the next one's, the last to now) within 4 deadlines is the claim, with room
    for a loaded machine."""
    reqs = srv.chat_requests
    assert len(reqs) == 3 and waits == [0.05, 0.05], (len(reqs), waits)
    saved = [json.loads((tmp_path / f"runs/R/iter-1/response-{k}.json").read_text()) for k in (1, 2, 3)]
    assert [(r["kind"], r["attempts"]) for r in saved] == [("deadline", 1)] * 3, saved
    ends = [r.at for r in reqs[1:]] + [time.monotonic()]
    assert all(end - r.at < 4 * deadline_s for r, end in zip(reqs, ends)), [end - r.at for r, end in zip(reqs, ends)]


def test_a_server_that_drips_its_reply_is_ended_at_the_calls_deadline(srv, task, tmp_path, waits):
    """Issue 42: a reply sent one byte at a time, each within timeout_s, never trips timeout_s (each read comes within it: it held a run
    420 s); the call's deadline (deadline_s, above the retries) ends it, and the reason names it. A reply that comes
    whole within the deadline is read as before (every other test here)."""
    from tests.fake_openai import completion
    for _ in range(3):
        srv.push(200, completion(json.dumps(GOOD)), drip_s=0.05)   # about 1 KB: a minute a reply
    # each read within a tenth of timeout_s; the deadline a second (three calls: the test's wall time is theirs)
    with pytest.raises(ProposalFailed, match="no whole reply within the call's deadline") as e:
        LLMProposer(settings(srv, timeout_s=0.5, deadline_s=1.0), task).propose(context(task, tmp_path))
    _each_call_held_to_its_deadline(srv, waits, tmp_path, 1.0)
    assert "\n" not in str(e.value)


def test_a_server_that_drips_its_headers_is_ended_at_the_calls_deadline(srv, task, tmp_path, waits):
    """The same drip in the reply's head (status line and headers, one byte every 0.05 s: a minute of headers): the
    wait for the headers is held to the call's deadline too, not only the body's reads."""
    from tests.fake_openai import completion
    for _ in range(3):
        srv.push(200, completion(json.dumps(GOOD)), drip_s=0.05, drip_headers=True, headers={"X-Pad": "p" * 1200})
    with pytest.raises(ProposalFailed, match="no whole reply within the call's deadline"):
        LLMProposer(settings(srv, timeout_s=0.5, deadline_s=1.0), task).propose(context(task, tmp_path))
    _each_call_held_to_its_deadline(srv, waits, tmp_path, 1.0)


def test_authentication_error_is_not_retried_and_ends_the_run(srv, task, tmp_path):
    srv.push(401, error_body("Incorrect API key provided"))
    with pytest.raises(LLMUnusable, match="refused the API key"):
        LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert len(srv.chat_requests) == 1


def test_schema_rejected_falls_back_to_text_and_remembers(srv, task, tmp_path):
    srv.push_proposal(GOOD, reject_schema=True)
    srv.push_text("Sure.\n" + json.dumps(GOOD) + "\nThat is my proposal.")
    p = LLMProposer(settings(srv), task)
    p.propose(context(task, tmp_path, iteration=1))
    p.propose(context(task, tmp_path, iteration=2))
    reqs = srv.chat_requests
    assert len(reqs) == 3
    assert reqs[0].body["response_format"]["type"] == "json_schema"
    assert "response_format" not in reqs[1].body and "response_format" not in reqs[2].body
    # the schema once a request: in the response format, then (text) at the end of the system message
    assert "additionalProperties" not in reqs[0].body["messages"][0]["content"]
    for r in reqs[1:]:
        [system] = [m for m in r.body["messages"] if m["role"] == "system"]
        assert system["content"].count('"additionalProperties"') >= 1 and "## The proposal's JSON schema" in system["content"]
    assert p.client.schema_supported is False
    notes = json.loads((tmp_path / "runs/R/iter-1/response-1.json").read_text())["notes"]
    assert any("rejected response_format json_schema" in n for n in notes)


def test_usage_and_cost_accounting(srv, task, tmp_path):
    prices = {"fake-model": Price(input=2.0, output=8.0)}
    srv.push_proposal(GOOD, prompt_tokens=1000, completion_tokens=500)
    srv.push_proposal(GOOD, prompt_tokens=3000, completion_tokens=250)
    p = LLMProposer(settings(srv, prices=prices), task)
    _, u1 = p.propose(context(task, tmp_path, iteration=1))
    _, u2 = p.propose(context(task, tmp_path, iteration=2))
    assert u1.cost_usd == pytest.approx((1000 * 2 + 500 * 8) / 1e6)
    assert u2.cost_usd == pytest.approx((3000 * 2 + 250 * 8) / 1e6)
    assert (p.spent.calls, p.spent.prompt_tokens, p.spent.completion_tokens) == (2, 4000, 750)
    assert p.spent.cost_usd == pytest.approx(0.014)


def test_unknown_model_costs_zero_with_a_note(srv, task, tmp_path):
    srv.push_proposal(GOOD)
    _, usage = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert usage.cost_usd == 0.0
    notes = json.loads((tmp_path / "runs/R/iter-1/response-1.json").read_text())["notes"]
    assert any("no price for model 'fake-model'" in n for n in notes)


def test_budget_refuses_a_call_that_would_start_over_it(srv, task, tmp_path):
    srv.push_proposal(GOOD, prompt_tokens=2900, completion_tokens=100)
    p = LLMProposer(settings(srv, budget_tokens=5000), task)
    p.propose(context(task, tmp_path, iteration=1))          # 3000 of 5000 spent
    with pytest.raises(BudgetExhausted, match="token budget: 3000 of 5000 tokens spent"):
        p.propose(context(task, tmp_path, iteration=2))      # the next prompt alone is > 2000 tokens
    assert len(srv.chat_requests) == 1


def test_budget_ends_the_run_after_a_call_that_passed_it(srv, task, tmp_path):
    prices = {"fake-model": Price(input=10.0, output=30.0)}
    srv.push_proposal(GOOD, prompt_tokens=3000, completion_tokens=1000)    # $0.06
    p = LLMProposer(settings(srv, prices=prices, budget_usd=0.05), task)
    # the proposal that was paid for is returned (the loop evaluates it) ...
    proposal, usage = p.propose(context(task, tmp_path))
    assert proposal.hypothesis == GOOD["hypothesis"] and usage.cost_usd == pytest.approx(0.06)
    # ... and the next call is refused before it is made
    with pytest.raises(BudgetExhausted, match=r"cost budget spent: \$0.0600 of \$0.05"):
        p.propose(context(task, tmp_path, iteration=2))
    assert p.spent.calls == 1 and len(srv.chat_requests) == 1


def test_patch_miss_feedback_continues_the_conversation(srv, task, tmp_path):
    miss = dict(GOOD, edits=[{"file": "matmul.cpp", "search": "#define LOOP_ORDER  0 // i-j-k",
                              "replace": "#define LOOP_ORDER 1", "content": None}])
    srv.push_proposal(miss)
    srv.push_proposal(GOOD)
    p = LLMProposer(settings(srv), task)
    ctx = context(task, tmp_path)
    first, _ = p.propose(ctx)
    result = apply_edits(first.edits, task.root, task.spec.editable)
    assert result.status == PatchStatus.did_not_apply and "Did you mean" in result.message
    assert "#define LOOP_ORDER 0" in result.message            # the closest actual line

    ctx.feedback, ctx.feedback_kind = result.message, "patch_did_not_apply"
    second, _ = p.propose(ctx)
    follow = srv.chat_requests[1].body["messages"]
    assert follow[2]["role"] == "assistant" and json.loads(follow[2]["content"]) == miss
    assert follow[3]["content"].startswith("Your edits did not apply")
    assert "#define LOOP_ORDER 0" in follow[3]["content"] and "File" not in follow[3]["content"][:20]
    assert apply_edits(second.edits, task.root, task.spec.editable).ok
    assert sorted(p.name for p in Path(ctx.iter_dir).iterdir()) == [
        "prompt-1.json", "prompt-2.json", "response-1.json", "response-2.json"]


@pytest.mark.parametrize("kind,opening", [("compile_failed", "Your change did not compile"),
                                          ("parity_failed", "Your change compiled but computes the wrong result"),
                                          ("launch_rejected", "Your change was refused by the launch")])
def test_feedback_kind_picks_the_repair_prompt(srv, task, tmp_path, kind, opening):
    srv.push_proposal(GOOD)
    srv.push_proposal(GOOD)
    p = LLMProposer(settings(srv), task)
    ctx = context(task, tmp_path)
    p.propose(ctx)
    ctx.feedback, ctx.feedback_kind = "matmul.cpp:12: error: 'acc' was not declared", kind
    p.propose(ctx)
    last = user_text(srv.chat_requests[1])
    assert last.startswith(opening) and "'acc' was not declared" in last


def test_edit_to_a_non_editable_file_is_refused(srv, task, tmp_path):
    cheat = dict(GOOD, edits=[{"file": "task.py", "search": None, "replace": None,
                               "content": "def reference(shape, a, b):\n    return a @ b\n"}])
    srv.push_proposal(cheat)
    before = (task.root / "task.py").read_text()
    proposal, _ = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    r = apply_edits(proposal.edits, task.root, task.spec.editable)
    assert r.status == PatchStatus.outside_editable and "'task.py' is not an editable file" in r.message
    assert (task.root / "task.py").read_text() == before


def test_empty_kernel_is_bootstrapped_from_the_reference(srv, task, tmp_path):
    (task.root / "matmul.cpp").write_text("")
    srv.push_proposal(dict(GOOD, edits=[{"file": "matmul.cpp", "search": None, "replace": None,
                                         "content": "extern \"C\" void matmul() {}\n"}]))
    LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    prompt = user_text(srv.chat_requests[0])
    assert "This task has no kernel yet" in prompt and "whole file as `content`" in prompt
    assert "def reference(shape, a, b):" in prompt and "(empty file)" in prompt


def test_history_gives_way_oldest_first_and_sources_never_truncate(srv, task, tmp_path):
    history = [HistoryItem(i, f"hypothesis number {i} " + "x" * 400, "not_faster", f"reason {i}")
               for i in range(1, 41)]
    srv.push_proposal(GOOD)
    p = LLMProposer(settings(srv, context_tokens=6000), task)
    p.propose(context(task, tmp_path, iteration=41, history=history))
    prompt = user_text(srv.chat_requests[0])
    assert "earlier iteration(s) omitted to fit the context budget" in prompt
    assert "hypothesis number 40" in prompt and "hypothesis number 1 " not in prompt
    assert task.root.joinpath("matmul.cpp").read_text() in prompt
    assert estimate_tokens(json.dumps(srv.chat_requests[0].body["messages"])) <= 6000 * 1.1

    with pytest.raises(LLMUnusable, match="the sources are never truncated"):
        LLMProposer(settings(srv, context_tokens=2000), task).propose(context(task, tmp_path))
    assert len(srv.chat_requests) == 1


def test_a_400_after_the_schema_was_accepted_is_not_taken_for_a_schema_rejection(srv, task, tmp_path):
    srv.push_proposal(GOOD)
    srv.push(400, error_body("This model's maximum context length is 8192 tokens"))
    p = LLMProposer(settings(srv), task)
    p.propose(context(task, tmp_path, iteration=1))
    with pytest.raises(ProposalFailed, match="rejected the request \\(400\\): This model's maximum context length"):
        p.propose(context(task, tmp_path, iteration=2))
    assert len(srv.chat_requests) == 2 and p.client.schema_supported is True


def test_no_server_listening_is_a_connection_error(task, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    st = LLMSettings(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_attempts=2, backoff_base_s=0.01,
                     backoff_max_s=0.02, timeout_s=2)
    with pytest.raises(ProposalFailed, match="could not connect to the endpoint .*after 2 attempts"):
        LLMProposer(st, task).propose(context(task, tmp_path))


def test_a_429_with_retry_after_is_waited_as_asked_and_capped(srv, task, tmp_path, waits):
    """Issue 43: a 429 with `Retry-After: 2` was retried 0.6 s later (the backoff's own wait); now the server's wait
    is kept (the wait asked, and at least that in the server's log: 1 s here, above the backoff's 0.05 s), an
    HTTP-date form too, and a wait past retry_after_max_s is capped."""
    srv.push(429, error_body("slow down", "rate_limit_error"), headers={"Retry-After": "1"})
    srv.push_proposal(GOOD)
    LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    first, second = srv.chat_requests
    assert waits == [1.0] and second.at - first.at >= 0.95, (waits, second.at - first.at)
    srv.push(503, error_body("busy", "server_error"), headers={"Retry-After": "3600"})
    srv.push_proposal(GOOD)
    LLMProposer(settings(srv, retry_after_max_s=0.5), task).propose(context(task, tmp_path, iteration=2))
    third, fourth = srv.chat_requests[2:]
    assert waits == [1.0, 0.5] and fourth.at - third.at >= 0.45, (waits, fourth.at - third.at)


def test_retry_after_is_read_in_seconds_milliseconds_and_as_a_date():
    from datetime import datetime, timedelta, timezone
    from email.utils import format_datetime

    from agent.llm.client import httpx, retry_after

    def exc(headers):
        class E(Exception):
            response = httpx.Response(429, headers=headers)
        return E()
    assert retry_after(exc({"Retry-After": "20"})) == 20.0
    assert retry_after(exc({"retry-after-ms": "1500", "Retry-After": "20"})) == 1.5
    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after(exc({"Retry-After": when})) <= 31
    assert retry_after(exc({})) is None and retry_after(exc({"Retry-After": "soon"})) is None
    assert retry_after(ValueError("no response")) is None


def test_a_reply_cut_at_the_token_limit_is_not_parsed_and_the_model_is_asked_for_a_shorter_one(srv, task, tmp_path):
    """Issue 43: a reply that ends with finish_reason=length is detected before parsing (half a JSON object only
    earned a schema complaint); the model is told it was cut off and asked for a shorter answer."""
    from tests.fake_openai import completion
    half = json.dumps(GOOD)[: len(json.dumps(GOOD)) // 2]
    srv.push(200, completion(half, finish_reason="length"))
    srv.push_proposal(GOOD)
    proposal, usage = LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    assert proposal.hypothesis == GOOD["hypothesis"] and usage.calls == 2
    last = srv.chat_requests[1].body["messages"][-1]["content"]
    assert "cut off at the token limit" in last and "shorter" in last
    assert "Expecting" not in last and "validation error" not in last.lower()   # no parser's complaint


def test_the_prompt_tells_the_machine_the_toolchain_the_tolerance_and_the_harness(srv, task, tmp_path):
    """Issue 43: a CPU task is not told it is a GPU engineer; the iteration prompt names the CPU (model, ISA, caches),
    the compiler and the task's flags, the task's own tolerance, and the harness's contract. A CUDA task (compiled here
    without a GPU) gets the GPU's launch limits from the arch table, said to be the table's."""
    srv.push_proposal(GOOD)
    LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    system, user = (m["content"] for m in srv.chat_requests[0].body["messages"])
    assert "You are a CPU performance engineer" in system and "GPU performance engineer" not in system
    assert "## The machine, the toolchain and the harness" in user
    tol = task.spec.tolerance["float32"]
    assert f"float32: atol {tol.atol:g}, rtol {tol.rtol:g}" in user
    assert "- CPU: " in user and "logical cores" in user and "- Compiler: " in user
    assert "poisoned" in user and "Two threads may call at once" in user and "compute-sanitizer" not in user
    # issue 63: the build's own command lines, which the model guessed at ("which -O, is -march set"), the task's folder
    # as `.`; a CPU task is told no GPU target
    assert "++ -O3 -march=native -fPIC -std=c++17 -I. -c matmul.cpp -o obj/matmul.cpp.o`" in user, user  # c++ or g++
    assert "-shared" in user and "-o libmatmul_cpu.so" in user and "Target:" not in user
    assert str(task.root) not in user and "-fmacro-prefix-map" not in user
    # the keep rule in the task's numbers, and the CPU's threads per core and clock where the machine says them
    b = task.spec.bench
    assert f"timed in {b.rounds} rounds of about {b.rep_ms:g} ms" in user and f"at least {b.min_gain:.0%} over" in user
    assert "rejected as within noise" in user
    if Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").exists():
        assert "SMT" in user
    if "cpu MHz" in Path("/proc/cpuinfo").read_text():
        assert " MHz now" in user
    from agent.llm.machine import machine_facts
    gpu_task = load_task(REPO / "kernels" / "softmax")
    facts = machine_facts(gpu_task)
    assert "SMs" in facts and "KiB of shared memory" in facts and "launch on the stream you are given" in facts
    assert "compute-sanitizer memcheck, and racecheck" in facts and "past 2^31 elements" in facts
    # the task's own bounds and launch rules (issue 63: the model read them from tools/ to learn a rewrite was allowed)
    assert "(task.toml [dims]): M 1.." in facts and "at least 0.25 x the current best's CTA count" in facts, facts
    if shutil.which("nvidia-smi") is None:
        assert "table" in facts.splitlines()[0], facts
    from tools.backends.device import resolve_arch
    if shutil.which("nvcc") and resolve_arch(gpu_task) == "sm_90a":      # here without a GPU, and on a Hopper
        assert "Target: sm_90a, nvcc's arch-specific target" in facts and "wgmma" in facts
        assert "-gencode=arch=compute_90a,code=sm_90a" in facts and "-c softmax.cu" in facts, facts


# the words a CPU task's model must not be sent (issue 63: it read SOL %, occupancy, the SM count and the CTA limits)
GPU_WORDS = ("GPU", "CUDA", "SM count", "CTA", "occupancy", "SOL ", "shared memory", "__device__", "stream", "cuBLAS",
             "ncu", "Nsight", "warp", "launch", "grid_size", "sol.memory_pct", "sm_90")


def test_a_cpu_tasks_model_reads_no_gpu_rule_or_metric_and_a_gpu_tasks_keeps_them(srv, task, tmp_path):
    """Issue 63: AGENT.md's device blocks (agent/llm/prompts.py rules_for): a CPU task's whole request (the system prompt,
    the schema, the iteration prompt) names nothing of a GPU, and none of the note AGENT.md keeps for people; a CUDA
    task's system prompt has the GPU rules (launch safety, the profile's metrics). One answer section."""
    srv.push_proposal(GOOD)
    LLMProposer(settings(srv), task).propose(context(task, tmp_path))
    body = srv.chat_requests[0].body
    sent = json.dumps(body)
    assert [w for w in GPU_WORDS if w in sent] == [], [(w, sent[max(0, sent.index(w) - 80):sent.index(w) + 40])
                                                       for w in GPU_WORDS if w in sent]
    system = body["messages"][0]["content"]
    assert "for people" not in sent and "AGENT.md" not in sent and "<!--" not in sent
    assert "Use the core you are given" in system and "Use the measurements" in system
    assert system.count("## The answer") == 1 and "Answer format" not in system
    gpu = LLMProposer(settings(srv), load_task(REPO / "kernels" / "softmax")).system
    assert "Keep the launch safe and the plan true" in gpu and "SOL compute/memory %" in gpu and "CTA" in gpu
    assert "Use the core you are given" not in gpu and "<!--" not in gpu and "for people" not in gpu


def test_agent_md_markers_out_of_place_are_an_error_not_a_lost_rule():
    """A block left open would take every rule after it from the model without a word: refused, as is a stray close
    and a block inside a block; no device but the two."""
    from agent.llm.prompts import PromptError, rules_for
    assert rules_for("a\n<!-- gpu -->\nb\n<!-- /gpu -->\n<!-- cpu -->\nc\n<!-- /cpu -->\nd\n", "cpu") == "a\nc\nd"
    assert rules_for("<!-- people -->\nnote\n<!-- /people -->\nrule\n", "gpu") == "rule"
    for bad in ("a\n<!-- gpu -->\nb\n", "a\n<!-- /cpu -->\n", "<!-- gpu -->\n<!-- cpu -->\n<!-- /cpu -->\n<!-- /gpu -->\n",
                "<!-- gpu -->\nx\n<!-- /cpu -->\n"):
        with pytest.raises(PromptError, match="AGENT.md"):
            rules_for(bad, "cpu")
    with pytest.raises(PromptError, match="device"):
        rules_for("a\n", "tpu")
