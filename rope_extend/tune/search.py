"""Successive-halving search over closed forms and per-dimension curves.

Why successive halving: on CPU a forward over the target length is the unit of cost (SmolLM2-135M at 16k: ~100 s
on 2 free cores), and a prefix that reaches well beyond the window already separates bad candidates (too little
interpolation blows up, too much blurs nearby positions). So every candidate is screened on a prefix (rung 0: L
plus half the extension; see `rung_lengths` for why not shorter), the best 1/eta move on, and only the best few
reach the target length, where the winner is chosen. The best closed form and the best per-dimension curve are always promoted, so the final
rung compares the two families head to head.

Rung 0 first evaluates the closed-form grid; the rest of its slots go to per-dimension curves seeded from the best
closed form and improved by deterministic coordinate moves (pattern search: move to the best improving neighbour,
halve the step when none improves). Nothing is random, so a budget determines the run; with the log, a killed run
resumes to the same result.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..formatting import fmt_clock
from .log import SearchLog
from .objective import CalibrationObjective, Evaluation, eval_cost
from .options import DEFAULT_BUDGET
from .space import Candidate, Geometry, closed_form_grid, geometry_of, per_dim_moves

DEFAULT_ETA = 3


def rung_lengths(original: int, target: int, screen: float = 0.5) -> list[int]:
    """Rung lengths: L + screen·(N-L), halfway from there to N, and N (duplicates removed for tiny extensions).

    Why not shorter screening prefixes: just beyond the window every candidate that interpolates less looks better
    (SmolLM2 8k -> 16k, positions 8k-9k of the calibration text: unscaled 1.868, YaRN x2 1.889), so a 9k screen would
    rank candidates for 9k, not for 16k. Half the extension already shows the long-distance failure modes.
    """
    ext = target - original
    first = original + max(1, int(ext * screen))
    lengths = [first, first + max(1, (target - first) // 2), target]
    return sorted({min(n, target) for n in lengths})


def plan_schedule(budget: float, rungs: list[int], target_length: int, eta: int = DEFAULT_ETA):
    """(rung lengths, candidates per rung): the most rung-0 candidates whose halving schedule fits `budget`.

    Rung r keeps max(min(2, n0), ceil(n0 / eta**r)) candidates, never more than the rung before; a middle rung that
    would keep as many as the final one is dropped (it would only re-rank the same candidates at a cost).
    """

    def plan(n0: int) -> tuple[list[int], list[int]]:
        keeps = [n0]
        for r in range(1, len(rungs)):
            keeps.append(min(keeps[-1], max(min(2, n0), math.ceil(n0 / eta**r))))
        kept = [r for r in range(len(rungs)) if r in (0, len(rungs) - 1) or keeps[r] > keeps[-1]]
        return [rungs[r] for r in kept], [keeps[r] for r in kept]

    def cost(n0: int) -> float:
        lengths, keeps = plan(n0)
        return sum(k * eval_cost(n, target_length) for n, k in zip(lengths, keeps))

    if cost(1) > budget + 1e-9:
        raise ValueError(
            f"budget {budget:g} is too small: one candidate through all rungs costs {cost(1):.2f} "
            "target-length forwards; give --budget of at least that"
        )
    n0 = 1
    while cost(n0 + 1) <= budget + 1e-9:
        n0 += 1
    return plan(n0)


@dataclass
class Scored:
    candidate: Candidate
    loss: float
    length: int


@dataclass
class TuneResult:
    geometry: Geometry
    rungs: list[int]
    schedule: list[int]
    budget: float
    records: list[dict[str, Any]]
    winner: Scored
    best_closed: Scored | None
    best_per_dim: Scored | None
    spent: float
    seconds: float
    candidates: dict[str, Candidate] = field(default_factory=dict)

    def spec(self, which: str = "winner") -> dict[str, Any]:
        """The spec dict of the winner / best_closed / best_per_dim, with the original length written out."""
        scored = getattr(self, which)
        return {**scored.candidate.spec, "original_max_position_embeddings": self.geometry.original_length}


class _Progress:
    """One line per evaluation on stderr, with the budget spent and an ETA from the measured seconds per unit."""

    def __init__(self, planned: float, total: int, stream=None):
        self.planned, self.total, self.stream = planned, total, stream or sys.stderr
        self.done, self.spent, self.fresh_cost, self.fresh_seconds = 0, 0.0, 0.0, 0.0
        self.started = time.perf_counter()

    def update(self, rung: int, length: int, cand: Candidate, ev: dict, cost: float, fresh: bool) -> None:
        self.done += 1
        self.spent += cost
        if fresh:
            self.fresh_cost += cost
            self.fresh_seconds += ev["seconds"]
        rate = self.fresh_seconds / self.fresh_cost if self.fresh_cost else None
        eta = "?" if rate is None else fmt_clock(rate * max(0.0, self.planned - self.spent))
        tag = "" if fresh else " (from log)"
        print(
            f"[tune {self.done}/{self.total}] rung {rung} @{length}: {cand.name}: loss {ev['loss']:.4f} "
            f"({ev['seconds']:.0f}s){tag} | budget {self.spent:.2f}/{self.planned:.2f} | "
            f"{fmt_clock(time.perf_counter() - self.started)} elapsed, ETA {eta}",
            file=self.stream,
            flush=True,
        )


def tune(
    model,
    target_length: int,
    token_ids: torch.Tensor,
    *,
    budget: float = DEFAULT_BUDGET,
    methods: list[str] | None = None,
    knots: int = 6,
    step: float = 0.15,
    eta: int = DEFAULT_ETA,
    log_path=None,
    resume: bool = True,
    header: dict[str, Any] | None = None,
    objective: Callable[[Candidate, int], Evaluation] | None = None,
    progress: bool = True,
    attention_factor: float | None = None,
) -> TuneResult:
    """Search RoPE scalings of `model` for `target_length` on calibration `token_ids`; see the module docstring.

    `budget` is in target-length forwards (`eval_cost`); `log_path` makes the run resumable. `attention_factor`
    pins the per-dimension curves' attention factor (1.0 keeps the model inside the window exactly the original;
    default: searched). Closed forms keep their own.
    """
    if attention_factor is not None and not (0.0 < attention_factor <= 4.0):
        raise ValueError(
            f"attention_factor={attention_factor!r} is outside (0, 4]; use 1.0 to keep the original model inside "
            "the window, or leave it unset to search it"
        )
    geom = geometry_of(model, target_length)
    token_ids = token_ids.reshape(-1)
    objective = objective or CalibrationObjective(model, token_ids, geom.original_length)
    if hasattr(objective, "check_length"):
        objective.check_length(geom.target_length)
    rungs, schedule = plan_schedule(budget, rung_lengths(geom.original_length, geom.target_length),
                                    geom.target_length, eta)
    settings = {
        "target_length": geom.target_length, "original_length": geom.original_length, "rotary_dim": geom.rotary_dim,
        "base": geom.base, "budget": budget, "methods": methods, "knots": knots, "step": step, "eta": eta,
        "rungs": rungs, "schedule": schedule, "text_tokens": int(token_ids.numel()),
        "text_sha": _fingerprint(token_ids[: geom.target_length]),
        **({"attention_factor": attention_factor} if attention_factor is not None else {}),
        **(header or {}),
    }
    search = Search(geom, objective, rungs, SearchLog(log_path, settings, resume=resume),
                    _Progress(search_cost(rungs, schedule, geom), sum(schedule)) if progress else None)
    # rung 0: the closed-form grid (in priority order, at most half the slots unless per-dim is off), then
    # per-dimension curves seeded from the best closed form
    closed = closed_form_grid(geom, methods)[: schedule[0] if knots == 0 else math.ceil(schedule[0] / 2)]
    for cand in closed:
        search.evaluate(0, cand)
    if knots:
        search.improve_curves(schedule[0] - len(closed), knots, step, attention_factor)
    for rung in range(1, len(rungs)):
        search.promote(rung, schedule[rung])
    return search.result(budget, schedule)


def search_cost(rungs: list[int], schedule: list[int], geom: Geometry) -> float:
    """The planned cost of a schedule, in target-length forwards."""
    return sum(n * eval_cost(length, geom.target_length) for n, length in zip(schedule, rungs))


class Search:
    """The state of one successive-halving run: every candidate evaluated at each rung (from the log when it holds
    it, else by `objective`), the budget spent, and the progress line."""

    def __init__(self, geom: Geometry, objective, rungs: list[int], log: SearchLog, bar: _Progress | None):
        self.geom, self.objective, self.rungs, self.log, self.bar = geom, objective, rungs, log, bar
        self.costs = [eval_cost(n, geom.target_length) for n in rungs]
        self.seen: dict[str, Candidate] = {}
        self.results: dict[int, dict[str, Scored]] = {r: {} for r in range(len(rungs))}
        self.spent = 0.0
        self.started = time.perf_counter()

    def evaluate(self, rung: int, cand: Candidate) -> Scored:
        """`cand`'s loss at the rung's length: the log's record when it holds one, else a fresh evaluation logged."""
        length = self.rungs[rung]
        self.seen[cand.key] = cand
        if cand.key in self.results[rung]:
            return self.results[rung][cand.key]
        rec = self.log.get(cand.key, length)
        fresh = rec is None
        if fresh:
            ev = self.objective(cand, length)
            rec = {"key": cand.key, "name": cand.name, "family": cand.family, "rung": rung, "length": length,
                   "loss": ev.loss, "n_tokens": ev.n_tokens, "seconds": round(ev.seconds, 3),
                   "cost": self.costs[rung], "spec": cand.spec, "origin": cand.origin}
            self.log.add(rec)
        self.spent += self.costs[rung]
        if self.bar:
            self.bar.update(rung, length, cand, rec, self.costs[rung], fresh)
        scored = Scored(cand, float(rec["loss"]), length)
        self.results[rung][cand.key] = scored
        return scored

    def ranked(self, rung: int, family: str | None = None) -> list[Scored]:
        pool = [s for s in self.results[rung].values() if family is None or s.candidate.family == family]
        return sorted(pool, key=lambda s: (s.loss, s.candidate.name, s.candidate.key))

    def improve_curves(self, slots: int, knots: int, step: float, attention_factor: float | None) -> None:
        """Rung 0's remaining `slots`: per-dimension curves seeded from the best closed form, improved by coordinate
        moves (move to the best improving neighbour; halve the step when none improves)."""
        if slots <= 0:
            return
        seed = self.ranked(0, "closed")[0]
        # with a pinned attention factor the seed's curve is itself a new candidate: improve on the best curve
        start, start_loss, cur_step = None, seed.loss if attention_factor is None else math.inf, step
        while slots > 0 and cur_step >= step / 16:
            moves = [m for m in per_dim_moves(self.geom, seed.candidate.name, seed.candidate.spec, start, knots,
                                              cur_step, attention_step=cur_step / 7.5,
                                              pinned_attention=attention_factor)
                     if m.key not in self.results[0]][:slots]
            for m in moves:
                self.evaluate(0, m)
            slots -= len(moves)
            best = self.ranked(0, "per-dim")
            if best and best[0].loss < start_loss:
                start, start_loss = best[0].candidate.origin, best[0].loss
            else:
                cur_step /= 2

    def promote(self, rung: int, keep: int) -> None:
        """Evaluate at `rung` the previous rung's best `keep`, always including the best of each family."""
        promoted = self.ranked(rung - 1)[:keep]
        for family in ("closed", "per-dim"):
            best = self.ranked(rung - 1, family)
            if best and best[0] not in promoted and keep >= 2:
                # replace the worst promoted candidate of an over-represented family
                other = [s for s in promoted if s.candidate.family != family]
                if len(other) > 1:
                    promoted.remove(other[-1])
                    promoted.append(best[0])
        for s in sorted(promoted, key=lambda s: (s.loss, s.candidate.name)):
            self.evaluate(rung, s.candidate)

    def result(self, budget: float, schedule: list[int]) -> TuneResult:
        """The winner at the last rung, and the best of each family at the longest rung it reached."""
        return TuneResult(
            geometry=self.geom,
            rungs=self.rungs,
            schedule=schedule,
            budget=budget,
            records=list(self.log.records) if self.log.path else [],
            winner=self.ranked(len(self.rungs) - 1)[0],
            best_closed=_best_of(self.results, "closed"),
            best_per_dim=_best_of(self.results, "per-dim"),
            spent=self.spent,
            seconds=time.perf_counter() - self.started,
            candidates=self.seen,
        )


def _best_of(results: dict[int, dict[str, Scored]], family: str) -> Scored | None:
    """The best candidate of a family at the longest rung it reached."""
    for rung in sorted(results, reverse=True):
        pool = [s for s in results[rung].values() if s.candidate.family == family]
        if pool:
            return min(pool, key=lambda s: (s.loss, s.candidate.name, s.candidate.key))
    return None


def _fingerprint(ids: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()[:16]
