"""Look inside a model's RoPE: the per-dimension "disks", what a scaling method does to each, and a recommendation.

Each rotary pair i is a disk that turns θ_i radians per token. Its wavelength is λ_i = 2π/θ_i tokens and it makes
r_i = L/λ_i full turns within the original (pretraining) length L. Disks with r_i >= 1 have seen every angle during
pretraining; disks with r_i < 1 have not, and positions beyond L show them angles they never saw, which is why
naive extrapolation breaks and why every scaling method slows the slow disks down.

A method replaces θ_i by θ'_i. The ratio θ'_i/θ_i classifies each disk:

- extrapolated: ratio ≈ 1, the disk keeps its speed (high frequencies, local order);
- interpolated: ratio ≈ 1/s, the disk is slowed down by the full factor (position interpolation);
- blended: strictly between (YaRN/NTK-by-parts ramp, llama3 smooth band, NTK's geometric change);
- other: outside [1/s, 1] (possible with LongRoPE's searched factors);
- unchanged: no scaling at all (factor 1, or the bare model).

Dynamic methods are shown at the target length (the frequencies they use when the sequence reaches it).

`inspect_rope(config, spec=None)` builds the table, `recommend(config, target_length)` picks a factor and a method
with reasons, `plot_methods(...)` draws several methods side by side. All take a transformers config; nothing loads
model weights.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import compat
from .encodings import rope_kernel, rope_rotations, rope_wavelengths
from .errors import CheckpointError, SpecError
from .facts import read_rope
from .methods import RopeContext, advice, all_methods, compute, default_inv_freq, get_method, method_names
from .plan import check_rope_model, plan_patch
from .spec import RopeSpec, load_spec

# Relative tolerance of the regime classification (ratios ≈ 1 and ≈ 1/s). YaRN's ramp ends are exact up to float32
# rounding, so 1e-4 separates them from the first blended disk (whose weight is at least 1/(high-low) of the way).
REGIME_RTOL = 1e-4
PLOT_METHODS = ("linear", "ntk", "yarn", "ntk-by-parts", "llama3")


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
    from .files import load_config as load_checkpoint_config
    from .hub import resolve_source

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
    slots = facts.slots
    slot = facts.main_slot
    params = slots[slot]
    current_type = params.get("rope_type", "default")
    notes: list[str] = []
    if spec is None and not kwargs:
        dim = compat.rotary_dim(config, params, slot)
        base = float(params["rope_theta"])
        original = facts.original_length()
        old = default_inv_freq(dim, base)
        new, attention = _current_rope(config, slot, dim, params)
        factor = float(params.get("factor") or 1.0)
        target = int(config.max_position_embeddings)
        if current_type != "default":
            notes.append(
                f"the model ships {current_type} scaling (x{factor:g} from {original}); 'new' is that scheme, "
                "'old' the bare RoPE"
            )
        method = None
    else:
        if not isinstance(spec, RopeSpec) or kwargs:  # the Python API's edge (the CLI passes a parsed spec)
            spec = load_spec(spec, **kwargs)
        keeps = spec.rope_method.keeps_scheme  # STRING: the model's scheme stays, so nothing is re-derived
        if facts.is_scaled and not keeps:
            if not spec.replace_existing:
                notes.append(
                    f"the model already ships {current_type} scaling; shown: {spec.method} re-derived from the "
                    "original length and base (replace_existing: true)"
                )
            spec = spec.model_copy(update={"replace_existing": True})
        resolved = spec.resolve(spec.original_max_position_embeddings or facts.original_length())
        if facts.window and resolved.target_length < facts.window and not spec.shorten_window:
            notes.append(f"{spec.method} x{resolved.factor:g} reaches {resolved.target_length} tokens, shorter "
                         f"than the model's {facts.window} now: patch refuses it unless asked (shorten_window: true)")
            spec = spec.model_copy(update={"shorten_window": True})
        plan = plan_patch(config, spec)
        slot = plan.targets[0]
        dim = plan.rotary_dims[slot]
        base = plan.base_theta
        resolved = plan.spec
        original = int(resolved.original_max_position_embeddings)
        target = int(resolved.target_length)
        factor = float(resolved.factor)
        method = resolved.method
        old = default_inv_freq(dim, base)
        dynamic = plan.method.dynamic
        new, attention = plan.compute(slot, seq_len=target if dynamic else None)
        if dynamic:
            notes.append(f"{method} is dynamic: frequencies shown at {target} tokens; below {original} it is the "
                         "original RoPE")
        if keeps:
            notes.append(f"{method} keeps the model's RoPE ({plan.kept_scheme}; 'new' is that scheme, 'old' the bare "
                         f"RoPE) and remaps attention distances instead: {plan.method.describe(resolved)}")
            factor = float(plan.slots[slot].get("factor") or 1.0)  # the regimes of the kept scheme
        if len(plan.targets) > 1 or len(slots) > 1:
            untouched = [s for s in slots if s not in plan.targets]
            if untouched:
                notes.append(f"layer types {untouched} keep their RoPE (shown: {slot})")
        notes.extend(plan.warnings)
    rows = _rows(old.float(), new.float(), original, target, factor)
    unseen = [r.index for r in rows if r.rotations < 1]
    if unseen:
        notes.append(
            f"disks {unseen[0]}..{unseen[-1]} make less than one turn in {original} tokens: positions beyond "
            f"{original} show them angles never seen in pretraining"
        )
    return RopeInspection(
        model_type=str(getattr(config, "model_type", "?")),
        slot=slot,
        rotary_dim=dim,
        base=base,
        original_length=original,
        target_length=target,
        factor=factor,
        method=method,
        current_rope_type=current_type,
        attention_factor=float(attention),
        rows=rows,
        notes=notes,
    )


# --- recommendation --------------------------------------------------------------------------------------------------
@dataclass
class Recommendation:
    target_length: int
    original_length: int
    factor: float  # minimal factor: target / original
    method: str | None  # None: no scaling needed
    alternatives: dict[str, str]
    reasons: list[str]
    costs: dict[str, dict[str, float]]  # method -> {"changed": fraction of disks moved, "high_shift": ...}
    # what this project measured at this ratio when it is a warning (rope_extend.measured), else None
    caveat: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def short_context_cost(inspection: RopeInspection) -> dict[str, float]:
    """How much a method moves the disks that matter at short range.

    changed: fraction of disks whose frequency changes (ratio not ≈ 1).
    high_shift: mean |log2 ratio| over the fastest quarter of the disks (0 = untouched, log2 s = interpolated).
    """
    rows = inspection.rows
    changed = sum(1 for r in rows if r.regime not in ("extrapolated", "unchanged")) / len(rows)
    quarter = rows[: max(1, len(rows) // 4)]
    high = sum(abs(math.log2(r.ratio)) for r in quarter) / len(quarter)
    return {"changed": changed, "high_shift": high}


def recommend(config, target_length: int) -> Recommendation:
    """Minimal factor and a method to reach `target_length` tokens, with the reasons as lines.

    Rules (simple on purpose):
    1. factor = target / L, with L the pretraining length (a shipped scheme's original length). If the model
       already reaches the target (max_position_embeddings >= target), no change is needed.
    2. A model that ships llama3 scaling keeps llama3 (re-derived at the new factor): it was tuned with it.
    3. Otherwise yarn: the best training-free static method, reproduced by every stock loader (transformers, vLLM,
       llama.cpp). When short-context quality matters and you serve in-process, dynamic-yarn (rope_extend.patch_model)
       or dynamic (stock transformers) are the original model below L. The reasons quote the slowest disk's turns at
       the target without scaling vs within L, and each method's short-context cost from the disk table.
    """
    config = compat.text_config(config)
    if not isinstance(target_length, int) or isinstance(target_length, bool) or target_length <= 0:
        raise SpecError(f"--target-length must be a positive number of tokens, got {target_length!r}",
                        field="target_length", value=target_length)
    from .spec import MAX_FACTOR, MAX_TOKENS

    if target_length > MAX_TOKENS:
        raise SpecError(f"--target-length {target_length} is beyond the sane range [1, {MAX_TOKENS}] (llama.cpp "
                        "positions are int32; no model serves more); choose a shorter target",
                        field="target_length", value=target_length)
    base_view = inspect_rope(config)
    facts = read_rope(config)
    current_type = facts.slots[facts.main_slot].get("rope_type", "default")
    original = base_view.original_length
    current_max = int(config.max_position_embeddings)
    factor = target_length / original
    if factor > MAX_FACTOR:
        raise SpecError(f"--target-length {target_length} is {factor:g} x the original length {original}, beyond the "
                        f"sane range of factors [1, {MAX_FACTOR:g}]; choose a target <= {int(MAX_FACTOR * original)}",
                        field="target_length", value=target_length)
    reasons: list[str] = []
    costs: dict[str, dict[str, float]] = {}
    slowest = base_view.rows[-1]
    turns_target = target_length / slowest.wavelength
    reasons.append(
        f"minimal factor = target / original length = {target_length} / {original} = {factor:.4g}"
    )
    if target_length <= current_max:
        reasons.append(
            f"the model already serves {current_max} tokens ({current_type} RoPE) >= {target_length}: no scaling needed"
        )
        inside = {m.name: why for m in all_methods() if (why := advice(m).inside_window())}
        return Recommendation(target_length, original, factor, None, inside, reasons, costs)
    if factor <= 1:
        reasons.append(f"target {target_length} <= original length {original}: no scaling needed")
        return Recommendation(target_length, original, factor, None, {}, reasons, costs)
    reasons.append(
        "each rotary pair of query/key dimensions (a \"disk\") turns by a fixed angle per token; without scaling "
        f"the slowest disk (i={slowest.index}, wavelength {slowest.wavelength:.4g} tokens) turns "
        f"{turns_target:.3g} times at {target_length} vs {slowest.rotations:.3g} within {original}: "
        + ("angles beyond L were never seen in pretraining" if slowest.rotations < 1 else
           "it completed full turns in pretraining, but beyond L the relative distances are new")
    )
    unseen = sum(1 for r in base_view.rows if r.rotations < 1)
    reasons.append(f"{unseen} of {len(base_view.rows)} disks make less than one turn in {original} tokens; "
                   "interpolating them is what every method does")
    compared = sorted((m for m in all_methods() if advice(m).preference is not None), key=lambda m: advice(m).preference)
    for candidate in compared:
        try:
            view = inspect_rope(config, method=candidate.name, factor=factor)
        except (SpecError, ValueError):
            continue
        costs[candidate.name] = short_context_cost(view)
    if costs:
        reasons.append(
            "short-context cost (fraction of disks moved; mean shift of the fastest quarter in octaves, "
            f"log2 s = {math.log2(factor):.3f} means fully interpolated): "
            + "; ".join(f"{name} {c['changed']:.0%}, {c['high_shift']:.3f}" for name, c in costs.items())
        )
    shipped = get_method(current_type) if current_type in method_names() else None
    if shipped is not None and advice(shipped).kept_when_shipped and current_type in costs_or_accepted(
            config, current_type, factor, costs):
        method = current_type
        reasons.append(f"the model already ships {current_type} scaling: keep its family's scheme, re-derived at the "
                       "new factor (--set replace_existing=true)")
    else:
        best = compared[0].name  # the preferred static method (yarn)
        method = next(iter(costs), None)  # the most preferred one the model's config accepts
        if method is None:
            reasons.append(f"{base_view.model_type} configs accept none of {', '.join(m.name for m in compared)}")
        elif method != best:
            reasons.append(f"{base_view.model_type} configs do not accept {best}; {method} is the most preferred "
                           "method they accept")
        elif len(costs) > 1:
            fullest = max(costs, key=lambda name: costs[name]["changed"])
            attention = inspect_rope(config, method=method, factor=factor).attention_factor
            reasons.append(
                f"{method} keeps the fast disks (moves {costs[method]['changed']:.0%} vs {fullest}'s "
                f"{costs[fullest]['changed']:.0%})" + (f" and adds a temperature {attention:.4f}" if attention != 1
                                                       else "")
                + "; transformers, vLLM and llama.cpp all load it: recommended for static serving"
            )
        else:
            reasons.append(f"{method}: the best training-free static method, loaded by every stock engine")
        if method is not None and current_type != "default":
            reasons.append(f"the model ships {current_type} scaling: {method} is re-derived from the original length "
                           f"{original} (--set replace_existing=true)")
    # in the words of the README's "Which method when" (engines serve yarn, the recommendation)
    alternatives = {}
    for other in all_methods():
        why = advice(other).alternative(factor, method) if other.name != method else None
        if why and (advice(other).preference is None or other.name in costs):
            alternatives[other.name] = why
    return with_measurements(Recommendation(target_length, original, factor, method, alternatives, reasons, costs))


def with_measurements(advice: Recommendation) -> Recommendation:
    """The recommendation with what this project measured at its ratio (or that nothing was), and the commands that
    measure it on the user's model and train it at the new length."""
    from .measured import at_ratio

    if advice.method is None:
        return advice
    measured = at_ratio(advice.factor, advice.method)
    spec = f"method={advice.method},target_length={advice.target_length}"
    advice.reasons.extend(measured.lines)
    advice.reasons.append(
        f"measure it on your model: rope-extend eval SOURCE --spec {spec} -o report/ (passkey and perplexity, "
        f"patched vs unpatched); to train at the new length: rope-extend train SOURCE --method {advice.method} "
        f"--target-length {advice.target_length} --text FILE -o OUT (docs/train.md)"
    )
    advice.caveat = measured.caveat
    return advice


def costs_or_accepted(config, method: str, factor: float, costs: dict) -> dict:
    """`costs` plus `method`'s cost when the model accepts it (longrope is not in the default comparison)."""
    if method in costs:
        return costs
    try:
        return {**costs, method: short_context_cost(inspect_rope(config, method=method, factor=factor))}
    except (SpecError, ValueError):
        return costs


# --- plot ------------------------------------------------------------------------------------------------------------
def method_curves(config, factor: float, methods=PLOT_METHODS) -> dict[str, tuple[torch.Tensor, float]]:
    """{label: (inv_freq, attention_factor)} for each method at `factor` (plus 'original')."""
    base = inspect_rope(config)
    curves = {"original": (default_inv_freq(base.rotary_dim, base.base), 1.0)}
    for name in methods:
        ctx = RopeContext(
            rotary_dim=base.rotary_dim,
            base=base.base,
            original_max_position_embeddings=base.original_length,
            factor=float(factor),
            params={},
            seq_len=round(factor * base.original_length),
        )
        curves[name] = compute(name, ctx)
    return curves


def plot_methods(config, factor: float, path: str | Path, methods=PLOT_METHODS) -> Path:
    """PNG: inverse frequency, wavelength (original/target lengths marked) and the RoPE kernel per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotstyle import styles_for

    if not factor or factor < 1:
        raise SpecError(f"the plot factor must be >= 1, got {factor}", field="factor", value=factor)
    base = inspect_rope(config)
    original, target = base.original_length, round(factor * base.original_length)
    curves = method_curves(config, factor, methods)
    styles = styles_for(curves, reference="original")  # colour-blind-safe colour, marker and dash per method
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    index = range(base.rotary_dim // 2)
    distances = torch.linspace(0, target, 400)
    every = max(len(curves), 4)  # each method's markers on its own disks: curves drawn over each other all show
    for n, (label, (inv_freq, attention)) in enumerate(curves.items()):
        same = next((k for k in list(curves)[:n] if torch.allclose(curves[k][0].double(), inv_freq.double())), None)
        st = styles[label]
        style = {"color": st["color"], "linestyle": st["ls"], "marker": st["marker"], "markevery": (n % every, every),
                 "markersize": 8 if same else 5, "markerfacecolor": "none" if same else st["color"],
                 "linewidth": 2.2 if label == "original" else 1.6}
        name = label if attention == 1.0 else f"{label} (attn x{attention:.3f})"
        name += f" (= {same}'s frequencies)" if same else ""
        axes[0].plot(index, inv_freq.double().numpy(), label=name, **style)
        axes[1].plot(index, rope_wavelengths(inv_freq).numpy(), label=name, **style)
        axes[2].plot(distances.numpy(), rope_kernel(inv_freq, distances).numpy(), label=name,
                     **{**style, "markevery": ((n % every) * 100 // every, 100)})  # 4 of 400 points
    axes[0].set(yscale="log", xlabel="disk i", ylabel="θ_i (rad / token)", title="inverse frequency")
    axes[1].set(yscale="log", xlabel="disk i", ylabel="λ_i = 2π/θ_i (tokens)", title="wavelength")
    axes[1].axhline(original, color="grey", linewidth=1)
    axes[1].axhline(target, color="black", linewidth=1)
    axes[1].text(0, original, f" L = {original}", va="bottom", color="grey")
    axes[1].text(0, target, f" target = {target}", va="bottom")
    axes[2].set(xlabel="relative distance k (tokens)", ylabel="mean_i cos(θ_i k)", title="RoPE kernel")
    axes[2].axvline(original, color="grey", linewidth=1)
    axes[2].axvline(target, color="black", linewidth=1)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{base.model_type}: rotary dim {base.rotary_dim}, base {base.base:g}, factor {factor:g}")
    fig.tight_layout()
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise CheckpointError(f"cannot write the plot: folder {str(path.parent)!r} does not exist")
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
