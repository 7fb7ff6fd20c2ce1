"""The search space of `rope-extend tune`: closed forms with their parameters, then free per-dimension curves.

A `Candidate` is a name plus a plain spec dict (what `patch_model` takes). Closed forms are themselves (`yarn` with
a factor and betas, `llama3` with its frequency factors, `ntk` with its factor...). Per-dimension candidates are
`longrope` specs whose short factors are all 1 (inside the original window the model is the original) and whose long
factors are a seed's per-dimension factors (a closed form's `θ_i / θ'_i`) moved by a monotone curve over
log-wavelength with a few knots:

    log f_i = max(0, cummax_i(log seed_i + Σ_k c_k · hat_k(i)))

`hat_k` are piecewise-linear bumps at `knots` equally spaced disk indices (log-wavelength is linear in the disk
index), so `c = 0` is the seed exactly and every candidate is non-decreasing from fast to slow dimensions and >= 1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from ..methods import RopeContext, advice, all_methods, compute, default_inv_freq, tune_methods


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: a display name, the spec dict, and where it came from."""

    name: str
    spec: dict[str, Any]
    family: str  # "closed" or "per-dim"
    origin: dict[str, Any] = field(default_factory=dict)  # e.g. {"seed": "yarn x2", "knot": 3, "step": 0.1}

    @property
    def key(self) -> str:
        """Stable id of the spec (the resume log matches candidates by it)."""
        text = json.dumps(self.spec, sort_keys=True, separators=(",", ":"), default=float)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Geometry:
    """What the search needs to know about the model's RoPE."""

    rotary_dim: int
    base: float
    original_length: int
    target_length: int

    @property
    def factor(self) -> float:
        return self.target_length / self.original_length

    @property
    def n_freq(self) -> int:
        return self.rotary_dim // 2


def _round(x: float, nd: int = 4) -> float:
    return float(round(x, nd))


def closed_form_grid(geom: Geometry, methods: list[str] | None = None) -> list[Candidate]:
    """Closed forms around the nominal factor s = N / L, the most promising of each method first.

    The factor is not fixed to N/L: a larger factor trades some inside-range sharpness for margin at the far end.
    Methods take turns (by default the registry's `tune_methods()`: yarn, llama3, ntk, ntk-by-parts, linear), so a
    budget that screens only the first k candidates still covers every family.
    """
    s = geom.factor
    methods = methods or tune_methods()
    out: list[Candidate] = []
    grid = {m: advice(m).tune_candidates(s) for m in methods}
    unknown = [m for m in methods if not grid[m]]
    if unknown:
        searchable = [m.name for m in all_methods() if advice(m).tune_candidates(s)]
        raise ValueError(
            f"tune cannot search method {unknown[0]!r} as a closed form (dynamic methods change with the length); "
            f"choose from {', '.join(searchable)}"
        )
    # round-robin over the methods so a small budget still screens every family
    lists = [list(grid[m]) for m in methods]
    while any(lists):
        for items in lists:
            if items:
                name, spec = items.pop(0)
                out.append(Candidate(name, spec, "closed"))
    return out


