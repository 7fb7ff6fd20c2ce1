"""Position interpolation (Chen et al. 2023): every frequency divided by s."""

from .registry import RopeContext, RopeMethod, default_inv_freq, register


class Linear(RopeMethod):
    name = "linear"
    aliases = ("pi", "position-interpolation")
    hf_rope_type = "linear"
    stock_loaders = {"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (--rope-scaling linear)"}
    formula = "θ_i / s"
    use_when = "Baseline; after fine-tuning at the new length. Without fine-tuning it hurts short contexts most."
    paper = "https://arxiv.org/abs/2306.15595"

    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device) / ctx.factor, 1.0


LINEAR = register(Linear())
