"""The per-disk table of a model's RoPE: what each rotary pair ("disk") does, before and after a method.

Each rotary pair i is a disk that turns θ_i radians per token. Its wavelength is λ_i = 2π/θ_i tokens and it makes
r_i = L/λ_i full turns within the original (pretraining) length L. Disks with r_i >= 1 have seen every angle during
pretraining; disks with r_i < 1 have not, and positions beyond L show them angles they never saw, which is why
naive extrapolation breaks and why every scaling method slows the slow disks down.

A method replaces θ_i by θ'_i. The ratio θ'_i/θ_i classifies each disk:

- extrapolated: ratio ≈ 1, the disk keeps its speed (high frequencies, local order);
- interpolated: ratio ≈ 1/s, the disk is slowed down by the full factor (position interpolation);
- blended: strictly between (YaRN/NTK-by-parts ramp, llama3 smooth band, NTK's geometric change);
- other: outside [1/s, 1] (possible with LongRoPE's searched factors);
- unchanged: no scaling at all (the bare model).

Dynamic methods are shown at the target length (the frequencies they use when the sequence reaches it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import compat
from ..encodings import rope_rotations, rope_wavelengths
from ..facts import read_rope
from ..methods import default_inv_freq
from ..plan import check_rope_model, plan_patch, recorded_spec
from ..spec import RopeSpec, load_spec

# Relative tolerance of the regime classification (ratios ≈ 1 and ≈ 1/s). YaRN's ramp ends are exact up to float32
# rounding, so 1e-4 separates them from the first blended disk (whose weight is at least 1/(high-low) of the way).
REGIME_RTOL = 1e-4


@dataclass
class DiskRow:
    """One rotary pair (disk) of the inspected slot."""

    index: int
    old_inv_freq: float  # θ_i of the unscaled model (base^(-2i/d))
    new_inv_freq: float  # θ'_i after the method (= old without a spec, or the model's shipped scheme)
    wavelength: float  # λ_i = 2π/θ_i (old)
    new_wavelength: float  # 2π/θ'_i
    rotations: float  # r_i = L/λ_i: turns within the original length
    rotations_at_target: float  # turns of the new disk within the target length
    ratio: float  # θ'_i/θ_i
    regime: str


@dataclass
class RopeInspection:
    """The per-disk table plus what it was computed from."""

    model_type: str
    slot: str | None
    rotary_dim: int
    base: float
    original_length: int
    target_length: int
    factor: float
    method: str | None  # None: no spec, the model's current RoPE
    current_rope_type: str
    attention_factor: float
    rows: list[DiskRow]
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.regime] = out.get(row.regime, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["counts"] = self.counts()
        return data


def classify(ratio: float, factor: float, rtol: float = REGIME_RTOL) -> str:
    """Regime of a disk from θ'/θ (see module docstring)."""
    near_one = math.isclose(ratio, 1.0, rel_tol=rtol)
    near_inv = math.isclose(ratio, 1.0 / factor, rel_tol=rtol) if factor > 0 else False
    if near_one and (near_inv or factor <= 1):
        return "unchanged"
    if near_one:
        return "extrapolated"
    if near_inv:
        return "interpolated"
    if 1.0 / factor < ratio < 1.0:
        return "blended"
    return "other"


def load_config(source: str | Path, revision: str | None = None):
    """The text config of a local folder or Hub id (resolved through the Hub cache, config.json only)."""
    from ..files import load_config as load_checkpoint_config
    from ..hub import resolve_source

    return compat.text_config(load_checkpoint_config(resolve_source(str(source), revision=revision, config_only=True)))


def _current_rope(config, slot, dim: int, params: dict) -> tuple[torch.Tensor, float]:
    """The frequencies the model builds now (its shipped scheme, e.g. llama3), falling back to plain RoPE."""
    if params.get("rope_type", "default") == "default":
        return default_inv_freq(dim, params["rope_theta"]), 1.0
    try:
        inv_freq, attention = compat.stock_rope(config, slot)
        return inv_freq.float(), float(attention)
    except Exception:
        return default_inv_freq(dim, params["rope_theta"]), 1.0


def _rows(old: torch.Tensor, new: torch.Tensor, original: int, target: int, factor: float) -> list[DiskRow]:
    wavelengths, new_wavelengths = rope_wavelengths(old), rope_wavelengths(new)
    rotations, rotations_target = rope_rotations(old, original), rope_rotations(new, target)
    rows = []
    for i in range(old.shape[0]):
        ratio = float(new[i].double() / old[i].double())
        rows.append(
            DiskRow(
                index=i,
                old_inv_freq=float(old[i]),
                new_inv_freq=float(new[i]),
                wavelength=float(wavelengths[i]),
                new_wavelength=float(new_wavelengths[i]),
                rotations=float(rotations[i]),
                rotations_at_target=float(rotations_target[i]),
                ratio=ratio,
                regime=classify(ratio, factor),
            )
        )
    return rows


