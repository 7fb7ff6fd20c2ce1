"""NTK-by-parts (bloc97): YaRN's per-dimension blend without the attention temperature.

Written to config.json as `yarn` with an explicit `attention_factor: 1.0`, so stock loaders rebuild it exactly; every
engine reads it as the yarn slot it is.
"""

from .registry import Advice, RopeContext, register
from .yarn import RAMP_PARAMS, Yarn, YarnGguf, yarn_inv_freq


class NtkByParts(Yarn):
    name = "ntk-by-parts"
    aliases = ("by-parts",)
    params = RAMP_PARAMS
    formula = "θ_i·(1−γ_i)/s + θ_i·γ_i (YaRN's blend)"
    attention = "1"
    use_when = "Ablation of YaRN's temperature; prefer yarn."
    paper = "https://github.com/jquesnelle/yarn/pull/1"

    def _compute(self, ctx: RopeContext):
        return yarn_inv_freq(ctx, ctx.factor), 1.0


class NtkByPartsAdvice(Advice):
    """Not compared by `--recommend` (YaRN without its temperature is compared as yarn), one tune candidate at s (not
    YaRN's grid)."""

    closed_form = 3
    tune_rank = 3


NTK_BY_PARTS = register(NtkByParts(), gguf=YarnGguf, advice=NtkByPartsAdvice)  # YaRN's GGUF rules
