"""Reference position encodings: sinusoidal, ALiBi and RoPE, small and readable.

These are the textbook definitions that `rope-extend inspect` and the tests compare against; they are not used on
the model's forward path (the model keeps its own rotary module).

- Sinusoidal absolute encoding (Vaswani et al. 2017): PE(pos, 2i) = sin(pos / b^(2i/d)), PE(pos, 2i+1) = cos(...).
  Its dot product PE_t · PE_{t+k} = Σ_i cos(w_i k) depends only on the offset k (and is even in k).
- ALiBi (Press et al. 2022): no position embedding; head h adds -m_h · (i - j) to the logit of query i, key j.
  Slopes are geometric, m_h = 2^(-8h/H) for h = 1..H when H is a power of two, with the paper's rule otherwise.
- RoPE (Su et al. 2021) in transformers' `rotate_half` layout: dimension pairs are (j, j + d/2), and
  R_m x = x · cos(m θ) + rotate_half(x) · sin(m θ) with cos/sin repeated over both halves. Then
  <R_m q, R_n k> depends only on m - n, for any frequencies θ, scaled ones included.
- Each rotary pair is a disk turning by θ_i radians per token: its wavelength is λ_i = 2π/θ_i tokens and it turns
  L/λ_i times within a context of L tokens (`rope_wavelengths`, `rope_rotations`).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "rope_cos_sin",
    "rope_kernel",
    "rope_rotate",
    "rope_rotations",
    "rope_wavelengths",
    "rotate_half",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
]


# --- sinusoidal --------------------------------------------------------------------------------------------------
def sinusoidal_frequencies(dim: int, base: float = 10000.0, dtype=torch.float64) -> torch.Tensor:
    """w_i = 1 / base^(2i/d), i = 0 .. d/2 - 1."""
    if dim <= 0 or dim % 2:
        raise ValueError(f"the encoding dimension must be a positive even number, got {dim}")
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=dtype) / dim))


def sinusoidal_encoding(positions, dim: int, base: float = 10000.0, dtype=torch.float64) -> torch.Tensor:
    """[len(positions), dim]: PE(pos, 2i) = sin(pos · w_i), PE(pos, 2i+1) = cos(pos · w_i) (interleaved)."""
    pos = torch.as_tensor(positions, dtype=dtype).reshape(-1, 1)
    angles = pos * sinusoidal_frequencies(dim, base, dtype)  # [n, d/2]
    pe = torch.empty(pos.shape[0], dim, dtype=dtype)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


# --- ALiBi -------------------------------------------------------------------------------------------------------
def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi head slopes, as in the paper's reference implementation (ofirpress/attention_with_linear_biases).

    Power of two H: m_h = 2^(-8h/H), h = 1..H (H=8: 1/2, 1/4, ..., 1/256). Otherwise, with P the largest power of
    two below H: the P slopes of P heads, then every other slope of 2P heads for the remaining H - P heads.
    """
    if num_heads <= 0:
        raise ValueError(f"the number of heads must be positive, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))  # = 2^(-8/n)
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_bias(num_heads: int, length: int, causal: bool = True, dtype=torch.float64) -> torch.Tensor:
    """[H, length, length] additive bias: -m_h · |i - j| (query i, key j); -inf above the diagonal when causal."""
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=dtype).reshape(-1, 1, 1)
    pos = torch.arange(length, dtype=dtype)
    distance = (pos.reshape(-1, 1) - pos.reshape(1, -1)).abs()
    bias = -slopes * distance
    if causal:
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        bias = bias.masked_fill(future, float("-inf"))
    return bias


# --- RoPE --------------------------------------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' convention: (x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(positions, inv_freq: torch.Tensor, attention_factor: float = 1.0, dtype=torch.float64):
    """cos, sin of shape [len(positions), rotary_dim] (frequencies repeated over both halves), times the factor."""
    pos = torch.as_tensor(positions, dtype=dtype).reshape(-1, 1)
    angles = pos * inv_freq.to(dtype).reshape(1, -1)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def rope_rotate(x: torch.Tensor, positions, inv_freq: torch.Tensor, attention_factor: float = 1.0) -> torch.Tensor:
    """R_m x for x of shape [..., len(positions), rotary_dim] (or [rotary_dim] with a single position).

    Same formula as transformers' `apply_rotary_pos_emb`: x · cos + rotate_half(x) · sin, where cos and sin are
    scaled by the method's attention factor (YaRN's temperature), so <R_m q, R_n k> scales by its square.
    """
    if x.shape[-1] != 2 * inv_freq.shape[-1]:
        raise ValueError(f"x has last dimension {x.shape[-1]}, expected 2 x {inv_freq.shape[-1]} (rotary_dim)")
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor, dtype=x.dtype)
    if x.dim() == 1:
        cos, sin = cos[0], sin[0]
    return x * cos + rotate_half(x) * sin


def rope_wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """λ_i = 2π / θ_i: tokens per full turn of disk i."""
    return 2 * math.pi / inv_freq.double()


def rope_rotations(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """r_i = length / λ_i: full turns of disk i within `length` tokens."""
    return length / rope_wavelengths(inv_freq)


def rope_kernel(inv_freq: torch.Tensor, distances) -> torch.Tensor:
    """Mean over the disks of cos(θ_i k): <R_m q, R_{m+k} q> / |q|² for a q with equal weight on every pair.

    The RoPE analogue of the sinusoidal dot product; scaling stretches it along k (linear: exactly by s).
    """
    k = torch.as_tensor(distances, dtype=torch.float64).reshape(-1, 1)
    return torch.cos(k * inv_freq.double().reshape(1, -1)).mean(dim=-1)
