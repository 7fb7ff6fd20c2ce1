"""NTK-by-parts (bloc97): YaRN's per-dimension blend without the attention temperature."""

from .registry import RopeContext, RopeMethod, register
from .yarn import yarn_inv_freq


def compute_ntk_by_parts(ctx: RopeContext):
    return yarn_inv_freq(ctx, ctx.factor), 1.0


NTK_BY_PARTS = register(
    RopeMethod(
        name="ntk-by-parts",
        compute=compute_ntk_by_parts,
        params={"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True},
        dynamic=False,
        hf_rope_type="yarn",  # written as yarn with attention_factor = 1.0
        loaders={"transformers-4": "yes (yarn, attention_factor 1)", "transformers-5": "yes (yarn, attention_factor 1)", "vllm": "yes", "llama.cpp": "yes (--yarn-attn-factor 1)"},
        formula="θ_i·(1−γ_i)/s + θ_i·γ_i",
        use_when="Ablation of YaRN's temperature; prefer yarn.",
        paper="https://github.com/jquesnelle/yarn/pull/1",
    )
)
