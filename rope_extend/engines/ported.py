"""RoPE formulas that several engines' sources share line for line (SGLang's rotary_embedding copies vLLM's), ported
once: YaRN's ramp, LongRoPE's default magnitude, the magnitude rule 0.1·m·ln s + 1, the rotary dimension. Each engine
room's port (`<name>/port.py`) says which of its files follow these."""

from __future__ import annotations

import math

import torch


def rotary_dim(fields: dict, rope: dict) -> int:
    """head_dim (or hidden_size / heads) x partial_rotary_factor."""
    head_size = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    return int(head_size * rope.get("partial_rotary_factor", 1.0))


def yarn_correction_range(beta_fast, beta_slow, dim, base, original, truncate) -> tuple[float, float]:
    def corr(rot):
        return (dim * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, truncate) -> torch.Tensor:
    """vLLM's `YaRNScalingRotaryEmbedding._compute_inv_freq` (float32, the same op order)."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = yarn_correction_range(beta_fast, beta_slow, dim, base, original, truncate)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    return interpolation * (1 - mask) + extrapolation * mask


def mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's magnitude 0.1·m·ln s + 1 (1 for s <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_magnitude(rope: dict, factor: float, *, set_means_given: bool = False) -> float:
    """The mscale / mscale_all_dim ratio when both are set, else 0.1 ln s + 1 (what vLLM and SGLang compute before
    any explicit factor). vLLM tests both for truth (`if mscale and mscale_all_dim`), SGLang for presence
    (`set_means_given`: `is not None`)."""
    given = (lambda v: v is not None) if set_means_given else bool
    if given(rope.get("mscale")) and given(rope.get("mscale_all_dim")):
        return mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
    return mscale(factor)


def longrope_magnitude(max_position: int, original: int) -> float:
    """LongRoPE's default magnitude sqrt(1 + ln(max_position/original) / ln(original))."""
    scale = max_position / original
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))


def proportional_inv_freq(fields: dict, rope: dict) -> torch.Tensor:
    """vLLM's and SGLang's Gemma4RotaryEmbedding._compute_inv_freq (vLLM 0.34 gemma4_rope.py:57-76, SGLang 0.5.23
    rope_variant.py:930-948): base^(-2i/head_size) for the first
    int(p·head_size // 2) frequencies, zeros beyond; head_size is the full-attention layers' (Gemma 4: global_head_dim)."""
    head = int(fields.get("global_head_dim") or fields.get("head_dim")
               or fields["hidden_size"] // fields["num_attention_heads"])
    angles = int(rope.get("partial_rotary_factor", 1.0) * head // 2)
    inv = 1.0 / (float(rope.get("rope_theta", 10000)) ** (torch.arange(0, 2 * angles, 2, dtype=torch.float) / head))
    return torch.cat([inv, torch.zeros(head // 2 - angles)])
