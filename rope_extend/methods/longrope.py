"""LongRoPE (Phi-3): searched per-dimension rescale factors, `short_factor` up to L and `long_factor` beyond.

rope-extend passes published factor lists through (and `rope-extend tune` writes searched ones). The attention
factor defaults to sqrt(1 + ln(s)/ln(L)).
"""

from __future__ import annotations

import math

from ..errors import SpecError
from .registry import Advice, GgufRules, Param, RopeContext, RopeMethod, register

LISTS = ("short_factor", "long_factor")


def longrope_attention_factor(ctx: RopeContext) -> float:
    explicit = ctx.params.get("attention_factor")
    if explicit is not None:
        return float(explicit)
    if ctx.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(ctx.factor) / math.log(ctx.original_max_position_embeddings))


class LongRope(RopeMethod):
    name = "longrope"
    aliases = ("su",)
    params = {
        "short_factor": Param(list, None, "per-frequency divisors used up to L (rotary_dim/2 values)", positive=True),
        "long_factor": Param(list, None, "per-frequency divisors used beyond L (rotary_dim/2 values)", positive=True),
        "attention_factor": Param(float, None, "explicit cos/sin magnitude (default √(1+ln s/ln L))", positive=True),
    }
    dynamic = True
    switches_at_original = True  # short_factor up to L, long_factor beyond
    hf_rope_type = "longrope"
    slot_keys = ("original_max_position_embeddings",)
    writes_attention_factor = True
    formula = "θ_i / f_i, f = short_factor (n ≤ L) or long_factor (n > L)"
    attention = "√(1 + ln s / ln L) (or explicit attention_factor)"
    use_when = "Models published with LongRoPE factors (Phi-3/3.5), or factors found by `rope-extend tune`."
    paper = "https://arxiv.org/abs/2402.13753"

    def _compute(self, ctx: RopeContext):
        import torch

        use_long = ctx.seq_len is not None and ctx.seq_len > ctx.original_max_position_embeddings
        factors = ctx.params["long_factor" if use_long else "short_factor"]
        ext = torch.tensor(factors, dtype=torch.float32, device=ctx.device)
        shape = torch.arange(0, ctx.rotary_dim, 2, dtype=torch.int64, device=ctx.device).float() / ctx.rotary_dim
        return 1.0 / (ext * ctx.base**shape), longrope_attention_factor(ctx)

    def config_slot(self, spec, base_slot, rotary_dim, base_theta):
        slot = super().config_slot(spec, base_slot, rotary_dim, base_theta)
        explicit = spec.method_params()
        for key in LISTS:
            values = explicit.get(key) or base_slot.get(key)
            if not values or len(values) != rotary_dim // 2:
                raise SpecError(
                    f"longrope needs {key} with {rotary_dim // 2} values (rotary_dim / 2), got "
                    f"{len(values) if values else 'none'}; copy the published lists (e.g. Phi-3's config.json)",
                    field=key,
                    value=values,
                )
            slot[key] = [float(v) for v in values]
        return slot

    def example_spec(self, factor: float, half: int) -> dict:
        """Illustrative factors: 1 .. s across the frequencies, the short ones milder."""
        return {"method": self.name, "factor": factor,
                "long_factor": [1.0 + (factor - 1.0) * i / (half - 1) for i in range(half)],
                "short_factor": [1.0 + 0.5 * i / (half - 1) for i in range(half)]}

    def context_params(self, spec, slot):
        params = spec.method_params()
        for key in LISTS:
            params.setdefault(key, slot.get(key))
        return params


class LongRopeGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        keys, factors, warnings = super().rope(spec, base, rope_dim, inv_freq, attention_factor)
        L = spec.original_max_position_embeddings
        warnings.append(
            "llama.cpp applies the GGUF's rope_freqs at every position, so this GGUF uses the long factors "
            f"for prompts shorter than {L} tokens too (transformers switches to them only beyond {L})"
        )
        return keys, factors, warnings


class LongRopeAdvice(Advice):
    kept_when_shipped = True  # its factors were searched (and Phi-3 tuned) for the model


LONGROPE = register(LongRope(), gguf=LongRopeGguf, advice=LongRopeAdvice)
