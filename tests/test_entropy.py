"""Attention entropy: checked against a manual softmax on a tiny random Llama; YaRN's temperature lowers it."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import ORIGINAL, input_ids, make_config, make_model
from transformers import AutoModelForCausalLM

from rope_extend import patch_model, unpatch_model
from rope_extend.encodings import rope_rotate
from rope_extend.entropy import attention_entropy, compare_entropy, mean_entropy, plot_entropy, row_entropy


@pytest.fixture(scope="module")
def model():
    return make_model("llama")  # hidden 64, 4 heads (2 kv), head_dim 16, 2 layers, vocab 128, eager


def manual_entropy(model, ids: torch.Tensor, queries: int | None = None) -> list[float]:
    """Mean row entropy per layer from q/k projections, our reference RoPE, and an explicit causal softmax."""
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    rotary = model.model.rotary_emb
    inv_freq, scaling = rotary.inv_freq, float(rotary.attention_scaling)
    n = ids.shape[1]
    positions = list(range(n))
    out = []
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        with torch.no_grad():
            x = layer.input_layernorm(hidden[index]).double()
            head_dim = attn.head_dim
            q = x @ attn.q_proj.weight.double().T
            k = x @ attn.k_proj.weight.double().T
            q = q.view(1, n, -1, head_dim).transpose(1, 2)
            k = k.view(1, n, -1, head_dim).transpose(1, 2)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            q = rope_rotate(q, positions, inv_freq, scaling)
            k = rope_rotate(k, positions, inv_freq, scaling)
            logits = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            p = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
            h = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # [1, heads, n]
            if queries is not None:
                h = h[..., -queries:]
            out.append(h.mean().item())
    return out


def test_row_entropy():
    assert row_entropy(torch.tensor([1.0, 0.0, 0.0])).item() == 0.0
    assert row_entropy(torch.full((8,), 1 / 8)).item() == pytest.approx(math.log(8))


def test_entropy_matches_manual_softmax(model):
    ids = input_ids(48)
    result = attention_entropy(model, ids, [16, 48])
    assert set(result) == {16, 48} and all(len(v) == 2 for v in result.values())
    for n in (16, 48):
        assert result[n] == pytest.approx(manual_entropy(model, ids[:, :n]), rel=1e-4)
    last = attention_entropy(model, ids, [48], queries=8)
    assert last[48] == pytest.approx(manual_entropy(model, ids, queries=8), rel=1e-4)
    # entropy is bounded by ln(keys): mean over all queries <= mean ln(i+1)
    bound = sum(math.log(i + 1) for i in range(48)) / 48
    assert all(0 < h <= bound for h in result[48])


def test_entropy_matches_output_attentions(model):
    ids = input_ids(24)
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    expected = [row_entropy(a).mean().item() for a in attentions]
    assert attention_entropy(model, ids, [24])[24] == pytest.approx(expected, rel=1e-6)


def test_patched_entropy_uses_scaled_rope_and_yarn_temperature_lowers_it(model):
    ids = input_ids(ORIGINAL * 4)
    patch_model(model, method="ntk-by-parts", factor=4)
    try:
        assert attention_entropy(model, ids, [64])[64] == pytest.approx(manual_entropy(model, ids[:, :64]), rel=1e-4)
    finally:
        unpatch_model(model)
    lengths = [ORIGINAL, 2 * ORIGINAL, 4 * ORIGINAL]
    results = compare_entropy(
        model,
        ids,
        lengths,
        {
            "original": None,
            "ntk-by-parts": {"method": "ntk-by-parts", "factor": 4},
            "yarn": {"method": "yarn", "factor": 4},
        },
    )
    assert not hasattr(model, "_rope_extend_state")  # every variant was undone
    for n in lengths:
        by_parts, yarn = results["ntk-by-parts"][n], results["yarn"][n]
        # same frequencies; yarn multiplies logits by (0.1 ln 4 + 1)^2 ~ 1.30: sharper rows in the first layer
        assert yarn[0] < by_parts[0]
        assert mean_entropy(results["yarn"])[n] < mean_entropy(results["ntk-by-parts"])[n]
        assert results["original"][n] != pytest.approx(by_parts, rel=1e-9)


def test_sdpa_model_is_switched_to_eager_and_back(model):
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(make_config("llama"), attn_implementation="sdpa").eval()
    sdpa.load_state_dict(model.state_dict())
    ids = input_ids(20)
    assert attention_entropy(sdpa, ids, [20])[20] == pytest.approx(attention_entropy(model, ids, [20])[20], rel=1e-5)
    assert sdpa.config._attn_implementation == "sdpa"


def test_bad_lengths(model):
    ids = input_ids(10)
    with pytest.raises(ValueError, match="outside 1..10"):
        attention_entropy(model, ids, [11])
    with pytest.raises(ValueError, match="at least one"):
        attention_entropy(model, ids, [])


def test_plot_entropy(model, tmp_path):
    ids = input_ids(32)
    results = {"original": attention_entropy(model, ids, [8, 16, 32])}
    path = plot_entropy(results, tmp_path / "entropy.png", original_length=ORIGINAL, title="tiny")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    single = plot_entropy(results["original"], tmp_path / "single.png")
    assert single.stat().st_size > 1000
