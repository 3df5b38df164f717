"""The offline proposer: moves the task's declared knobs by rules tied to measured metrics.

Rules read the latest profile of the best (ncu, or the counter-free fallback) and map what limits
the kernel to knobs by their declared role (tools/task.py Knob.role):

    compute/latency-bound, tensor pipe idle        -> switch on a `tensor` knob
    small grid (CTAs < SMs, ncu's launch rule)     -> raise a `split` knob, or lower a `tile` knob
    occupancy limited by registers / shared memory -> lower a `tile` or `threads` knob
    shared-memory bank conflicts                   -> raise a `pad` knob
    memory-bound, DRAM below its peak              -> raise a `vector` knob
    latency-bound (compute and memory both low)    -> raise `threads` / `split`
    compute-bound at under 10 FLOP/B (or none declared) -> raise a `vector` knob (fewer instructions)
    compute-bound                                   -> raise a `tile` knob (more reuse per load)

When no rule fires (or every move it suggests was measured), it explores one-knob moves from the
best configuration. When all of those were measured, it combines moves, ranked by a first-order
model: the product of the measured single-move ratios (two moves that each cost little first; a
gain then needs the moves to interact, as a tile reshaped at the same area can). It never proposes
a configuration it has measured. Each move is a real patch: the knob's `#define` line rewritten.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from agent.proposal import Edit, Evidence, PredictedEffect, Proposal
from agent.proposers.base import Context, ProposerExhausted
from agent.records.schema import Usage
from tools.profile.model import Bottleneck, KernelProfile, ProfileReport
from tools.task import Knob, Task, knob_pattern

Config = dict[str, int]


@dataclass
class Move:
    knob: str
    value: int
    why: str                      # the reason; the hypothesis reads "KNOB a->b: why"
    evidence: list[Evidence]
    metric: str
    direction: str
    speedup: float


class HeuristicProposer:
    name = "heuristic"
    can_repair = False   # its patches are cut from the current text: they cannot miss

    def __init__(self, task: Task):
        self.task = task
        self.knobs: dict[str, Knob] = {k.name: k for k in task.spec.knobs}

    # --- the interface ----------------------------------------------------------------------
    def skip_to(self, n: int) -> None:
        """Nothing to skip: the next move is derived from ctx.history, which a resumed run carries."""

    def propose(self, ctx: Context) -> tuple[Proposal, Usage]:
        current = {k: v for k, v in ctx.knobs.items() if v is not None and k in self.knobs}
        if not current:
            raise ProposerExhausted("the task declares no knobs that are present in the source; "
                                    "the heuristic proposer has nothing to move (use --proposer llm)")
        measured = {_key(h.knobs) for h in ctx.history if h.knobs} | {_key(c) for c in ctx.measured_knobs}
        measured.add(_key(current))
        # a knob value that already failed (in a rejected configuration) is tried again only after
        # everything else: a rule that keeps firing (say "compute-bound: larger tiles") would otherwise
        # retry the same move from each new configuration, each time slower
        failed = {(n, v) for h in ctx.history if h.knobs and h.outcome != "kept"
                  for n, v in h.knobs.items() if current.get(n) != v}
        rules = self._rule_moves(ctx.profile, current)
        fresh = [m for m in rules if (m.knob, m.value) not in failed]
        stale = [m for m in rules if (m.knob, m.value) in failed]
        for move in fresh + self._explore_moves(current) + stale:
            cfg = {**current, move.knob: move.value}
            if _key(cfg) in measured or not self.task.spec.restriction_ok(cfg):
                continue
            return self._proposal(ctx, current, move), Usage()
        ratios = _single_move_ratios(ctx, current)
        for cfg, est in self._far_configs(current, ratios):
            if _key(cfg) not in measured:
                return self._multi_proposal(ctx, current, cfg, est, ratios), Usage()
        raise ProposerExhausted(f"every one of the {len(self.task.spec.knob_space())} knob configurations "
                                "allowed by the restrictions has been measured")

    # --- rules ------------------------------------------------------------------------------
    def _rule_moves(self, prof: ProfileReport | None, cur: Config) -> list[Move]:
        kp = _main_kernel(prof)
        if kp is None:
            return []
        sm = (prof.env.sm_count if prof else None) or 0
        moves: list[Move] = []
        ev_grid = [Evidence(metric="launch.ctas", value=str(kp.ctas)),
                   Evidence(metric="device.sm_count", value=str(sm or "?"))]
        if kp.waves_per_sm is not None:
            ev_grid.append(Evidence(metric="launch.waves_per_sm", value=f"{kp.waves_per_sm:.2f}"))
        grid_rule = next((r for r in kp.rules if "grid" in r.message.lower() and "small" in r.message.lower()), None)
        if grid_rule:
            ev_grid.append(Evidence(metric=f"ncu.rule.{grid_rule.id}", value=grid_rule.message[:160]))
        small = kp.bottleneck == Bottleneck.small_grid or (sm and kp.ctas < sm) or grid_rule is not None
        if small:
            want = max(2.0, sm / max(kp.ctas, 1)) if sm else 2.0
            for k in self._by_role("split"):
                for v in _higher(k, cur[k.name]):
                    ratio = v / max(cur[k.name], 1)
                    moves.append(Move(k.name, v, f"The grid is {kp.ctas} CTAs on {sm or '?'} SMs (small grid): about "
                                      f"{ratio:.0f}x the CTAs",
                                      ev_grid, "launch.ctas", "up", round(min(ratio, want), 2)))
            for k in self._by_role("tile"):
                for v in _lower(k, cur[k.name]):
                    ratio = cur[k.name] / v
                    moves.append(Move(k.name, v, f"The grid is {kp.ctas} CTAs on {sm or '?'} SMs (small grid): smaller "
                                      f"tiles, about {ratio:.0f}x the CTAs",
                                      ev_grid, "launch.ctas", "up", round(min(ratio, want) * 0.8, 2)))
        limiter = (kp.occupancy_limiter or "").lower()
        if limiter in ("registers", "shared_memory") and (kp.occupancy_theoretical_pct or 100) < 50:
            ev = [Evidence(metric="occupancy.limiter", value=limiter),
                  Evidence(metric="occupancy.theoretical_pct", value=f"{kp.occupancy_theoretical_pct}")]
            for k in self._by_role("tile") + self._by_role("threads"):
                for v in _lower(k, cur[k.name])[:1]:
                    moves.append(Move(k.name, v, f"Occupancy is {kp.occupancy_theoretical_pct}% limited by {limiter}: "
                                      "fit more CTAs per SM",
                                      ev, "occupancy.achieved_pct", "up", 1.15))
        conflicts = kp.smem_bank_conflicts or 0
        bank_rule = next((r for r in kp.rules if "bank" in r.message.lower()), None)
        if conflicts > 0 or bank_rule:
            ev = [Evidence(metric="smem.bank_conflicts", value=str(conflicts))]
            if bank_rule:
                ev.append(Evidence(metric=f"ncu.rule.{bank_rule.id}", value=bank_rule.message[:160]))
            for k in self._by_role("pad"):
                for v in _higher(k, cur[k.name])[:1]:
                    moves.append(Move(k.name, v, f"{conflicts} shared-memory bank conflicts: pad rows", ev,
                                      "smem.bank_conflicts", "down", 1.1))
        mem, comp = kp.sol_memory_pct or 0.0, kp.sol_compute_pct or 0.0
        ev_sol = [Evidence(metric="sol.memory_pct", value=f"{mem:.1f}"),
                  Evidence(metric="sol.compute_pct", value=f"{comp:.1f}")]
        if kp.dram_pct is not None:
            ev_sol.append(Evidence(metric="sol.dram_pct", value=f"{kp.dram_pct:.1f}"))
        if kp.bottleneck == Bottleneck.memory:
            for k in self._by_role("vector"):
                for v in _higher(k, cur[k.name])[:1]:
                    moves.append(Move(k.name, v, f"Memory-bound at {mem:.0f}% of peak memory throughput: wider "
                                      "accesses", ev_sol, "sol.dram_pct", "up", 1.2))
        if kp.bottleneck == Bottleneck.latency:
            for k in self._by_role("threads") + self._by_role("split") + self._by_role("vector"):
                for v in _higher(k, cur[k.name])[:1]:
                    moves.append(Move(k.name, v, f"Latency-bound (memory {mem:.0f}%, compute {comp:.0f}% of peak): "
                                      "more work in flight", ev_sol,
                                      "sol.memory_pct", "up", 1.15))
        tensor = kp.tensor_pipe_pct or 0.0
        if kp.bottleneck in (Bottleneck.compute, Bottleneck.latency) and tensor < 5.0:
            ev = ev_sol + [Evidence(metric="tensor_pipe_pct", value=f"{tensor:.1f}")]
            for k in self._by_role("tensor"):
                for v in _higher(k, cur[k.name])[:1]:
                    moves.insert(0, Move(k.name, v, f"{kp.bottleneck.value.capitalize()}-bound with the tensor pipe "
                                         f"{tensor:.0f}% busy: move the matrix products to tensor cores", ev,
                                         "tensor_pipe_pct", "up", 2.0))
        if kp.bottleneck == Bottleneck.compute:
            # "compute" at a few FLOP per byte is instruction issue (address math, narrow loads), not math:
            # softmax on an H200 (no declared FLOPs, 73% compute, 52% DRAM) is slower after a tile move,
            # while wider accesses give 1.12x, 1.09x and 1.03x
            ai = self._intensity()
            if ai is None or ai < LOW_INTENSITY:
                what = f"{ai:.1f} FLOP/B" if ai is not None else "no declared FLOPs"
                ev = ev_sol + [Evidence(metric="task.flop_per_byte", value=f"{ai:.2f}" if ai is not None else "-")]
                for k in self._by_role("vector"):
                    for v in _higher(k, cur[k.name])[:1]:
                        moves.append(Move(k.name, v, f"Compute-bound at {comp:.0f}% of peak with DRAM at {mem:.0f}% "
                                          "and "
                                          f"{what}: the busy pipes are issuing instructions (address math, narrow "
                                          "loads), not math; wider accesses cut instructions per byte", ev,
                                          "sol.compute_pct", "down", 1.15))
            for k in self._by_role("tile"):
                for v in _higher(k, cur[k.name])[:1]:
                    moves.append(Move(k.name, v, f"Compute-bound at {comp:.0f}% of peak: larger tiles for more reuse "
                                      "per load", ev_sol, "sol.compute_pct", "down", 1.1))
        return moves

    def _intensity(self) -> float | None:
        """The task's FLOP per byte on its main shape (its declared metrics), or None."""
        main = self.task.spec.main
        f, b = self.task.spec.flops(main), self.task.spec.bytes(main)
        return f / b if f is not None and b else None

    # --- exploration ------------------------------------------------------------------------
    def _explore_moves(self, cur: Config) -> list[Move]:
        moves = []
        # roles with the larger typical effect first, not declaration order: exploring a knob declared
        # first value by value (softmax's THREADS) can use up a short run before a stronger one (its VEC)
        knobs = sorted(self.task.spec.knobs, key=lambda k: _EXPLORE_ORDER.index(k.role))
        for k in knobs:
            if k.name not in cur:
                continue
            vals = sorted((v for v in k.values if v != cur[k.name]),
                          key=lambda v: (abs(k.values.index(v) - _index(k, cur[k.name])), v))
            for v in vals:
                what = f" ({k.description})" if k.description else ""
                moves.append(Move(k.name, v, f"explore{what}: no profile rule points at an untried move",
                                  [Evidence(metric=f"knob.{k.name}", value=str(cur[k.name]))],
                                  "time.median_ms", "down", 1.05))
        return moves

    def _far_configs(self, cur: Config, ratios: dict[tuple[str, int], float]) -> list[tuple[Config, float]]:
        """Every configuration with its first-order estimate against the best: the product of the
        measured single-knob ratios of the moves it combines (a move the restrictions never let run
        alone counts as the median measured one). Best estimate first, then nearest. At a local
        optimum every factor is below 1, so combinations of two moves that each cost little come
        first (a tile reshaped at the same area, say)."""
        prior = statistics.median(ratios.values()) if ratios else 1.0
        def dist(cfg: Config) -> int:
            return sum(abs(_index(self.knobs[n], cfg[n]) - _index(self.knobs[n], cur.get(n, cfg[n]))) for n in cfg)
        def est(cfg: Config) -> float:
            return math.prod(ratios.get((n, v), prior) for n, v in cfg.items() if cur.get(n) != v)
        return sorted(((c, est(c)) for c in self.task.spec.knob_space()), key=lambda ce: (-ce[1], dist(ce[0])))

    # --- patches ----------------------------------------------------------------------------
    def _by_role(self, role: str) -> list[Knob]:
        return [k for k in self.task.spec.knobs if k.role == role]

    def _edit(self, ctx: Context, name: str, value: int) -> Edit:
        k = self.knobs[name]
        text = ctx.sources[k.file]
        m = knob_pattern(name).search(text)
        if m is None:
            raise ProposerExhausted(f"#define {name} is gone from {k.file}")
        line_end = text.find("\n", m.start())
        old_line = text[m.start(): line_end if line_end >= 0 else len(text)].lstrip("\n")
        new_line = knob_pattern(name).sub(lambda mm: f"{mm.group(1)}{value}", old_line, count=1)
        return Edit(file=k.file, search=old_line, replace=new_line)

    def _proposal(self, ctx: Context, cur: Config, mv: Move) -> Proposal:
        return Proposal(hypothesis=f"{mv.knob} {cur[mv.knob]}->{mv.value}: {mv.why}", evidence=mv.evidence,
                        predicted=PredictedEffect(metric=mv.metric, direction=mv.direction, speedup=mv.speedup),
                        edits=[self._edit(ctx, mv.knob, mv.value)], knobs={**cur, mv.knob: mv.value})

    def _multi_proposal(self, ctx: Context, cur: Config, cfg: Config, est: float,
                        ratios: dict[tuple[str, int], float]) -> Proposal:
        changed = {n: v for n, v in cfg.items() if cur.get(n) != v}
        desc = ", ".join(f"{n} {cur.get(n)}->{v}" for n, v in changed.items())
        known = [f"{n}->{v} {ratios[(n, v)]:.3f}x" for n, v in changed.items() if (n, v) in ratios]
        why = (f"; alone: {', '.join(known)}, so {est:.3f}x if the moves did not interact: a gain needs an "
               "interaction (a tile reshaped at the same area, say)") if known else ""
        return Proposal(hypothesis=f"{desc}: every single-knob move from the best has been measured; combine them{why}",
                        evidence=[Evidence(metric=f"knob.{n}", value=str(cur.get(n))) for n in changed]
                        + [Evidence(metric=f"single_move.{n}={v}.speedup", value=f"{ratios[(n, v)]:.3f}")
                           for n, v in changed.items() if (n, v) in ratios],
                        predicted=PredictedEffect(metric="time.median_ms", direction="down", speedup=1.05),
                        edits=[self._edit(ctx, n, v) for n, v in changed.items()], knobs=dict(cfg))