def inspect_rope(config, spec: RopeSpec | dict | str | None = None, **kwargs: Any) -> RopeInspection:
    """The per-disk table of `config`'s RoPE, before and after `spec` (or the model's current RoPE without one).

    With a spec on a model that already ships a scheme (llama3, yarn...), the spec is re-derived from the original
    length and base (as `replace_existing: true` would), and a note says so.
    """
    facts = read_rope(config)
    config = facts.config
    check_rope_model(config)
    current_type = facts.slots[facts.main_slot].get("rope_type", "default")
    notes: list[str] = []
    if spec is None and not kwargs:
        shown = _current_frequencies(config, facts, current_type, notes)
    else:  # the Python API's edge (the CLI passes a parsed spec: passed through)
        shown = _planned_frequencies(config, facts, load_spec(spec, **kwargs), current_type, notes)
    rows = _rows(shown.old.float(), shown.new.float(), shown.original, shown.target, shown.factor)
    unseen = [r.index for r in rows if r.rotations < 1]
    if unseen:
        beyond = (f"{shown.method} maps every distance the model attends over into {shown.original} tokens, so no "
                  "position shows them an angle unseen in pretraining" if shown.keeps else
                  f"positions beyond {shown.original} show them angles never seen in pretraining")
        notes.append(f"disks {unseen[0]}..{unseen[-1]} make less than one turn in {shown.original} tokens: {beyond}")
    return RopeInspection(
        model_type=str(getattr(config, "model_type", "?")),
        slot=shown.slot,
        rotary_dim=shown.dim,
        base=shown.base,
        original_length=shown.original,
        target_length=shown.target,
        factor=shown.factor,
        method=shown.method,
        current_rope_type=current_type,
        attention_factor=float(shown.attention),
        rows=rows,
        notes=notes,
    )


@dataclass
class Frequencies:
    """What the disk table compares: the slot shown, its rotary dimensions and base, the original and target lengths
    and the factor the regimes are read at, the method (None: the model's current RoPE), the bare RoPE's
    frequencies (`old`) and the ones shown beside them (`new`, with their attention factor); `keeps`: the method
    keeps the model's RoPE and remaps attention distances (attention-level)."""

    slot: str | None
    dim: int
    base: float
    original: int
    target: int
    factor: float
    method: str | None
    old: torch.Tensor
    new: torch.Tensor
    attention: float
    keeps: bool = False


def _current_frequencies(config, facts, current_type: str, notes: list[str]) -> Frequencies:
    """The model's RoPE as it builds it now (its shipped scheme, or plain RoPE) beside the bare RoPE, at its own
    maximum length; what it ships, and a rope-extend marker's method, go to `notes`."""
    slot = facts.main_slot
    params = facts.slots[slot]
    dim = compat.rotary_dim(config, params, slot)
    base = float(params["rope_theta"])
    original = facts.original_length()
    new, attention = _current_rope(config, slot, dim, params)
    factor = float(params.get("factor") or 1.0)
    if current_type != "default":
        notes.append(f"the model ships {current_type} scaling (x{factor:g} from {original}); 'new' is that scheme, "
                     "'old' the bare RoPE")
    marker = facts.marker or {}
    marked = recorded_spec(config)
    if marker.get("stock_loaders") and marked is not None:  # attention-level: no config key carries it, the marker does
        notes.append(f"rope_extend marker: {marker['method']} ({marked.rope_method.describe(marked)}); "
                     f"stock loaders serve {marker['stock_loaders']}")
    return Frequencies(slot, dim, base, original, int(config.max_position_embeddings), factor, None,
                       default_inv_freq(dim, base), new, attention)


def _planned_frequencies(config, facts, spec: RopeSpec, current_type: str, notes: list[str]) -> Frequencies:
    """`spec` planned on the model (re-derived from the original length over a shipped scheme; a shorter window
    allowed, for the table) beside the bare RoPE, a dynamic method at the target length; what was assumed, and the
    plan's warnings, go to `notes`."""
    keeps = spec.rope_method.keeps_scheme  # attention-level methods keep the model's scheme: nothing re-derived
    if facts.is_scaled and not keeps:
        if not spec.replace_existing:
            notes.append(f"the model already ships {current_type} scaling; shown: {spec.method} re-derived from the "
                         "original length and base (replace_existing: true)")
        spec = spec.model_copy(update={"replace_existing": True})
    resolved = spec.resolve(spec.original_max_position_embeddings or facts.original_length())
    if not keeps and facts.window and resolved.target_length < facts.window and not spec.shorten_window:
        notes.append(f"{spec.method} x{resolved.factor:g} reaches {resolved.target_length} tokens, shorter "
                     f"than the model's {facts.window} now: patch refuses it unless asked (shorten_window: true)")
        spec = spec.model_copy(update={"shorten_window": True})
    plan = plan_patch(config, spec)
    slot, resolved = plan.targets[0], plan.spec
    original, target, factor = int(resolved.original_max_position_embeddings), int(resolved.target_length), \
        float(resolved.factor)
    dynamic = plan.method.dynamic
    new, attention = plan.compute(slot, seq_len=target if dynamic else None)
    if dynamic:
        notes.append(f"{resolved.method} is dynamic: frequencies shown at {target} tokens; below {original} it is the "
                     "original RoPE")
    if keeps:
        notes.append(f"{resolved.method} keeps the model's RoPE ({plan.kept_scheme}; 'new' is that scheme, 'old' the "
                     f"bare RoPE) and remaps attention distances instead: {plan.method.describe(resolved)}")
        factor = float(plan.slots[slot].get("factor") or 1.0)  # the regimes of the kept scheme
    untouched = [s for s in facts.slots if s not in plan.targets] if len(plan.targets) > 1 or len(facts.slots) > 1 \
        else []
    if untouched:
        notes.append(f"layer types {untouched} keep their RoPE (shown: {slot})")
    notes.extend(plan.warnings)
    dim = plan.rotary_dims[slot]
    return Frequencies(slot, dim, plan.base_theta, original, target, factor, resolved.method,
                       default_inv_freq(dim, plan.base_theta), new, attention, keeps)
