"""Llama 3.1's scheme: keep short wavelengths, divide long ones by s, blend smoothly between.

wavelength < L/high_freq_factor: keep; > L/low_freq_factor: θ/s; between: (1-a)·θ/s + a·θ with
a = (L/λ - low) / (high - low).
"""

import math

import torch

from .registry import RopeContext, RopeMethod, default_inv_freq, register


def compute_llama3(ctx: RopeContext):
    inv_freq = default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device)
    factor = ctx.factor
    low_freq_factor = ctx.param("low_freq_factor", 1.0)
    high_freq_factor = ctx.param("high_freq_factor", 4.0)
    old_context_len = ctx.original_max_position_embeddings

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


LLAMA3 = register(
    RopeMethod(
        name="llama3",
        compute=compute_llama3,
        params={"low_freq_factor": 1.0, "high_freq_factor": 4.0},
        dynamic=False,
        hf_rope_type="llama3",
        loaders={"transformers-4": "yes", "transformers-5": "yes", "vllm": "yes", "llama.cpp": "yes (rope_freqs tensor at conversion)"},
        formula="λ<L/h: θ; λ>L/l: θ/s; else (1−a)·θ/s + a·θ, a=(L/λ−l)/(h−l)",
        use_when="Llama 3.x checkpoints (ships with s=8, l=1, h=4, L=8192); a smooth PI/extrapolation split.",
        paper="https://ai.meta.com/blog/meta-llama-3-1/",
    )
)
