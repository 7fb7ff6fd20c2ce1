"""Dynamic NTK (emozilla), transformers' form: NTK with s' = s·n/L - (s-1) once the length n exceeds L.

Below L the model runs with its original frequencies, so short contexts are untouched. `max_position_embeddings`
stays L: it is the threshold, not the new maximum.
"""

from .ntk import ntk_base
from .registry import Advice, RopeContext, RopeMethod, default_inv_freq, register


def dynamic_scale(factor: float, seq_len: int | None, original: int) -> float:
    n = max(seq_len or original, original)
    return factor * n / original - (factor - 1)


class DynamicNtk(RopeMethod):
    name = "dynamic"
    aliases = ("dynamic-ntk",)
    dynamic = True
    static_counterpart = "ntk"
    hf_rope_type = "dynamic"
    formula = "ntk with s' = s·n/L − (s−1) for n > L"
    use_when = "Serving mixed lengths without fine-tuning: exact original model below L."
    paper = "https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/"

    def _compute(self, ctx: RopeContext):
        scale = dynamic_scale(ctx.factor, ctx.seq_len, ctx.original_max_position_embeddings)
        return default_inv_freq(ctx.rotary_dim, ntk_base(ctx.base, scale, ctx.rotary_dim), ctx.device), 1.0

    def max_position_embeddings(self, spec) -> int:
        return int(spec.original_max_position_embeddings)  # the threshold L, as transformers reads it


class DynamicNtkAdvice(Advice):
    closed_form = 5  # compared at its default by tune's held-out run; not searched (it changes with the length)

    def alternative(self, factor: float, recommended: str) -> str | None:
        return ("when short-context quality matters with stock transformers: exact original model below L (on "
                "SmolLM2-135M the best frequency method at retrieval, its perplexity far above yarn's at 4x)")


DYNAMIC = register(DynamicNtk(), advice=DynamicNtkAdvice)
