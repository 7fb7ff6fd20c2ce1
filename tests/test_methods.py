"""Every method against (a) an independent float64 reference written here from the papers' formulas and (b)
transformers' own ROPE_INIT_FUNCTIONS where transformers has the method, over the issue's grid."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rope_extend import compat
from rope_extend.methods import RopeContext, compute, method_names

pytestmark = pytest.mark.portability

HEAD_DIMS = [16, 64, 80, 96, 128]
BASES = [1e4, 5e5, 1e6]
FACTORS = [1.5, 2, 4, 8, 16, 32]
ORIGINALS = [2048, 4096, 8192, 32768]
PARTIALS = [0.25, 0.5, 1.0]


def grid():
    for head_dim, base, factor, original, partial in itertools.product(HEAD_DIMS, BASES, FACTORS, ORIGINALS, PARTIALS):
        dim = int(head_dim * partial)
        if dim >= 4:
            yield head_dim, base, factor, original, partial, dim


# --- independent references (numpy float64, straight from the formulas) ------------------------------------------
def ref_theta(dim, base):
    i = np.arange(dim // 2, dtype=np.float64)
    return base ** (-2.0 * i / dim)


def ref_ramp_blend(dim, base, original, factor, beta_fast=32.0, beta_slow=1.0, truncate=True):
    def dim_of(rotations):  # d * ln(L / (2 pi r)) / (2 ln b)
        return dim * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(base))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    theta = ref_theta(dim, base)
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    keep = 1 - ramp  # gamma_i: 1 = extrapolate (keep theta_i), 0 = interpolate (theta_i / s)
    return theta / factor * (1 - keep) + theta * keep


def reference(method, dim, base, original, factor, seq_len=None, params=None):
    params = params or {}
    theta = ref_theta(dim, base)
    if method in ("self-extend", "dual-chunk", "string"):  # act on attention: the RoPE stays the original one
        return theta, 1.0
    if method == "linear":
        return theta / factor, 1.0
    if method == "ntk":
        return ref_theta(dim, base * factor ** (dim / (dim - 2))), 1.0
    if method == "dynamic":
        n = max(seq_len or original, original)
        s = factor * n / original - (factor - 1)
        return ref_theta(dim, base * s ** (dim / (dim - 2))), 1.0
    if method == "ntk-by-parts":
        return ref_ramp_blend(dim, base, original, factor), 1.0
    if method == "yarn":
        mscale = 0.1 * math.log(factor) + 1 if factor > 1 else 1.0
        return ref_ramp_blend(dim, base, original, factor), mscale
    if method == "dynamic-yarn":
        s = max(1.0, (seq_len or 0) / original)
        if s == 1.0:
            return theta, 1.0
        return ref_ramp_blend(dim, base, original, s), 0.1 * math.log(s) + 1
    if method == "llama3":
        low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
        wavelen = 2 * math.pi / theta
        out = np.where(wavelen > original / low, theta / factor, theta)
        a = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        return np.where(medium, (1 - a) * theta / factor + a * theta, out), 1.0
    if method == "longrope":
        lists = params["long_factor"] if (seq_len or 0) > original else params["short_factor"]
        attn = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        return theta / np.asarray(lists, dtype=np.float64), attn
    raise AssertionError(method)


def longrope_lists(dim, factor):
    half = dim // 2
    return {
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.0 + (factor - 1.0) * (i + 1) / half for i in range(half)],
    }


def test_every_method_is_covered():
    assert sorted(method_names()) == sorted(
        ["linear", "ntk", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope", "self-extend",
         "dual-chunk", "string"]
    )


@pytest.mark.parametrize("method", sorted(method_names()))
def test_matches_independent_reference_on_grid(method):
    checked = 0
    for _head_dim, base, factor, original, _partial, dim in grid():
        params = longrope_lists(dim, factor) if method == "longrope" else {}
        for seq_len in (None, 3 * original) if method in ("dynamic", "dynamic-yarn", "longrope") else (None,):
            ctx = RopeContext(dim, base, original, float(factor), params, seq_len=seq_len)
            inv_freq, attention = compute(method, ctx)
            want, want_attn = reference(method, dim, base, original, factor, seq_len, params)
            assert inv_freq.dtype == torch.float32 and inv_freq.shape == (dim // 2,)
            np.testing.assert_allclose(inv_freq.double().numpy(), want, rtol=1e-5, err_msg=f"{method} {ctx}")
            assert math.isclose(attention, want_attn, rel_tol=1e-9), (method, ctx)
            checked += 1
    assert checked >= 1000


def hf_config(dim_head, partial, base, original, params, max_position_embeddings=None):
    """A LlamaConfig carrying `params` as its RoPE, in the running transformers' layout."""
    config = LlamaConfig(
        hidden_size=dim_head * 4, num_attention_heads=4, head_dim=dim_head, max_position_embeddings=original
    )
    slot = {"rope_theta": base, **params}
    if partial != 1.0:
        slot["partial_rotary_factor"] = partial
        config.partial_rotary_factor = partial
    compat.write_slots(config, {None: slot}, max_position_embeddings or original, None)
    return config


