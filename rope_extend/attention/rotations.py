"""The rotations every attention path shares: RoPE rotations compose, so a query or key the model already rotated at
position p moves to p + delta by one more rotation of delta·θ (`rotation`, `rotate`); and log-n's query factor."""

from __future__ import annotations

import math

import torch


def rotation(shift: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, 1, n, rotary_dim] (float32) of a rotation by `shift` [B, n] positions (angles in float64)."""
    angles = shift.to(torch.float64)[..., None] * inv_freq.to(device=shift.device, dtype=torch.float64)
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, n, D] rotated in its first rotary_dim dims (transformers' rotate_half layout), in x's dtype: float32
    math, x·cos then rotate_half(x)·sin added in place half by half (two temporaries, not six)."""
    rdim = cos.shape[-1]
    half = rdim // 2
    xr = x[..., :rdim].float()
    out = xr * cos
    out[..., :half].addcmul_(xr[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(xr[..., :half], sin[..., half:])
    if rdim < x.shape[-1]:
        return torch.cat((out.to(x.dtype), x[..., rdim:]), dim=-1)
    return out.to(x.dtype)


def log_n_factor(q_pos: torch.Tensor, original: int) -> torch.Tensor:
    """max(1, ln(p + 1) / ln(L)) per query [B, q] (float32)."""
    return torch.clamp(torch.log1p(q_pos.to(torch.float64)) / math.log(original), min=1.0).float()
