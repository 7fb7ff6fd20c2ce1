"""LongRoPE (Phi-3): searched per-dimension rescale factors, `short_factor` up to L and `long_factor` beyond.

rope-extend passes published factor lists through; it does not search them. The attention factor defaults to
sqrt(1 + ln(s)/ln(L)).
"""

import math

import torch

from .registry import RopeContext, RopeMethod, register


def longrope_attention_factor(ctx: RopeContext) -> float:
    explicit = ctx.params.get("attention_factor")
    if explicit is not None:
        return float(explicit)
    if ctx.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(ctx.factor) / math.log(ctx.original_max_position_embeddings))


def compute_longrope(ctx: RopeContext):
    use_long = ctx.seq_len is not None and ctx.seq_len > ctx.original_max_position_embeddings
    factors = ctx.params["long_factor" if use_long else "short_factor"]
    ext = torch.tensor(factors, dtype=torch.float32, device=ctx.device)
    shape = torch.arange(0, ctx.rotary_dim, 2, dtype=torch.int64, device=ctx.device).float() / ctx.rotary_dim
    return 1.0 / (ext * ctx.base**shape), longrope_attention_factor(ctx)


LONGROPE = register(
    RopeMethod(
        name="longrope",
        compute=compute_longrope,
        params={"short_factor": None, "long_factor": None, "attention_factor": None},
        dynamic=True,
        hf_rope_type="longrope",
        loaders={"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (Phi-3 conversion)"},
        formula="θ_i / f_i, f = short_factor (n ≤ L) or long_factor (n > L); cos,sin × √(1+ln s/ln L)",
        use_when="Models published with LongRoPE factors (Phi-3/3.5); pass-through only.",
        paper="https://arxiv.org/abs/2402.13753",
    )
)