HF_TYPES = {"linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3", "longrope": "longrope"}


@pytest.mark.parametrize("method", sorted(HF_TYPES))
def test_matches_transformers_rope_init_functions(method):
    """Same method in transformers -> equal to 1e-6 relative (inv_freq) and attention factor."""
    fn = ROPE_INIT_FUNCTIONS[HF_TYPES[method]]
    checked = 0
    for head_dim, base, factor, original, partial, dim in grid():
        if base == 5e5 and head_dim in (64, 96):  # keep the run short; every other combination is checked
            continue
        params = {"rope_type": HF_TYPES[method], "factor": float(factor)}
        extra = {}
        if method in ("yarn", "llama3", "longrope"):
            params["original_max_position_embeddings"] = original
        if method == "llama3":
            params.update(low_freq_factor=1.0, high_freq_factor=4.0)
        if method == "longrope":
            extra = longrope_lists(dim, factor)
            params.update(extra)
        # Phi-3 semantics: max_position_embeddings is the extended length (4.x derives longrope's factor from it)
        max_pos = int(factor * original) if method == "longrope" else original
        config = hf_config(head_dim, partial, base, original, params, max_pos)
        if method == "longrope":
            config.original_max_position_embeddings = original
        for seq_len in (None, 3 * original) if method in ("dynamic", "longrope") else (None,):
            theirs, their_attn = fn(config, None, seq_len=seq_len) if seq_len else fn(config, None)
            ours, our_attn = compute(method, RopeContext(dim, base, original, float(factor), extra, seq_len=seq_len))
            torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
            assert math.isclose(our_attn, their_attn, rel_tol=1e-6)
            checked += 1
    assert checked >= 300


@pytest.mark.parametrize("extra", [{"mscale": 0.707, "mscale_all_dim": 0.707}, {"mscale": 1.0, "mscale_all_dim": 0.5},
                                   {"attention_factor": 1.25}, {"beta_fast": 128.0, "beta_slow": 2.0},
                                   {"truncate": False}])
def test_yarn_variants_match_transformers(extra):
    """DeepSeek mscale, explicit attention factor, Mistral's betas, gpt-oss truncate=False."""
    fn = ROPE_INIT_FUNCTIONS["yarn"]
    for head_dim, base, factor, original in itertools.product([64, 128], [1e4, 1e6], [4, 40], [4096, 32768]):
        params = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original, **extra}
        config = hf_config(head_dim, 1.0, base, original, params)
        theirs, their_attn = fn(config, None)
        ours, our_attn = compute("yarn", RopeContext(head_dim, base, original, float(factor), extra))
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
        assert math.isclose(our_attn, their_attn, rel_tol=1e-6)


