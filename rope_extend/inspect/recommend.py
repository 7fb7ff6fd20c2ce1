"""`rope-extend inspect --recommend`: the minimal factor for a target length and a method, with its reasons.

The rules read each method's advice adapter (`methods.advice`: which static methods are compared and in what
preference, which shipped scheme is kept, each alternative's words), the disk table of each candidate
(`inspect.table`), and what this project measured at that ratio (`rope_extend.measured`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import compat
from ..errors import SpecError
from ..facts import read_rope
from ..methods import advice, all_methods, get_method, method_names
from .table import RopeInspection, inspect_rope


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
    spec: dict[str, Any] | None = None  # the spec that applies `method` to this model (None: no scaling needed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def commands(self, source: str) -> dict[str, str]:
        """The commands that apply the recommendation to SOURCE (as the user named it), each ready to paste and
        run as printed: `patch` (a checkpoint), `eval` (patched vs unpatched on the quick suite) and `train` (at
        the new length on your text, train.txt)."""
        import shlex

        if self.spec is None:
            return {}
        spec = self.spec
        name = f"{Path(str(source).rstrip('/')).name}-{spec['method']}-" + (
            f"{self.target_length // 1024}k" if self.target_length % 1024 == 0 else str(self.target_length))
        flags = ["--method", spec["method"], "--target-length", str(spec["target_length"])]
        flags += [item for key, value in spec.items() if key not in ("method", "target_length")
                  for item in ("--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}")]
        inline = ",".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                          for key, value in spec.items())
        return {
            "patch": shlex.join(["rope-extend", "patch", str(source), *flags, "-o", name]),
            "eval": shlex.join(["rope-extend", "eval", str(source), "--spec", inline, "-o", f"{name}-eval"]),
            "train": shlex.join(["rope-extend", "train", str(source), *flags, "--text", "train.txt", "-o",
                                 f"{name}-trained"]),
        }


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
    _check_target(target_length)
    base_view = inspect_rope(config)
    facts = read_rope(config)
    current_type = facts.slots[facts.main_slot].get("rope_type", "default")
    original = base_view.original_length
    factor = _check_factor(target_length, original)
    unscaled = _no_scaling_needed(config, current_type, target_length, original, factor)
    if unscaled is not None:
        return unscaled
    reasons = _why_scale(base_view, target_length, factor)
    compared, views, costs = _compare(config, factor)
    if costs:
        reasons.append(
            "short-context cost (fraction of disks moved; mean shift of the fastest quarter in octaves, "
            f"log2 s = {math.log2(factor):.3f} means fully interpolated): "
            + "; ".join(f"{name} {c['changed']:.0%}, {c['high_shift']:.3f}" for name, c in costs.items())
        )
    method = _choose(config, base_view, current_type, compared, views, costs, factor, reasons)
    spec = None if method is None else {"method": method, "target_length": target_length}
    if spec is not None and current_type != "default":  # re-derived from the original length, not stacked on it
        spec["replace_existing"] = True
    return with_measurements(Recommendation(target_length, original, factor, method,
                                            _alternatives(factor, method, costs), reasons, costs, spec=spec))


def _check_target(target_length) -> None:
    """SpecError unless `target_length` is a positive number of tokens no model serves more of."""
    if not isinstance(target_length, int) or isinstance(target_length, bool) or target_length <= 0:
        raise SpecError(f"--target-length must be a positive number of tokens, got {target_length!r}",
                        field="target_length", value=target_length)
    from ..spec import MAX_TOKENS

    if target_length > MAX_TOKENS:
        raise SpecError(f"--target-length {target_length} is beyond the sane range [1, {MAX_TOKENS}] (llama.cpp "
                        "positions are int32; no model serves more); choose a shorter target",
                        field="target_length", value=target_length)


def _check_factor(target_length: int, original: int) -> float:
    """The minimal factor target / original, or SpecError beyond the sane range of factors."""
    from ..spec import MAX_FACTOR

    factor = target_length / original
    if factor > MAX_FACTOR:
        raise SpecError(f"--target-length {target_length} is {factor:g} x the original length {original}, beyond the "
                        f"sane range of factors [1, {MAX_FACTOR:g}]; choose a target <= {int(MAX_FACTOR * original)}",
                        field="target_length", value=target_length)
    return factor


def _no_scaling_needed(config, current_type: str, target_length: int, original: int,
                       factor: float) -> Recommendation | None:
    """The recommendation when the model already serves the target (with what each method does inside the
    window), or when the target is within the original length; None otherwise."""
    current_max = int(config.max_position_embeddings)
    if target_length <= current_max:
        reasons = [f"the model already serves {current_max} tokens ({current_type} RoPE) >= {target_length}: no "
                   "scaling needed"]
        inside = {m.name: why for m in all_methods() if (why := advice(m).inside_window())}
        return Recommendation(target_length, original, factor, None, inside, reasons, {})
    if factor <= 1:
        reasons = [f"target {target_length} <= original length {original}: no scaling needed"]
        return Recommendation(target_length, original, factor, None, {}, reasons, {})
    return None


def _why_scale(base_view: RopeInspection, target_length: int, factor: float) -> list[str]:
    """The first reasons: the minimal factor, the slowest disk's turns at the target vs within L, and how many
    disks never complete a turn within L."""
    original = base_view.original_length
    slowest = base_view.rows[-1]
    unseen = sum(1 for r in base_view.rows if r.rotations < 1)
    return [
        f"minimal factor = target / original length = {target_length} / {original} = {factor:.4g}",
        "each rotary pair of query/key dimensions (a \"disk\") turns by a fixed angle per token; without scaling "
        f"the slowest disk (i={slowest.index}, wavelength {slowest.wavelength:.4g} tokens) turns "
        f"{target_length / slowest.wavelength:.3g} times at {target_length} vs {slowest.rotations:.3g} within "
        f"{original}: " + ("angles beyond L were never seen in pretraining" if slowest.rotations < 1 else
                           "it completed full turns in pretraining, but beyond L the relative distances are new"),
        f"{unseen} of {len(base_view.rows)} disks make less than one turn in {original} tokens; interpolating them "
        "is what every method does",
    ]


def _compare(config, factor: float) -> tuple[list, dict[str, RopeInspection], dict[str, dict[str, float]]]:
    """The static methods `--recommend` compares (their advice's preference order), each planned once at the
    minimal factor where the model's config accepts it: (methods, their disk tables, their short-context costs)."""
    compared = sorted((m for m in all_methods() if advice(m).preference is not None), key=lambda m: advice(m).preference)
    views: dict[str, RopeInspection] = {}
    costs: dict[str, dict[str, float]] = {}
    for candidate in compared:
        try:
            views[candidate.name] = inspect_rope(config, method=candidate.name, factor=factor)
        except (SpecError, ValueError):
            continue
        costs[candidate.name] = short_context_cost(views[candidate.name])
    return compared, views, costs


def _choose(config, base_view: RopeInspection, current_type: str, compared: list, views: dict, costs: dict,
            factor: float, reasons: list[str]) -> str | None:
    """The method: the shipped scheme's family where its advice keeps it, else the most preferred method the config
    accepts (None: none); the reasons for the choice are appended to `reasons`."""
    shipped = get_method(current_type) if current_type in method_names() else None
    if shipped is not None and advice(shipped).kept_when_shipped and current_type in costs_or_accepted(
            config, current_type, factor, costs):
        reasons.append(f"the model already ships {current_type} scaling: keep its family's scheme, re-derived at the "
                       "new factor (--set replace_existing=true)")
        return current_type
    best = compared[0].name  # the preferred static method (yarn)
    method = next(iter(costs), None)  # the most preferred one the model's config accepts
    if method is None:
        reasons.append(f"{base_view.model_type} configs accept none of {', '.join(m.name for m in compared)}")
    elif method != best:
        reasons.append(f"{base_view.model_type} configs do not accept {best}; {method} is the most preferred "
                       "method they accept")
    elif len(costs) > 1:
        fullest = max(costs, key=lambda name: costs[name]["changed"])
        attention = views[method].attention_factor
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
                       f"{base_view.original_length} (--set replace_existing=true)")
    return method


def _alternatives(factor: float, method: str | None, costs: dict) -> dict[str, str]:
    """Each other method's words beside the recommendation (the README's "Which method when"; a compared method
    only where the config accepts it)."""
    alternatives = {}
    for other in all_methods():
        why = advice(other).alternative(factor, method) if other.name != method else None
        if why and (advice(other).preference is None or other.name in costs):
            alternatives[other.name] = why
    return alternatives


def with_measurements(advice: Recommendation) -> Recommendation:
    """The recommendation with what this project measured at its ratio (or that nothing was); `commands` measure
    it on the user's model and train it at the new length."""
    from ..measured import at_ratio

    if advice.method is None:
        return advice
    measured = at_ratio(advice.factor, advice.method)
    advice.reasons.extend(measured.lines)
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
