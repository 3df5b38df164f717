"""Strict prompt rendering, the prompt files themselves, and reading proposals from replies."""

import json

import pytest

from agent.llm.structured import ReplyInvalid, extract_json, parse_proposal, proposal_schema
from agent.llm.prompts import PROMPTS_DIR, PromptError, placeholders, render, render_text

TEMPLATES = ["system", "iteration", "bootstrap", "repair_patch", "repair_compile", "repair_parity",
             "repair_launch", "repair_schema"]


def test_missing_variable_is_an_error():
    with pytest.raises(PromptError, match="no value for b"):
        render_text("{{a}} and {{ b }}", {"a": 1})


def test_unused_variable_is_an_error():
    with pytest.raises(PromptError, match="never used by the template: c"):
        render_text("{{a}}", {"a": 1, "c": 2})


def test_values_are_not_rescanned():
    code = "template<int N> struct S { int x[N]; }; // {{not_a_var}}"
    assert render_text("```\n{{code}}\n```", {"code": code}) == f"```\n{code}\n```"


def test_every_template_exists_and_renders_with_exactly_its_variables():
    for name in TEMPLATES:
        text = (PROMPTS_DIR / f"{name}.md").read_text()
        names = placeholders(text)
        out = render(name, **{n: f"<{n}>" for n in names})
        assert all(f"<{n}>" in out for n in names)
    assert placeholders((PROMPTS_DIR / "system.md").read_text()) == {"agent_rules", "role"}


def test_unknown_template():
    with pytest.raises(PromptError, match="no template"):
        render("nope")