def test_yarn_attention_factor_formula():
    for s in FACTORS:
        _, attn = compute("yarn", RopeContext(128, 1e4, 4096, float(s)))
        assert math.isclose(attn, 0.1 * math.log(s) + 1, rel_tol=1e-12)
    # DeepSeek: mscale == mscale_all_dim cancels to exactly 1
    _, attn = compute("yarn", RopeContext(64, 1e4, 4096, 40.0, {"mscale": 0.707, "mscale_all_dim": 0.707}))
    assert attn == pytest.approx(1.0)


def test_ntk_keeps_highest_and_divides_lowest_frequency_by_s():
    for dim, base, s in itertools.product([16, 64, 128], BASES, FACTORS):
        theta = ref_theta(dim, base)
        inv, _ = compute("ntk", RopeContext(dim, base, 4096, float(s)))
        assert inv[0].item() == pytest.approx(1.0)
        assert inv[-1].item() == pytest.approx(theta[-1] / s, rel=1e-5)


def test_dynamic_methods_equal_original_below_original_length():
    theta = torch.tensor(ref_theta(64, 1e4), dtype=torch.float32)
    for method in ("dynamic", "dynamic-yarn"):
        for seq_len in (None, 1, 4095, 4096):
            inv, attn = compute(method, RopeContext(64, 1e4, 4096, 8.0, {}, seq_len=seq_len))
            torch.testing.assert_close(inv, theta, rtol=1e-6, atol=0)
            assert attn == 1.0


def test_dynamic_yarn_equals_static_yarn_at_its_scale():
    for n in (8192, 4096 * 3, 32768):
        dyn = compute("dynamic-yarn", RopeContext(64, 1e4, 4096, 8.0, {}, seq_len=n))
        static = compute("yarn", RopeContext(64, 1e4, 4096, n / 4096))
        torch.testing.assert_close(dyn[0], static[0])
        assert dyn[1] == static[1]


def test_longrope_switches_after_original_length():
    lists = longrope_lists(64, 4)
    at = {n: compute("longrope", RopeContext(64, 1e4, 4096, 4.0, lists, seq_len=n))[0] for n in (4095, 4096, 4097)}
    theta = torch.tensor(ref_theta(64, 1e4), dtype=torch.float32)
    torch.testing.assert_close(at[4096], theta / torch.tensor(lists["short_factor"]), rtol=1e-6, atol=0)
    torch.testing.assert_close(at[4095], at[4096])
    torch.testing.assert_close(at[4097], theta / torch.tensor(lists["long_factor"]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("original, target", [(8192, 16384), (8192, 32768), (4096, 65536), (2048, 3000)])
def test_attention_methods_list_the_defaults_they_derive(original, target, capsys):
    """`rope-extend methods` shows the rule behind every derived default, and fill_params applies exactly that rule
    (computed here from the listed text, by brute force for self-extend's group size)."""
    from rope_extend.cli import run
    from rope_extend.spec import RopeSpec

    assert run(["methods"]) == 0
    listed = " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns between words
    assert "parameters: chunk_size=3L/4, local_window=L/8, log_n=False, length_scale=0.05" in listed
    assert "parameters: group_size=smallest G ≥ 2 with W + (N−W)/G ≤ 5L/8, neighbor_window=L/8, log_n=False" in listed
    L, N = original, target
    spec = RopeSpec(method="dual-chunk", target_length=N, original_max_position_embeddings=L)
    filled = spec.rope_method.fill_params(spec)
    assert (filled.chunk_size, filled.local_window, filled.length_scale) == (3 * L // 4, L // 8, 0.05)
    spec = RopeSpec(method="self-extend", target_length=N, original_max_position_embeddings=L)
    filled = spec.rope_method.fill_params(spec)
    W = L // 8
    smallest = next(g for g in itertools.count(2) if W + (N - W) / g <= 5 * L / 8)
    assert filled.neighbor_window == W
    # the smallest such G, or (a divisor of W preferred) the next one dividing W
    assert filled.group_size == smallest or (filled.group_size > smallest and W % filled.group_size == 0
                                             and all(W % g for g in range(smallest, filled.group_size)))
