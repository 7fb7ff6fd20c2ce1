"""Position interpolation (Chen et al. 2023): every frequency divided by s."""

from .registry import RopeContext, RopeMethod, default_inv_freq, register


def compute_linear(ctx: RopeContext):
    inv_freq = default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device)
    return inv_freq / ctx.factor, 1.0


LINEAR = register(
    RopeMethod(
        name="linear",
        compute=compute_linear,
        params={},
        dynamic=False,
        hf_rope_type="linear",
        loaders={"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (--rope-scaling linear)"},
        formula="θ_i / s",
        use_when="Baseline; after fine-tuning at the new length. Without fine-tuning it hurts short contexts most.",
        paper="https://arxiv.org/abs/2306.15595",
    )
)
