"""Reference encodings: sinusoidal dot products, RoPE relativity (also with scaled frequencies), ALiBi slopes/bias."""

from __future__ import annotations

import math

import pytest
import torch

from rope_extend.encodings import (
    alibi_bias,
    alibi_slopes,
    rope_cos_sin,
    rope_kernel,
    rope_rotate,
    rope_rotations,
    rope_wavelengths,
    rotate_half,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)
from rope_extend.methods import RopeContext, compute, default_inv_freq

DIM = 32


def test_sinusoidal_layout():
    pe = sinusoidal_encoding([0, 3], DIM)
    w = sinusoidal_frequencies(DIM)
    assert pe.shape == (2, DIM)
    assert torch.equal(pe[0, 0::2], torch.zeros(DIM // 2, dtype=torch.float64))
    assert torch.equal(pe[0, 1::2], torch.ones(DIM // 2, dtype=torch.float64))
    i = 5
    assert pe[1, 2 * i].item() == pytest.approx(math.sin(3 / 10000 ** (2 * i / DIM)))
    assert pe[1, 2 * i + 1].item() == pytest.approx(math.cos(3 * w[i].item()))


@pytest.mark.parametrize("k", [0, 1, 7, 50, 333])
def test_sinusoidal_dot_product_depends_only_on_offset(k):
    w = sinusoidal_frequencies(DIM)
    expected = torch.cos(w * k).sum().item()
    for t in (0, 13, 200, 4096):
        pe = sinusoidal_encoding([t, t + k], DIM)
        assert (pe[0] @ pe[1]).item() == pytest.approx(expected, abs=1e-9)
        if t - k >= 0:  # symmetric in ±k
            back = sinusoidal_encoding([t, t - k], DIM)
            assert (back[0] @ back[1]).item() == pytest.approx(expected, abs=1e-9)


def _scaled_inv_freqs():
    ctx = RopeContext(rotary_dim=DIM, base=10000.0, original_max_position_embeddings=64, factor=4.0, seq_len=256)
    freqs = {"plain": default_inv_freq(DIM, 10000.0)}
    for method in ("linear", "ntk", "yarn", "llama3", "dynamic"):
        freqs[method] = compute(method, ctx)[0]
    return freqs


@pytest.mark.parametrize("name,inv_freq", list(_scaled_inv_freqs().items()))
def test_rope_inner_product_depends_only_on_offset(name, inv_freq):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(DIM, generator=generator, dtype=torch.float64)
    k = torch.randn(DIM, generator=generator, dtype=torch.float64)
    for offset in (0, 3, 17, 250):
        values = [
            (rope_rotate(q, [m], inv_freq) @ rope_rotate(k, [m - offset], inv_freq)).item()
            for m in (offset, offset + 1, offset + 100, offset + 5000)
        ]
        assert max(values) - min(values) < 1e-9 * max(1.0, abs(values[0])), (name, offset, values)
    # and the rotation does depend on the offset (not a trivial identity)
    assert (rope_rotate(q, [10], inv_freq) @ rope_rotate(k, [0], inv_freq)).item() != pytest.approx(
        (q @ k).item(), abs=1e-6
    )


def test_rope_matches_transformers_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = default_inv_freq(DIM, 10000.0).double()
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 5, DIM, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 2, 5, DIM, generator=generator, dtype=torch.float64)
    positions = list(range(10, 15))
    cos, sin = rope_cos_sin(positions, inv_freq)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos.unsqueeze(0), sin.unsqueeze(0))
    assert torch.allclose(rope_rotate(q, positions, inv_freq), q_ref, atol=1e-12)
    assert torch.allclose(rope_rotate(k, positions, inv_freq), k_ref, atol=1e-12)


def test_rope_is_a_rotation_and_attention_factor_scales_norm():
    inv_freq = default_inv_freq(DIM, 10000.0)
    x = torch.randn(DIM, dtype=torch.float64)
    assert rope_rotate(x, [123], inv_freq).norm().item() == pytest.approx(x.norm().item())
    assert rope_rotate(x, [123], inv_freq, attention_factor=1.5).norm().item() == pytest.approx(1.5 * x.norm().item())
    assert torch.equal(rotate_half(rotate_half(x)), -x)
    with pytest.raises(ValueError):
        rope_rotate(torch.zeros(DIM + 2), [0], inv_freq)


def test_wavelengths_rotations_kernel():
    inv_freq = default_inv_freq(DIM, 10000.0)
    lam = rope_wavelengths(inv_freq)
    assert lam[0].item() == pytest.approx(2 * math.pi)
    assert torch.allclose(rope_rotations(inv_freq, 1000), 1000 / lam)
    assert rope_kernel(inv_freq, [0]).item() == pytest.approx(1.0)
    # linear interpolation stretches the kernel by exactly s
    ks = torch.arange(0, 200, dtype=torch.float64)
    assert torch.allclose(rope_kernel(inv_freq / 4, 4 * ks), rope_kernel(inv_freq, ks), atol=1e-6)


def test_alibi_slopes_power_of_two():
    slopes = alibi_slopes(8)
    assert slopes == pytest.approx([1 / 2**h for h in range(1, 9)])
    assert alibi_slopes(16) == pytest.approx([2 ** (-8 * h / 16) for h in range(1, 17)])


def test_alibi_slopes_non_power_of_two():
    # the reference rule: the 8 slopes of 8 heads, then every other slope of 16 heads
    slopes = alibi_slopes(12)
    assert len(slopes) == 12
    assert slopes[:8] == pytest.approx(alibi_slopes(8))
    assert slopes[8:] == pytest.approx(alibi_slopes(16)[0::2][:4])
    assert slopes[8:] == pytest.approx([2 ** (-0.5), 2 ** (-1.5), 2 ** (-2.5), 2 ** (-3.5)])
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_alibi_bias_is_linear_in_distance():
    heads, n = 8, 10
    bias = alibi_bias(heads, n, causal=False)
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float64)
    assert bias.shape == (heads, n, n)
    for i, j in [(0, 0), (5, 2), (9, 0), (3, 7)]:
        assert torch.allclose(bias[:, i, j], -slopes * abs(i - j))
    # equal steps: the difference between successive keys is the slope, for every head
    row = bias[:, 9, :9]
    assert torch.allclose(row[:, 1:] - row[:, :-1], slopes.reshape(-1, 1).expand(heads, 8))
    causal = alibi_bias(heads, n)
    assert torch.isinf(causal[:, 2, 3]).all() and torch.equal(causal[:, 3, :4], bias[:, 3, :4])