# --- per-dimension curves -----------------------------------------------------------------------------------------
def closed_form_factors(geom: Geometry, spec: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """(per-dimension factors θ_i / θ'_i as float64, attention factor) of a static closed-form spec."""
    params = {k: v for k, v in spec.items() if k not in ("method", "factor")}
    ctx = RopeContext(
        rotary_dim=geom.rotary_dim,
        base=geom.base,
        original_max_position_embeddings=geom.original_length,
        factor=float(spec.get("factor", geom.factor)),
        params=params,
        seq_len=geom.target_length,
    )
    inv_freq, attention = compute(spec["method"], ctx)
    original = default_inv_freq(geom.rotary_dim, geom.base)
    return (original.double() / inv_freq.double()), float(attention)


def knot_positions(n_freq: int, knots: int) -> torch.Tensor:
    return torch.linspace(0, n_freq - 1, knots, dtype=torch.float64)


def hat_basis(n_freq: int, knots: int) -> torch.Tensor:
    """(knots, n_freq) piecewise-linear bumps over the disk index (a partition of unity)."""
    pos = knot_positions(n_freq, knots)
    idx = torch.arange(n_freq, dtype=torch.float64)
    width = pos[1] - pos[0]
    return torch.clamp(1 - (idx[None, :] - pos[:, None]).abs() / width, min=0)


def curve_factors(seed: torch.Tensor, coeffs: list[float]) -> list[float]:
    """Long factors: the seed moved by the knot coefficients, non-decreasing and >= 1."""
    log_f = seed.double().log()
    if coeffs:
        log_f = log_f + torch.tensor(coeffs, dtype=torch.float64) @ hat_basis(seed.numel(), len(coeffs))
    log_f = torch.cummax(torch.clamp(log_f, min=0.0), dim=0).values
    return [_round(v, 6) for v in log_f.exp().tolist()]


def per_dim_candidate(
    geom: Geometry, seed_name: str, seed: torch.Tensor, coeffs: list[float], attention: float, tag: str
) -> Candidate:
    spec = {
        "method": "longrope",
        "factor": geom.factor,
        "short_factor": [1.0] * geom.n_freq,
        "long_factor": curve_factors(seed, coeffs),
        "attention_factor": _round(attention, 5),
    }
    origin = {"seed": seed_name, "coeffs": [_round(c) for c in coeffs], "attention_factor": _round(attention, 5)}
    return Candidate(f"per-dim[{seed_name}] {tag}", spec, "per-dim", origin)


def per_dim_moves(
    geom: Geometry,
    seed_name: str,
    seed_spec: dict[str, Any],
    start: dict[str, Any] | None = None,
    knots: int = 6,
    step: float = 0.15,
    attention_step: float = 0.02,
    pinned_attention: float | None = None,
) -> list[Candidate]:
    """One round of coordinate moves around `start` (coeffs + attention; default: the seed itself, which is the
    closed form already evaluated, so it is not repeated).

    The attention factor moves by `attention_step`, then each knot (slowest first) up and down by `step` in
    log-factor (0.15 = a 16 % change of the local factor). Deterministic: no random numbers are drawn.

    `pinned_attention`: the attention factor is fixed at this value and never moved (1.0: inside the window the
    tuned model is exactly the original, since its short factors are all 1). The seed's curve with the pinned
    factor is then a new model, so the first round starts with it.
    """
    seed, seed_attention = closed_form_factors(geom, seed_spec)
    coeffs = list(start["coeffs"]) if start else [0.0] * knots
    if pinned_attention is not None:
        attention = float(pinned_attention)
    else:
        attention = float(start["attention_factor"]) if start else seed_attention
    current = per_dim_candidate(geom, seed_name, seed, coeffs, attention, "")
    out = []
    if pinned_attention is not None:
        if start is None:
            out.append(per_dim_candidate(geom, seed_name, seed, coeffs, attention, f"attn{attention:.3f} pinned"))
    else:
        for sign in (+1, -1):
            a = attention + sign * attention_step
            if a > 0:
                out.append(per_dim_candidate(geom, seed_name, seed, coeffs, a, f"attn{a:.3f}"))
    # slow dimensions first: they decide what happens beyond the window
    for k in reversed(range(len(coeffs))):
        for sign in (+1, -1):
            moved = list(coeffs)
            moved[k] = moved[k] + sign * step
            cand = per_dim_candidate(geom, seed_name, seed, moved, attention, f"knot{k}{'+' if sign > 0 else '-'}{step:g}")
            if cand.spec["long_factor"] != current.spec["long_factor"]:  # clamped away: not a move
                out.append(cand)
    return out


def geometry_of(model, target_length: int) -> Geometry:
    """The model's rotary dim, base and original length (read from its config as `patch_model` would)."""
    from .. import compat

    config = compat.text_config(model.config)
    slots = compat.read_slots(config)
    slot = slots.get("full_attention", slots.get(compat.FLAT))
    if slot.get("rope_type", "default") != "default":
        raise ValueError(
            f"the model already carries RoPE scaling ({slot.get('rope_type')}); tune searches from an unscaled "
            "model: load the original checkpoint"
        )
    original = int(config.max_position_embeddings)
    if target_length <= original:
        raise ValueError(
            f"target length {target_length} is not beyond the model's window {original}; choose a longer target"
        )
    return Geometry(compat.rotary_dim(config, slot), float(slot["rope_theta"]), original, int(target_length))
