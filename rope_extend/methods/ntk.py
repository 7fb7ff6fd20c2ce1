"""Static NTK-aware scaling (bloc97): raise the base so the lowest frequency is divided by exactly s.

b' = b * s^(d/(d-2)); the highest frequency (i=0) is unchanged. Written to config.json as a plain
`rope_theta` change, so every loader reproduces it.
"""

from .registry import RopeContext, RopeMethod, default_inv_freq, register


def ntk_base(base: float, factor: float, dim: int) -> float:
    return base * factor ** (dim / (dim - 2))


class Ntk(RopeMethod):
    name = "ntk"
    aliases = ("ntk-aware", "static-ntk")
    hf_rope_type = "default"  # a plain rope_theta change
    stock_loaders = {"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (--rope-freq-base)"}
    formula = "(b·s^(d/(d-2)))^(-2i/d)"
    use_when = "Quick training-free extension to ~2-4x; keeps high frequencies, so short contexts suffer little."
    paper = "https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/"

    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ntk_base(ctx.base, ctx.factor, ctx.rotary_dim), ctx.device), 1.0

    def config_slot(self, spec, base_slot, rotary_dim, base_theta):
        slot = super().config_slot(spec, base_slot, rotary_dim, base_theta)
        slot["rope_theta"] = ntk_base(base_theta, spec.factor, rotary_dim)
        return slot


NTK = register(Ntk())
