"""Static NTK-aware scaling (bloc97): raise the base so the lowest frequency is divided by exactly s.

b' = b * s^(d/(d-2)); the highest frequency (i=0) is unchanged. Written to config.json as a plain
`rope_theta` change, so every loader reproduces it.
"""

from .registry import RopeContext, RopeMethod, default_inv_freq, register


def ntk_base(base: float, factor: float, dim: int) -> float:
    return base * factor ** (dim / (dim - 2))


def compute_ntk(ctx: RopeContext):
    return default_inv_freq(ctx.rotary_dim, ntk_base(ctx.base, ctx.factor, ctx.rotary_dim), ctx.device), 1.0


NTK = register(
    RopeMethod(
        name="ntk",
        compute=compute_ntk,
        params={},
        dynamic=False,
        hf_rope_type=None,  # a plain rope_theta change
        loaders={"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (--rope-freq-base)"},
        formula="(b·s^(d/(d-2)))^(-2i/d)",
        use_when="Quick training-free extension to ~2-4x; keeps high frequencies, so short contexts suffer little.",
        paper="https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
    )
)