LOW_INTENSITY = 10.0   # FLOP/B: far below any GPU's ridge point (the H200's is about 200 for fp16)

_EXPLORE_ORDER = ["tensor", "vector", "split", "pad", "order", "tile", "threads", "other"]


def _single_move_ratios(ctx: Context, cur: Config) -> dict[tuple[str, int], float]:
    """(knob, value) -> the best's time over the time of the best with that one knob changed, from the
    history's medians (the latest measurement of each), whenever it was measured."""
    out: dict[tuple[str, int], float] = {}
    if not ctx.best_ms:
        return out
    for h in ctx.history:
        if not h.knobs or not h.ms:
            continue
        diff = [(n, v) for n, v in h.knobs.items() if cur.get(n) != v]
        if len(diff) == 1 and all(h.knobs.get(n) == v for n, v in cur.items() if n != diff[0][0]):
            out[diff[0]] = ctx.best_ms / h.ms
    return out


def _key(cfg: dict | None) -> tuple:
    return tuple(sorted((cfg or {}).items()))


def _index(k: Knob, v: int) -> int:
    return k.values.index(v) if v in k.values else min(range(len(k.values)), key=lambda i: abs(k.values[i] - v))


def _higher(k: Knob, v: int) -> list[int]:
    return sorted(x for x in k.values if x > v)


def _lower(k: Knob, v: int) -> list[int]:
    return sorted((x for x in k.values if x < v), reverse=True)


def _main_kernel(prof: ProfileReport | None) -> KernelProfile | None:
    if prof is None or not prof.kernels:
        return None
    timed = [k for k in prof.kernels if k.duration_us is not None]
    return max(timed, key=lambda k: k.duration_us) if timed else prof.kernels[0]
