"""YaRN (Peng et al. 2023): NTK-by-parts frequency blend plus an attention temperature.

Dimensions that rotate more than beta_fast times within L keep theta_i (extrapolate), those that rotate fewer than
beta_slow times are divided by s (interpolate), with a linear ramp in between. cos/sin are multiplied by the
attention factor (0.1 ln s + 1, or DeepSeek's mscale ratio, or an explicit value), so attention logits scale by
its square.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .registry import (
    Advice,
    GgufRules,
    Param,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    gguf_refusal,
    register,
    yarn_get_mscale,
)

if TYPE_CHECKING:
    import torch

RAMP_PARAMS = {
    "beta_fast": Param(float, 32.0, "rotations within L above which a dimension is kept (extrapolated)", positive=True),
    "beta_slow": Param(float, 1.0, "rotations within L below which a dimension is divided by s", positive=True),
    "truncate": Param(bool, True, "floor/ceil the ramp bounds (false: gpt-oss)"),
}
TEMPERATURE_PARAMS = {
    "attention_factor": Param(float, None, "explicit cos/sin magnitude (default 0.1·ln s + 1)", positive=True),
    "mscale": Param(float, None, "DeepSeek: numerator m of 0.1·m·ln s + 1"),
    "mscale_all_dim": Param(float, None, "DeepSeek: denominator m of 0.1·m·ln s + 1"),
}


def correction_dim(num_rotations: float, dim: int, base: float, original: int) -> float:
    """The (fractional) dimension index whose wavelength fits `num_rotations` times into `original` tokens."""
    return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def correction_range(beta_fast, beta_slow, dim, base, original, truncate=True) -> tuple[float, float]:
    low = correction_dim(beta_fast, dim, base, original)
    high = correction_dim(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(ctx: RopeContext, factor: float) -> torch.Tensor:
    import torch

    dim = ctx.rotary_dim
    low, high = correction_range(
        ctx.param("beta_fast", 32.0),
        ctx.param("beta_slow", 1.0),
        dim,
        ctx.base,
        ctx.original_max_position_embeddings,
        ctx.param("truncate", True),
    )
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = (1 - ramp).to(device=ctx.device, dtype=torch.float)
    extrapolated = default_inv_freq(dim, ctx.base, ctx.device)
    interpolated = 1.0 / (factor * (ctx.base ** (torch.arange(0, dim, 2).to(device=ctx.device, dtype=torch.float) / dim)))
    return interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight


def yarn_attention_factor(ctx: RopeContext, factor: float) -> float:
    explicit = ctx.params.get("attention_factor")
    if explicit is not None:
        return float(explicit)
    mscale, mscale_all_dim = ctx.params.get("mscale"), ctx.params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
    return yarn_get_mscale(factor)


def check_betas(spec) -> None:
    if spec.beta_fast is not None or spec.beta_slow is not None:
        fast = spec.beta_fast if spec.beta_fast is not None else RAMP_PARAMS["beta_fast"].default
        slow = spec.beta_slow if spec.beta_slow is not None else RAMP_PARAMS["beta_slow"].default
        if fast <= slow:
            raise ValueError(
                f"beta_fast ({fast}) must be greater than beta_slow ({slow}): beta_fast is the rotation count "
                "above which dimensions are kept, beta_slow the count below which they are interpolated"
            )


class Yarn(RopeMethod):
    name = "yarn"
    params = {**RAMP_PARAMS, **TEMPERATURE_PARAMS}
    hf_rope_type = "yarn"
    slot_keys = ("original_max_position_embeddings", "beta_fast", "beta_slow")
    explicit_slot_keys = ("mscale", "mscale_all_dim", "truncate")  # written only when the spec sets them
    writes_attention_factor = True  # always explicit: engines differ in defaults
    formula = (
        "θ_i·(1−γ_i)/s + θ_i·γ_i; γ_i = 1 − ramp between lo = ⌊dim(β_fast)⌋ and hi = ⌈dim(β_slow)⌉, "
        "dim(r) = d·ln(L/(2πr))/(2 ln b)"
    )
    attention = "0.1·ln s + 1 (DeepSeek: mscale ratio; or explicit attention_factor)"
    use_when = "Best training-free static extension (and the usual fine-tuning recipe). Costs a little at short lengths."
    paper = "https://arxiv.org/abs/2309.00071"

    def _compute(self, ctx: RopeContext):
        return yarn_inv_freq(ctx, ctx.factor), yarn_attention_factor(ctx, ctx.factor)

    def validate(self, spec) -> None:
        check_betas(spec)

    def config_slot(self, spec, base_slot, rotary_dim, base_theta):
        slot = super().config_slot(spec, base_slot, rotary_dim, base_theta)
        explicit = spec.method_params()
        slot.update({key: explicit[key] for key in self.explicit_slot_keys if key in explicit})
        return slot


class YarnGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        name = self.method.name
        if spec.truncate is False:
            raise gguf_refusal(
                f"{name} with truncate: false",
                "llama.cpp always floors/ceils the YaRN correction range (ggml_rope_yarn_corr_dims)",
                "drop truncate (the default, true) or serve the Hugging Face checkpoint",
            )
        betas = (spec.beta_fast or RAMP_PARAMS["beta_fast"].default, spec.beta_slow or RAMP_PARAMS["beta_slow"].default)
        if betas != (32.0, 1.0):
            raise gguf_refusal(
                f"{name} with beta_fast={betas[0]:g}, beta_slow={betas[1]:g}",
                "the llama architecture reads no GGUF key for the YaRN betas (ggml uses 32 and 1)",
                f"write the default betas and pass --yarn-beta-fast {betas[0]:g} --yarn-beta-slow {betas[1]:g} "
                "to llama.cpp at run time",
            )
        s = float(spec.factor)
        keys = {
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": s,
            "rope.scaling.original_context_length": int(spec.original_max_position_embeddings),
            # llama.cpp serves attn_factor x (1 + 0.1 ln s): write the ratio that yields the method's factor
            "rope.scaling.attn_factor": attention_factor / yarn_get_mscale(s),
        }
        return keys, None, []


class YarnAdvice(Advice):
    preference = 0  # the best training-free static method, loaded by every stock engine
    closed_form = 2
    tune_rank = 0

    def alternative(self, factor: float, recommended: str) -> str | None:
        return "if you need a scheme every engine reproduces, with an attention temperature"

    def tune_candidates(self, factor):
        doubled = round(1 + 2 * (yarn_get_mscale(factor) - 1), 4)  # twice YaRN's temperature correction
        return [
            (f"yarn x{factor:g}", {"method": "yarn", "factor": factor}),
            (f"yarn x{1.25 * factor:g}", {"method": "yarn", "factor": round(1.25 * factor, 4)}),
            (f"yarn x{factor:g} beta 64/2", {"method": "yarn", "factor": factor, "beta_fast": 64.0, "beta_slow": 2.0}),
            (f"yarn x{factor:g} attn {doubled:.3f}", {"method": "yarn", "factor": factor, "attention_factor": doubled}),
            (f"yarn x{1.5 * factor:g}", {"method": "yarn", "factor": round(1.5 * factor, 4)}),
            (f"yarn x{factor:g} beta 16/1", {"method": "yarn", "factor": factor, "beta_fast": 16.0, "beta_slow": 1.0}),
        ]


YARN = register(Yarn(), gguf=YarnGguf, advice=YarnAdvice)
