"""NTK-by-parts (bloc97): YaRN's per-dimension blend without the attention temperature.

Written to config.json as `yarn` with an explicit `attention_factor: 1.0`, so stock loaders rebuild it exactly.
"""

from .registry import RopeContext, RopeMethod, register
from .yarn import RAMP_PARAMS, Yarn, yarn_inv_freq


class NtkByParts(Yarn):
    name = "ntk-by-parts"
    aliases = ("by-parts",)
    params = RAMP_PARAMS
    formula = "θ_i·(1−γ_i)/s + θ_i·γ_i (YaRN's blend)"
    attention = "1"
    use_when = "Ablation of YaRN's temperature; prefer yarn."
    paper = "https://github.com/jquesnelle/yarn/pull/1"
    preference = None  # YaRN without its temperature: compared as yarn

    def alternative(self, factor: float, recommended: str) -> str | None:
        return None

    tune_candidates = RopeMethod.tune_candidates  # one candidate at s, not YaRN's grid

    def _compute(self, ctx: RopeContext):
        return yarn_inv_freq(ctx, ctx.factor), 1.0


NTK_BY_PARTS = register(NtkByParts())
