"""Dynamic YaRN: YaRN with s' = max(1, n/L) recomputed as the length n grows.

Below L the model is exactly the original one, so it avoids static YaRN's short-context cost. No stock loader
implements it: config.json carries a `rope_extend` marker and, for stock loaders, static YaRN at the full factor
(which equals dynamic YaRN at n = s·L).
"""

from .registry import Advice, RopeContext, default_inv_freq, register
from .yarn import YARN, Yarn, yarn_attention_factor, yarn_inv_freq


def dynamic_yarn_scale(seq_len: int | None, original: int) -> float:
    return max(1.0, (seq_len or 0) / original)


class DynamicYarn(Yarn):
    name = "dynamic-yarn"
    aliases = ("dynamicyarn",)
    dynamic = True
    formula = "yarn with s' = max(1, n/L)"
    attention = "yarn's, from s'"
    use_when = "In-process serving with rope_extend.patch_model: original quality below L, YaRN beyond."
    paper = "https://arxiv.org/abs/2309.00071"
    static_counterpart = "yarn"

    def _compute(self, ctx: RopeContext):
        scale = dynamic_yarn_scale(ctx.seq_len, ctx.original_max_position_embeddings)
        if scale <= 1.0:
            return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device), 1.0
        return yarn_inv_freq(ctx, scale), yarn_attention_factor(ctx, scale)

    @property
    def stock_method(self):
        return YARN  # written (and loaded by stock loaders) as static YaRN at the full factor

    def marker_note(self, spec) -> str | None:
        return (
            f"static yarn x{spec.factor:g} (equal to dynamic-yarn only at {spec.target_length} tokens); "
            "call rope_extend.patch_model(model) after loading to restore dynamic YaRN"
        )

    def loader_notes(self, spec) -> list[str]:
        return [
            "dynamic-yarn is not reproduced by stock loaders (transformers, vLLM, llama.cpp): they load the "
            f"checkpoint as static YaRN x{spec.factor:g}; call rope_extend.patch_model(model) after loading"
        ]


class DynamicYarnAdvice(Advice):  # dynamic: not compared by `--recommend` as a static method, not searched by tune
    def alternative(self, factor: float, recommended: str) -> str | None:
        return ("when short-context quality matters and you serve in-process with rope_extend.patch_model: the "
                "original model below L, YaRN beyond (stock loaders load it as static yarn)")


# the default GGUF rules: dynamic, refused
DYNAMIC_YARN = register(DynamicYarn(), advice=DynamicYarnAdvice)