def test_schema_is_portable():
    s = json.dumps(proposal_schema())
    assert "$ref" not in s and "$defs" not in s and '"default"' not in s
    assert "proposer" not in proposal_schema()["properties"]

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                assert node["additionalProperties"] is False
                assert set(node["required"]) == set(node["properties"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(proposal_schema())


def test_extract_json_forms():
    obj = {"a": "x } { y", "b": [1, {"c": "\"}"}]}
    assert extract_json(json.dumps(obj)) == obj
    assert extract_json("text\n```json\n" + json.dumps(obj) + "\n```\nmore") == obj
    assert extract_json("Sure! " + json.dumps(obj) + " Hope it helps {") == obj
    with pytest.raises(ReplyInvalid, match="the reply is empty"):
        extract_json("   ")
    with pytest.raises(ReplyInvalid, match="not valid JSON"):
        extract_json("no braces at all")


def test_parse_proposal_drops_loop_fields_and_rejects_non_objects():
    good = {"hypothesis": "h", "evidence": [], "predicted": {"metric": "t", "direction": "down", "speedup": 1.1},
            "edits": [{"file": "k.cu", "content": "x"}], "proposer": "forged", "knobs": {"A": 1}}
    p = parse_proposal(json.dumps(good))
    assert p.proposer == "" and p.knobs is None
    with pytest.raises(ReplyInvalid, match="a list, not an object"):
        parse_proposal("[1, 2]")
    with pytest.raises(ReplyInvalid, match=r"- edits: List should have at least 1 item"):
        parse_proposal(json.dumps(dict(good, edits=[])))


def test_a_rejected_gpu_candidate_is_shown_with_what_its_build_and_launch_plan_know():
    """Issue 63: the model was told that four attention candidates were slower and not why; ptxas and the launch plan
    already knew their registers, spills and shared memory, and the occupancy those allow."""
    from agent.llm.context import format_history_item
    from agent.optimize.propose import history_item
    from agent.records.schema import Decision, IterationRecord, Outcome
    from tools.results import BuildResult, BuildStatus, DeviceLimits, KernelResources, Launch, LaunchResult, LaunchStatus
    lim = DeviceLimits(name="NVIDIA H200", arch="sm_90", sm_count=132, max_smem_per_block_optin=232448, source="device")
    build = BuildResult(status=BuildStatus.ok, build_dir="b", kernels=[KernelResources(name="attn_fwd(const half*)", registers=168,
                                                                        spill_stores_bytes=40, spill_loads_bytes=48,
                                                                        smem_static_bytes=0)])
    launch = LaunchResult(status=LaunchStatus.ok, limits=lim, launches=[Launch(
        kernel="attn_fwd", grid=(64, 16, 1), block=(128, 1, 1), smem_dynamic_bytes=98304, smem_static_bytes=0,
        registers=168)])
    rec = IterationRecord(run_id="r", iteration=2, started="t", finished="t", build=build, launch=launch,
                          decision=Decision.reverted, outcome=Outcome.not_faster, reason="speedup 0.91x: slower")
    text = format_history_item(history_item(rec))
    assert ("build and launch plan: attn_fwd: 168 registers, 88 B of spills, 0+98304 B shared memory, block 128, "
            "1024 CTAs; theoretical occupancy 12.5% (2 CTAs/SM, limited by shared_memory)") in text, text
    cpu = rec.model_copy(update={"build": BuildResult(status=BuildStatus.ok, build_dir="b"), "launch": None})
    assert "build and launch plan" not in format_history_item(history_item(cpu))


def test_a_knob_whose_file_a_kept_iteration_rewrote_is_flagged_with_what_the_file_says_now(tmp_path):
    """Issue 63: after the model's rewrite changed what VEC means, every later prompt still gave task.toml's words for
    the kernel as shipped. A file a kept iteration rewrote (a whole-file edit, or a diff over 40% of its lines) has its
    knobs' descriptions marked as the shipped file's, with the #define's own comment as the file has it now; a small
    kept change does not."""
    from pathlib import Path

    from agent.llm.context import format_knobs
    from agent.proposal import Edit, PredictedEffect, Proposal
    from agent.optimize.propose import rewritten
    from agent.proposers.base import Context
    from agent.records.schema import Decision, IterationRecord, Outcome
    from tools.task import load_task
    task = load_task(Path(__file__).resolve().parent.parent / "kernels" / "softmax")
    src = (task.root / "softmax.cu").read_text()
    new = src.replace("#define VEC 1                 // halves per load/store: 1, 2, 4 or 8 (16 bytes)",
                      "#define VEC 1   // rows a warp keeps in registers")
    assert new != src

    def kept(i, edit, patch=""):
        return IterationRecord(run_id="r", iteration=i, started="t", finished="t", decision=Decision.kept,
                               outcome=Outcome.kept, reason="kept", patch=patch, proposal=Proposal(
                                   hypothesis="h", edits=[edit], predicted=PredictedEffect(
                                       metric="t", direction="down", speedup=1.5)))
    small = kept(1, Edit(file="softmax.cu", search="#define THREADS 128", replace="#define THREADS 256"),
                 "diff --git a/k/softmax.cu b/k/softmax.cu\n--- a/k/softmax.cu\n+++ b/k/softmax.cu\n-#define THREADS 128\n"
                 "+#define THREADS 256\n")
    whole = kept(3, Edit(file="softmax.cu", content=new))
    ctx = lambda recs: Context(task=task, iteration=4, sources={"softmax.cu": new}, profile=None,   # noqa: E731
                               knobs=task.read_knobs(), rewritten=rewritten(recs, {"softmax.cu": new}))
    assert "rewrote" not in format_knobs(ctx([small]))
    text = format_knobs(ctx([small, whole]))
    vec = next(ln for ln in text.splitlines() if ln.startswith("- VEC"))
    assert "iteration 3 rewrote softmax.cu: what VEC does now is what the code says" in vec, vec
    assert "its #define's comment now: rows a warp keeps in registers" in vec, vec
    restr = next(ln for ln in text.splitlines() if ln.startswith("- restrictions:"))
    assert "written for softmax.cu as the task shipped it, rewritten since" in restr, restr
    assert "rewritten since" not in format_knobs(ctx([small]))


def test_the_noise_this_run_measured_is_in_where_it_stands():
    """Issue 63: the model was told the keep rule, not how wide an interval this machine gives. The first benches'
    half-widths (relative to their medians) are stated once a bench exists, with their confidence; none before."""
    from pathlib import Path

    from agent.llm.context import format_standing
    from agent.optimize.propose import noise
    from agent.proposers.base import Context
    from agent.records.schema import Decision, IterationRecord, Outcome
    from tools.results import BenchResult, BenchStatus, SpeedupCI
    from tools.task import load_task

    def rec(i, lo, med, hi):
        return IterationRecord(run_id="r", iteration=i, started="t", finished="t", decision=Decision.reverted,
                               outcome=Outcome.not_faster, reason="r", bench=BenchResult(
                                   status=BenchStatus.ok, shape={}, speedup_vs_baseline=SpeedupCI(
                                       median=med, low=lo, high=hi, rounds=10)))
    assert noise([]) == ""
    said = noise([rec(1, 0.98, 1.0, 1.02), rec(2, 1.05, 1.1, 1.21), rec(3, 0.9, 1.0, 1.1)])
    # half-widths 2%, 7.3% (0.08 of 1.1), 10%: their median 7.3%
    assert "95% intervals on this run reached +-2.0% to +-10.0% around their medians (median +-7.3%, 3 benches)" in said, said
    task = load_task(Path(__file__).resolve().parent.parent / "kernels" / "softmax")
    ctx = Context(task=task, iteration=4, sources={}, profile=None, noise=said)
    assert f"- Noise: {said}" in format_standing(ctx)
    assert "Noise" not in format_standing(Context(task=task, iteration=1, sources={}, profile=None))



def test_timing_says_each_input_set_has_its_own_output_and_a_gpu_rep_a_cold_l2():
    """The real model asked whether the output rotates with the inputs (it does: one output per set) and whether
    the caches are warm; the GPU bench flushes the L2 before each rep, a CPU one does not."""
    from pathlib import Path

    from agent.llm.machine import timing
    from tools.task import load_task
    kernels = Path(__file__).resolve().parent.parent / "kernels"
    gpu, cpu = timing(load_task(kernels / "softmax")), timing(load_task(kernels / "matmul_cpu"))
    assert "each with an output of its own" in gpu and "each with an output of its own" in cpu
    assert "the L2 flushed before each rep" in gpu and "L2" not in cpu


def test_a_rejected_candidates_own_profile_is_shown_and_a_kept_ones_is_not():
    """Best.profile_rejected's figures on the history line of a rejected GPU candidate; a kept one's profile is the
    best's, carried whole in the prompt's profile section, not repeated."""
    from agent.llm.context import format_history_item
    from agent.optimize.propose import history_item
    from agent.records.schema import Decision, IterationRecord, Outcome
    summary = {"kernel": "softmax_kernel", "ctas": 4096, "sol_compute_pct": 31.25, "sol_memory_pct": 78.5,
               "dram_pct": 70.0, "occupancy_achieved_pct": 41.2, "registers": 40, "bottleneck": "memory",
               "source": "ncu"}
    rec = IterationRecord(run_id="r", iteration=2, started="t", finished="t", decision=Decision.reverted,
                          outcome=Outcome.not_faster, reason="slower", profile_summary=summary)
    line = format_history_item(history_item(rec))
    assert ("its own profile: softmax_kernel (ncu): achieved occupancy 41.2%, 40 registers, 4096 CTAs, SOL compute "
            "31.2%, memory 78.5%, DRAM 70.0%; bottleneck memory") in line, line
    kept = rec.model_copy(update={"outcome": Outcome.kept, "decision": Decision.kept})
    assert "its own profile" not in format_history_item(history_item(kept))
    assert "its own profile" not in format_history_item(history_item(rec.model_copy(update={"profile_summary": None})))


def test_a_cpu_bench_says_whether_its_sets_fit_the_last_level_cache(monkeypatch):
    """Issue 63: told "a repeat does not find its inputs in the cache", a model took an 8 MiB working set in a 32 MiB
    L3 for DRAM traffic and proposed streaming stores (0.94x). The timing line now gives the sets' bytes (the task's
    bytes formula times the sets) against the last-level cache, whichever side they fall."""
    from pathlib import Path

    import agent.llm.machine as machine
    from tools.task import load_task
    task = load_task(Path(__file__).resolve().parent.parent / "kernels" / "matmul_cpu")
    total = task.spec.bytes(task.spec.main) * max(2, task.spec.bench.input_sets)
    monkeypatch.setattr(machine, "last_level_cache", lambda: ("L3", 4 * total))
    assert f"sets hold about {total / 2**20:.1f} MiB" in machine.timing(task)
    assert "against this CPU's L3" in machine.timing(task) and "not in DRAM" in machine.timing(task)
    monkeypatch.setattr(machine, "last_level_cache", lambda: ("L3", total // 2))
    assert "are past it: each call's data comes from DRAM" in machine.timing(task)
    monkeypatch.setattr(machine, "last_level_cache", lambda: None)
    assert "sets hold" not in machine.timing(task)


def test_the_cpu_line_names_the_core_amds_numbers_mean():
    from agent.llm.machine import core
    assert core("vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 1\n") == (
        " (family 25, model 1: Zen 3 by AMD's numbering)")
    assert core("vendor_id : AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n").endswith("Zen 4 by AMD's numbering)")
    assert core("vendor_id : GenuineIntel\ncpu family : 6\nmodel : 143\n") == " (family 6, model 143)"
    assert core("processor : 0\n") == ""


def test_the_system_prompt_says_how_edits_apply():
    from agent.llm.prompts import render
    text = render("system", role="CPU", agent_rules="")
    assert "The edits apply in their order, each to the file as the edits before it left it" in " ".join(text.split())
