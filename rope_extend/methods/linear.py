"""Position interpolation (Chen et al. 2023): every frequency divided by s."""

from .registry import (
    Advice,
    GgufRules,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    register,
)


class Linear(RopeMethod):
    name = "linear"
    aliases = ("pi", "position-interpolation")
    hf_rope_type = "linear"
    formula = "θ_i / s"
    use_when = "Baseline; after fine-tuning at the new length. Without fine-tuning it hurts short contexts most."
    paper = "https://arxiv.org/abs/2306.15595"

    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device) / ctx.factor, 1.0


class LinearGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        return {"rope.scaling.type": "linear", "rope.scaling.factor": float(spec.factor)}, None, []


class LinearAdvice(Advice):
    preference = 2
    closed_form = 0
    tune_rank = 4


LINEAR = register(Linear(), gguf=LinearGguf, advice=LinearAdvice)
