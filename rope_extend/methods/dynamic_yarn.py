"""Dynamic YaRN: YaRN with s' = max(1, n/L) recomputed as the length n grows.

Below L the model is exactly the original one, so it avoids static YaRN's short-context cost. No stock loader
implements it: config.json carries a `rope_extend` marker and, for stock loaders, static YaRN at the full factor
(which equals dynamic YaRN at n = s·L).
"""

from .registry import RopeContext, RopeMethod, default_inv_freq, register
from .yarn import YARN_DEFAULTS, yarn_attention_factor, yarn_inv_freq


def dynamic_yarn_scale(seq_len: int | None, original: int) -> float:
    return max(1.0, (seq_len or 0) / original)


def compute_dynamic_yarn(ctx: RopeContext):
    scale = dynamic_yarn_scale(ctx.seq_len, ctx.original_max_position_embeddings)
    if scale <= 1.0:
        return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device), 1.0
    return yarn_inv_freq(ctx, scale), yarn_attention_factor(ctx, scale)


DYNAMIC_YARN = register(
    RopeMethod(
        name="dynamic-yarn",
        compute=compute_dynamic_yarn,
        params=YARN_DEFAULTS,
        dynamic=True,
        hf_rope_type=None,
        loaders={
            "transformers-4": "no (loads as static yarn)",
            "transformers-5": "no (loads as static yarn)",
            "vllm": "no (static yarn)",
            "llama.cpp": "no (static yarn)",
        },
        formula="yarn with s' = max(1, n/L)",
        use_when="In-process serving with rope_extend.patch_model: original quality below L, YaRN beyond.",
        paper="https://arxiv.org/abs/2309.00071",
    )
)
