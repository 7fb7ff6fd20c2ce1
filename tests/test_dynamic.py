"""Dynamic scaling under a KV cache: consistent mode = one-shot logits; stock mode shown to differ."""

from __future__ import annotations

import warnings

import pytest
import tiny
import torch

from rope_extend import patch_model
from rope_extend.dynamic import fixed_rope_length, hooks_of

L = tiny.ORIGINAL
NEW = 64


def generate_logits(model, ids, attention_mask=None, new=NEW):
    out = model.generate(
        ids,
        attention_mask=attention_mask if attention_mask is not None else torch.ones_like(ids),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences, torch.stack(out.logits, dim=1)  # [batch, new, vocab]


def one_shot_logits(model, sequences, attention_mask, prompt_len, new=NEW):
    mask = torch.cat([attention_mask, torch.ones(sequences.shape[0], new, dtype=attention_mask.dtype)], dim=1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(sequences, attention_mask=mask, position_ids=position_ids).logits
    return logits[:, prompt_len - 1 : prompt_len - 1 + new]


def patched(method, mode, **extra):
    model = tiny.make_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, dynamic_mode=mode, **tiny.spec_kwargs(method, "llama"), **extra)
    return model


@pytest.mark.parametrize("method", ["dynamic", "dynamic-yarn"])
def test_consistent_mode_incremental_equals_one_shot_and_stock_differs(method):
    ids = tiny.input_ids(20)
    mask = torch.ones_like(ids)
    errors = {}
    for mode in ("consistent", "stock"):
        model = patched(method, mode)
        sequences, incremental = generate_logits(model, ids)
        assert sequences.shape[1] == 20 + NEW > L  # crosses the original length
        errors[mode] = (incremental - one_shot_logits(model, sequences, mask, 20)).abs().max().item()
    assert errors["consistent"] < 1e-4
    assert errors["stock"] > 1e-3, errors  # the transformers #25104 behaviour


@pytest.mark.parametrize("method", ["dynamic", "dynamic-yarn"])
def test_long_then_short_inputs_reset(method):
    unpatched = tiny.make_model("llama")
    short, medium, long = tiny.input_ids(16), tiny.input_ids(48, seed=3), tiny.input_ids(128)
    with torch.no_grad():
        want_short = unpatched(short).logits
    fresh = patched(method, "consistent")
    with torch.no_grad():
        want_medium = fresh(medium).logits
    for mode in ("consistent", "stock"):
        model = patched(method, mode)
        with torch.no_grad():
            model(long)
            torch.testing.assert_close(model(short).logits, want_short, atol=1e-6, rtol=0)
            model(long)
            got_medium = model(medium).logits
        if mode == "consistent":  # each call uses its own length
            torch.testing.assert_close(got_medium, want_medium, atol=1e-6, rtol=0)
        else:  # stock keeps the longest scale seen while the length stays above L
            assert (got_medium - want_medium).abs().max() > 1e-4


@pytest.mark.parametrize("final", [L - 1, L, L + 1])
def test_longrope_switch_at_original_length(final):
    new = 8
    ids = tiny.input_ids(final - new)
    mask = torch.ones_like(ids)
    model = patched("longrope", "consistent")
    sequences, incremental = generate_logits(model, ids, new=new)
    assert sequences.shape[1] == final
    torch.testing.assert_close(incremental, one_shot_logits(model, sequences, mask, final - new, new), atol=1e-4, rtol=0)
    hook = hooks_of(model)[0]
    assert (hook.current is None) == (final <= L)  # short factors up to L, long factors beyond

    if final == L + 1:  # stock: the first steps ran with short factors, the last with long ones
        stock = patched("longrope", "stock")
        sequences, incremental = generate_logits(stock, ids, new=new)
        assert (incremental - one_shot_logits(stock, sequences, mask, final - new, new)).abs().max() > 1e-4


def test_batch_with_left_padding():
    model = patched("dynamic-yarn", "consistent")
    a, b = tiny.input_ids(20, seed=5)[0], tiny.input_ids(14, seed=6)[0]
    ids = torch.stack([a, torch.cat([torch.zeros(6, dtype=torch.long), b])])
    mask = torch.stack([torch.ones(20, dtype=torch.long), torch.cat([torch.zeros(6), torch.ones(14)]).long()])
    sequences, incremental = generate_logits(model, ids, attention_mask=mask)
    torch.testing.assert_close(incremental, one_shot_logits(model, sequences, mask, 20), atol=1e-4, rtol=0)
    # each row equals the same row generated alone
    alone_seq, alone = generate_logits(model, a[None])
    torch.testing.assert_close(alone_seq[0], sequences[0])
    torch.testing.assert_close(alone[0], incremental[0], atol=1e-4, rtol=0)


def test_fixed_rope_length_for_manual_loops():
    model = patched("dynamic", "consistent")
    ids = tiny.input_ids(100)
    with torch.no_grad():
        one_shot = model(ids).logits
        with fixed_rope_length(model, 100):
            out = model(ids[:, :40], use_cache=True)
            steps = [out.logits[:, -1]]
            cache = out.past_key_values
            for t in range(40, 99):
                out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), one_shot[:, 39:99], atol=1e-4, rtol=0)
