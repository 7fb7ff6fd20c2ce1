"""YaRN (Peng et al. 2023): NTK-by-parts frequency blend plus an attention temperature.

Dimensions that rotate more than beta_fast times within L keep theta_i (extrapolate), those that rotate fewer than
beta_slow times are divided by s (interpolate), with a linear ramp in between. cos/sin are multiplied by the
attention factor (0.1 ln s + 1, or DeepSeek's mscale ratio, or an explicit value), so attention logits scale by
its square.
"""

import math

import torch

from .registry import RopeContext, RopeMethod, default_inv_freq, register, yarn_get_mscale

YARN_DEFAULTS = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "attention_factor": None,
    "mscale": None,
    "mscale_all_dim": None,
    "truncate": True,
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


def compute_yarn(ctx: RopeContext):
    return yarn_inv_freq(ctx, ctx.factor), yarn_attention_factor(ctx, ctx.factor)


YARN = register(
    RopeMethod(
        name="yarn",
        compute=compute_yarn,
        params=YARN_DEFAULTS,
        dynamic=False,
        hf_rope_type="yarn",
        loaders={
            "transformers-4": "yes",
            "transformers-5": "yes",
            "vllm": "yes",
            "llama.cpp": "yes (--rope-scaling yarn); truncate=false not reproduced",
        },
        formula="θ_i·(1−γ_i)/s + θ_i·γ_i, γ from the β_fast/β_slow ramp; cos,sin × (0.1·ln s + 1)",
        use_when="Best training-free static extension (and the usual fine-tuning recipe). Costs a little at short lengths.",
        paper="https://arxiv.org/abs/2309.00071",
    )
)
