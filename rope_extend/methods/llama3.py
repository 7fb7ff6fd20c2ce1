"""Llama 3.1's scheme: keep short wavelengths, divide long ones by s, blend smoothly between.

wavelength < L/high_freq_factor: keep; > L/low_freq_factor: θ/s; between: (1-a)·θ/s + a·θ with
a = (L/λ - low) / (high - low).
"""

from __future__ import annotations

import math

from .registry import (
    Advice,
    Param,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    register,
)


class Llama3(RopeMethod):
    name = "llama3"
    params = {
        "low_freq_factor": Param(float, 1.0, "wavelengths above L/low are divided by s", positive=True),
        "high_freq_factor": Param(float, 4.0, "wavelengths below L/high are kept", positive=True),
    }
    hf_rope_type = "llama3"
    slot_keys = ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor")
    formula = "λ<L/h: θ; λ>L/l: θ/s; else (1−a)·θ/s + a·θ, a=(L/λ−l)/(h−l)"
    use_when = "Llama 3.x checkpoints (ships with s=8, l=1, h=4, L=8192); a smooth PI/extrapolation split."
    paper = "https://ai.meta.com/blog/meta-llama-3-1/"

    def _compute(self, ctx: RopeContext):
        import torch

        inv_freq = default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device)
        factor = ctx.factor
        low_freq_factor = ctx.params["low_freq_factor"]
        high_freq_factor = ctx.params["high_freq_factor"]
        old_context_len = ctx.original_max_position_embeddings

        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled), 1.0

    def validate(self, spec) -> None:
        low = spec.low_freq_factor if spec.low_freq_factor is not None else self.params["low_freq_factor"].default
        high = spec.high_freq_factor if spec.high_freq_factor is not None else self.params["high_freq_factor"].default
        if high <= low:
            raise ValueError(
                f"high_freq_factor ({high}) must be greater than low_freq_factor ({low}); Llama 3.1 uses low=1, high=4"
            )


class Llama3Advice(Advice):
    preference = 3
    closed_form = 4
    tune_rank = 1
    kept_when_shipped = True  # Llama 3.x was tuned with it

    def tune_candidates(self, factor):
        return [
            (f"llama3 x{factor:g}", {"method": "llama3", "factor": factor}),
            (f"llama3 x{factor:g} low 2 high 8",
             {"method": "llama3", "factor": factor, "low_freq_factor": 2.0, "high_freq_factor": 8.0}),
        ]


# the default GGUF rules: per-dimension rope_freqs
LLAMA3 = register(Llama3(), advice=Llama3Advice)
