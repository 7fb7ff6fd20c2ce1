"""What an engine applies to q and k: per-dimension angles and a magnitude, for one request of n tokens.

Every engine port returns a `Served` (or a `NotServed` with the exact reason), so one comparison serves them all.
cos/sin are evaluated in float64 from the engine's own float32 frequencies; the tolerance (`tolerance`) admits the
float32 rounding every engine adds to its angles and nothing more. Requests longer than 4096 tokens are compared
at the first 1024 positions and 3072 evenly spaced ones up to the last (`positions`): a wrong magnitude shows at
position 0, a wrong frequency grows with the position, so both ends are always included.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Served:
    """RoPE as served at positions 0..n-1 of one request.

    inv_freq: angle per position of each rotary frequency (rotary_dim / 2 values, the engine's float32 values).
    magnitude: the factor on cos and sin (YaRN's attention factor, LongRoPE's mscale; 1 for plain RoPE).
    cos / sin: optional [positions, rotary_dim / 2] arrays from a real library run at `positions(n)`; used
        instead of inv_freq.
    note: what the engine did that a reader should know (e.g. "long factors: max_model_len > L").
    """

    inv_freq: torch.Tensor | None
    magnitude: float = 1.0
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    note: str = ""

    def cos_sin(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin at positions `at` ([len(at), rotary_dim / 2], float64; numpy: small, single-threaded)."""
        if self.cos is not None and self.sin is not None:  # taken at exactly these positions
            return np.asarray(self.cos, dtype=np.float64), np.asarray(self.sin, dtype=np.float64)
        angles = at.astype(np.float64)[:, None] * self.inv_freq.double().numpy()[None, :]
        return np.cos(angles) * self.magnitude, np.sin(angles) * self.magnitude


@dataclass(frozen=True)
class NotServed:
    """The engine cannot serve this request the way rope-extend does; `reason` says exactly why."""

    reason: str


@dataclass(frozen=True)
class Unchecked(NotServed):
    """The engine's rules do not cover this checkpoint (an unknown rope_type, a config feature its port does not
    model, an architecture it routes elsewhere): not known to serve it identically, and never reported so."""


@dataclass(frozen=True)
class Delta:
    """max |Δcos|, |Δsin| of one engine against rope-extend for one request, and whether that is within tolerance."""

    n: int
    max_cos: float
    max_sin: float
    identical: bool
    worst_dim: int
    worst_position: int = -1  # the position of the largest excess over the tolerance
    first_position: int | None = None  # the first position beyond the tolerance (None: within it everywhere)


# Within tolerance: magnitude within 1e-5 and every frequency within 2^-18 (3.8e-6) relative. Expressed on cos/sin
# as 1e-5 + 2^-18 · p · θ_i per dimension: float32 rounding of θ_i and of the angle p·θ_i (what any engine adds,
# llama.cpp's iterated θ_i included) stays below it; a wrong magnitude shows at p = 0, a wrong frequency at large p.
ABS_TOL = 1e-5
FREQ_RTOL = 2.0**-18


@functools.lru_cache(maxsize=64)
def positions(n: int) -> np.ndarray:
    """The positions a request of n tokens is compared at (all of them up to 4096 tokens). Read-only."""
    if n <= 4096:
        at = np.arange(n)
    else:
        at = np.unique(np.concatenate([np.arange(1024), np.round(np.linspace(0, n - 1, 3072)).astype(np.int64)]))
    at.setflags(write=False)
    return at


def tolerance(reference_inv_freq: torch.Tensor, n: int) -> np.ndarray:
    """Per-dimension tolerance on |Δcos|, |Δsin| over positions 0..n-1."""
    return ABS_TOL + FREQ_RTOL * (n - 1) * np.abs(reference_inv_freq.double().numpy())


def reference_freqs(reference: Served, cos: np.ndarray) -> torch.Tensor:
    """The reference's rotary frequencies: its inv_freq, or (a library's cos/sin taken at positions 0, 1, ...) the
    angle at position 1 (what the per-frequency tolerance needs)."""
    if reference.inv_freq is not None:
        return reference.inv_freq
    sin = np.asarray(reference.sin, dtype=np.float64)
    return torch.from_numpy(np.abs(np.arctan2(sin[1], cos[1])))


def compare(engine: Served, reference: Served, n: int) -> Delta:
    """Compare an engine's cos/sin with rope-extend's over positions 0..n-1."""
    at = positions(n)
    cos_e, sin_e = engine.cos_sin(at)
    cos_r, sin_r = reference.cos_sin(at)
    if cos_e.shape != cos_r.shape:
        return Delta(n, math.inf, math.inf, False, -1)
    diff = np.maximum(np.abs(cos_e - cos_r), np.abs(sin_e - sin_r))  # [positions, frequencies]
    excess = diff / tolerance(reference_freqs(reference, cos_r), n)[None, :]
    worst = np.unravel_index(int(excess.argmax()), excess.shape)
    beyond = np.flatnonzero((excess > 1.0).any(axis=1))
    return Delta(
        n=n,
        max_cos=float(np.abs(cos_e - cos_r).max()),
        max_sin=float(np.abs(sin_e - sin_r).max()),
        identical=not beyond.size,
        worst_dim=int(worst[1]),
        worst_position=int(at[worst[0]]),
        first_position=int(at[beyond[0]]) if beyond.size else None,
    )


def own_rope(plan, n: int) -> Served:
    """rope-extend's own RoPE for a request of n tokens (`plan`: a PatchPlan; dynamic methods evaluated at n): what
    every engine is compared with."""
    inv_freq, attention = plan.compute(plan.targets[0], seq_len=n)
    cos, sin = Served(inv_freq=inv_freq, magnitude=float(attention)).cos_sin(positions(n))  # once for every row
    return Served(inv_freq=inv_freq, magnitude=float(attention), cos=cos, sin=sin)


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """base^(-2i/d) with the float32 op order vLLM, SGLang and transformers share."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
