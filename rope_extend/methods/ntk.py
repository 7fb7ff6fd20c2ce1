"""Static NTK-aware scaling (bloc97): raise the base so the lowest frequency is divided by exactly s.

b' = b * s^(d/(d-2)); the highest frequency (i=0) is unchanged. Written to config.json as a plain
`rope_theta` change, so every loader reproduces it.
"""

from .registry import (
    Advice,
    GgufRules,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    register,
)


def ntk_base(base: float, factor: float, dim: int) -> float:
    return base * factor ** (dim / (dim - 2))


class Ntk(RopeMethod):
    name = "ntk"
    aliases = ("ntk-aware", "static-ntk")
    hf_rope_type = "default"  # a plain rope_theta change
    formula = "(b·s^(d/(d-2)))^(-2i/d)"
    use_when = "Quick training-free extension to ~2-4x; keeps high frequencies, so short contexts suffer little."
    paper = "https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/"

    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ntk_base(ctx.base, ctx.factor, ctx.rotary_dim), ctx.device), 1.0

    def config_slot(self, spec, base_slot, rotary_dim, base_theta):
        slot = super().config_slot(spec, base_slot, rotary_dim, base_theta)
        slot["rope_theta"] = ntk_base(base_theta, spec.factor, rotary_dim)
        return slot


class NtkGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        return {"rope.freq_base": ntk_base(base, float(spec.factor), rope_dim)}, None, []


class NtkAdvice(Advice):
    preference = 1
    closed_form = 1
    tune_rank = 2

    def alternative(self, factor: float, recommended: str) -> str | None:
        return "at small factors (<= 2) a plain rope_theta change every loader reads" if factor <= 2 else None

    def tune_candidates(self, factor):
        return [(f"ntk x{f:g}", {"method": "ntk", "factor": round(f, 4)}) for f in (1.5 * factor, factor, 2 * factor)]


NTK = register(Ntk(), gguf=NtkGguf, advice=NtkAdvice)
