"""STRING (rope_extend/methods/string.py): exact against a naive reference written from the paper's rule, on every
path (the CPU fused path, the general path, the passes path with both primitives, cached decoding), at the
boundaries d = S - 1, S, S + 1 and n = S, S + 1; the decisions where the authors' code and the paper differ; the
beyond-window rule; and the model's own RoPE scheme kept (Llama 3.1, Qwen2.5 with YaRN, Gemma 3).

The reference scores each (query, key) pair from the un-rotated query and key at the distance the rule gives
(`string_distance`), in float64 (`test_attention_methods.reference_attention`); it never re-rotates anything.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from helpers import (
    IMPLS,
    attention_inputs,  # random q/k/v at given positions, as the passes tests draw them
    cache_kwargs,
    distances,
    generate_alone_and_after_a_shared_prefix,
    make,
    pair_scores,
    reference_attention,
    rope,
    string_distance,  # the paper's rule: d < S keeps d, d >= S becomes d - S + W
)

from rope_extend import SpecError, UnsupportedModelError, patch_model, plan_patch, unpatch_model
from rope_extend.attention import kernels, primitives, runtime
from rope_extend.attention.maps import StringMap
from rope_extend.attention.positions import Positions

warnings.filterwarnings("ignore", message=".*acts on attention.*")

AUTHORS = 0.1 * math.log(2) + 1  # the factor the authors' code puts on cos and sin


def _allowed(B, n_q, n_k):
    return (torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None])[None].repeat(B, 1, 1)


def _counting(monkeypatch, owner, name):
    """Count the calls of owner.name (patched where it is looked up)."""
    calls = []
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(name) or original(*a, **k))
    return calls


PATHS = ["fused", "general", "passes-cpu-kernel", "passes-flex-eager"]


def _run(path, q, k, v, q_pos, k_pos, scaling, mapping, inv_freq, memo, store):
    kwargs = {"memo": memo, "key_store": store, "block_queries": 5, "block_elements": 5 * 4 * 64}
    if path.startswith("passes"):
        primitive = (primitives.CpuKernelPrimitive() if path.endswith("cpu-kernel")
                     else primitives.FlexPrimitive(compiled=False))
        kwargs.update(path="passes", primitive=primitive)
    else:
        kwargs.update(path=path)
    return kernels.remapped_attention(q, k, v, Positions.of(k_pos), None, scaling, mapping, inv_freq.float(), **kwargs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("offset, local, factor", [(12, 4, 1.0), (7, 1, 1.0), (12, 4, AUTHORS), (20, 19, 1.0)])
def test_kernel_equals_the_papers_rule_on_every_path(path, offset, local, factor, monkeypatch):
    """A 40-token prompt (every distance 0..39 across S), 5 queries after a cache starting at position 17, and
    two decoding steps; batch 2, GQA (4 query heads on 2 key heads), partial rotary (8 of 16 dims), blocks of 5
    queries; attention_factor f multiplies every logit by f². float32 to 2e-5 of the float64 reference. The
    passes path runs its primitive (counted); no path rotates a key (STRING moves none)."""
    if path == "passes-flex-eager" and not primitives.flex_available():
        pytest.skip("this torch has no FlexAttention")
    if path != "general" and kernels.fused_kernel() is None:
        pytest.skip("this torch has no fused CPU attention with log-sum-exp")
    mapping = StringMap(offset, local, factor**2)
    B, H, Hkv, D, rdim = 2, 4, 2, 16, 8
    called = []
    if path.startswith("passes"):
        owner = primitives.CpuKernelPrimitive if path.endswith("cpu-kernel") else primitives.FlexPrimitive
        for name in ("masked", "decode"):
            original = getattr(owner, name)
            monkeypatch.setattr(owner, name, lambda self, *a, _o=original, _n=name: called.append(_n) or _o(self, *a))
    moved_key_rows = _counting(monkeypatch, kernels, "key_rotation")
    memo, store, previous = {}, {}, None
    for n_q, n_k, start in ((40, 40, 0), (5, 33, 17), (1, 34, 17), (1, 35, 17)):
        q_raw, k_raw, v, q_pos, k_pos, inv_freq = attention_inputs(B, H, Hkv, D, rdim, n_q, n_k, start, seed=n_k)
        q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
        if n_q == 1:  # a decoding step: the previous call's keys plus one
            (k_raw[:, :, :-1], v[:, :, :-1]), k_prev = previous
            k = torch.cat((k_prev, rope(k_raw[:, :, -1:], k_pos[:, -1:], inv_freq)), dim=2)
        got = _run(path, q, k, v, q_pos, k_pos, D**-0.5, mapping, inv_freq, memo, store)
        previous = (k_raw, v), k
        want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, _allowed(B, n_q, n_k), D**-0.5 * factor**2,
                                   string_distance, (offset, local), inv_freq)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)
    assert not moved_key_rows
    if path.startswith("passes"):
        assert "masked" in called and "decode" in called


@pytest.mark.parametrize("path", PATHS)
def test_boundaries_d_equal_to_s_is_shifted(path):
    """n = S - 1, S, S + 1, S + 2 tokens (distances up to S - 2 ... S + 1): exact against the paper's rule
    (d = S shifted). At n = S every distance is below S: plain causal attention. At n = S + 1 exactly one pair has
    d = S, and the authors' prefill (which counts that key in both passes: a flash-attn window [S, 0] and the
    shifted call) gives a different answer than their own decoding and than this one."""
    if path == "passes-flex-eager" and not primitives.flex_available():
        pytest.skip("this torch has no FlexAttention")
    if path != "general" and kernels.fused_kernel() is None:
        pytest.skip("this torch has no fused CPU attention with log-sum-exp")
    S, W = 9, 2
    mapping = StringMap(S, W)
    B, H, Hkv, D = 1, 2, 1, 8
    for n in (S - 1, S, S + 1, S + 2):
        q_raw, k_raw, v, q_pos, k_pos, inv_freq = attention_inputs(B, H, Hkv, D, D, n, n, 0, seed=n)
        q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
        got = _run(path, q, k, v, q_pos, k_pos, 0.5, mapping, inv_freq, {}, {}).double()
        want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, _allowed(B, n, n), 0.5, string_distance, (S, W),
                                   inv_freq)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
        if n <= S:
            plain = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double().repeat(1, H, 1, 1),
                                                                     v.double().repeat(1, H, 1, 1), is_causal=True,
                                                                     scale=0.5)
            torch.testing.assert_close(got, plain.transpose(1, 2), atol=2e-5, rtol=0)
        if n == S + 1:  # the authors' prefill: the key at d = S also in the neighbour pass, at distance S
            i = q_pos[0, -1].item()
            authors = []
            for h in range(H):
                rule = distances(string_distance, [i], k_pos[0].tolist(), S, W)
                scores = pair_scores(q_raw[0, h, -1:], k_raw[0, 0], rule, inv_freq)[0]
                twice = pair_scores(q_raw[0, h, -1:], k_raw[0, 0, :1], torch.tensor([[float(S)]]).double(), inv_freq)[0]
                weights = torch.softmax(torch.cat((scores, twice)) * 0.5, -1)
                authors.append(weights @ torch.cat((v[0, 0], v[0, 0, :1])).double())
            authors = torch.stack(authors)
            assert (authors - got[0, -1]).abs().max() > 1e-3  # the decision is visible at n = S + 1


def test_every_key_at_d_at_least_s_uses_d_minus_s_plus_w():
    """The map itself: selection at d = S - 1, S, S + 1 and the shifted map's distances d - S + W there."""
    S, W = 10, 3
    mapping = StringMap(S, W)
    q_pos = torch.tensor([[30]])
    k_pos = torch.tensor([[30 - (S - 1), 30 - S, 30 - (S + 1)]])
    assert mapping.select(q_pos[..., None], k_pos[:, None]).tolist() == [[[0, 1, 1]]]
    shift = mapping.query_shifts(q_pos)[1]
    assert ((q_pos + shift)[..., None] - k_pos[:, None]).tolist() == [[[W - 1 + 0 * S + 0, W, W + 1]]]
    for p in mapping.passes(30, 0, "cpu"):
        lo, hi = p.key_range(30)
        assert (lo, hi) == ((30 - S + 1, 31) if p.name == "neighbour" else (0, 30 - S + 1))
    assert mapping.is_identity(0, S - 1)  # keys at positions 0 .. S - 1: every distance below S
    assert not mapping.is_identity(0, S)
    assert not StringMap(S, W, AUTHORS**2).is_identity(0, 1)


@pytest.mark.parametrize("primitive", ["cpu-kernel", "flex-eager"])
def test_passes_bf16_within_bf16_rounding(primitive):
    """bfloat16 through the passes path: within 3x plain causal SDPA's own bf16 error against float64."""
    if primitive == "flex-eager" and not primitives.flex_available():
        pytest.skip("this torch has no FlexAttention")
    if primitive == "cpu-kernel" and kernels.fused_kernel() is None:
        pytest.skip("this torch has no fused CPU attention with log-sum-exp")
    make_primitive = (primitives.CpuKernelPrimitive if primitive == "cpu-kernel"
                      else lambda: primitives.FlexPrimitive(compiled=False))
    B, H, Hkv, D, n = 2, 4, 2, 16, 64
    q_raw, k_raw, v, q_pos, k_pos, inv_freq = attention_inputs(B, H, Hkv, D, D, n, n, 0, seed=3)
    q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
    bf = [t.to(torch.bfloat16) for t in (q, k, v)]
    for path in ("passes", "fused"):
        if path == "fused" and kernels.fused_kernel() is None:
            continue
        got = kernels.remapped_attention(*bf, Positions.of(k_pos), None, D**-0.5, StringMap(20, 4), inv_freq.float(),
                                         memo={}, path=path, primitive=make_primitive() if path == "passes" else None)
        assert got.dtype == torch.bfloat16
        want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, _allowed(B, n, n), D**-0.5, string_distance,
                                   (20, 4), inv_freq)
        rep = H // Hkv
        plain = torch.nn.functional.scaled_dot_product_attention(
            bf[0], bf[1].repeat_interleave(rep, 1), bf[2].repeat_interleave(rep, 1), is_causal=True)
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1), is_causal=True)
        rounding = (plain.double() - exact).abs().max().item()
        error = (got.double() - want).abs().max().item()
        assert 0 < error <= 3 * rounding, (path, error, rounding)


# --- whole models ------------------------------------------------------------------------------------------------------
SPEC = {"method": "string", "shifted_offset": 12, "local_value": 4}


def _string_reference(monkeypatch):
    """Swap the kernel for the reference: un-rotate the model's q/k at their positions, then the paper's rule."""
    def reference(query, key, value, positions, mask, scaling, mapping, inv_freq, *, softcap=None,
                  log_n_original=None, block_elements=None, memo=None, key_store=None):
        k_pos = positions.key_ids()  # host-known positions (the runtime's) or the tensor it recorded
        q_pos = k_pos[:, k_pos.shape[1] - query.shape[2] :]
        unrotate = lambda x, p: rope(x.double(), -p, inv_freq.double()).float()
        n_k, B = k_pos.shape[1], query.shape[0]
        q_pos, k_pos = q_pos.expand(B, -1), k_pos.expand(B, -1)
        allowed = (torch.arange(n_k)[None, :] <= torch.arange(n_k - query.shape[2], n_k)[:, None])[None].repeat(B, 1, 1)
        out = reference_attention(unrotate(query, q_pos), unrotate(key[:, :, :n_k], k_pos), value[:, :, :n_k], q_pos,
                                  k_pos, allowed, scaling * mapping.logits_times(n_k), string_distance,
                                  (mapping.shifted_offset, mapping.local_value), inv_freq, softcap)
        return out.to(query.dtype)

    monkeypatch.setattr(runtime, "remapped_attention", reference)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt_neox", "gemma3_text"])
@pytest.mark.parametrize("factor", [1.0, AUTHORS])
def test_models_equal_the_reference_and_are_the_original_below_s(arch, factor):
    """Tiny models (GQA; gpt_neox: partial rotary; gemma3: the full-attention layers only): 32 tokens (the window)
    equal the naive reference; with attention_factor 1, a prompt whose every distance is below S is the
    original model bit for bit; with the authors' factor it is not."""
    ids = tiny.input_ids(32)
    unpatched = make(arch)
    model = make(arch)
    patch_model(model, **SPEC, attention_factor=factor)
    short = ids[:, :12]
    with torch.no_grad(), pytest.MonkeyPatch.context() as monkeypatch:
        got = model(ids).logits
        same = torch.equal(model(short).logits, unpatched(short).logits)
        _string_reference(monkeypatch)
        want = model(ids).logits
        base = unpatched(ids).logits
    assert same == (factor == 1.0)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("factor", [1.0, AUTHORS])
def test_incremental_equals_one_shot_and_decoding_rotates_no_key(impl, factor, monkeypatch):
    """Prefill in pieces, token-by-token decoding across n = S and n = S + 1, and a reused KV prefix give one
    forward's logits; no key of the cache is re-rotated (the shifted pass moves only queries)."""
    from transformers import DynamicCache

    model = make("llama", impl)
    patch_model(model, **SPEC, attention_factor=factor)
    ids = tiny.input_ids(32)
    rotated = []
    rotate = kernels.rotate
    heads = model.config.num_key_value_heads
    monkeypatch.setattr(kernels, "rotate", lambda x, *a: rotated.append(x.shape[1]) or rotate(x, *a))
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        pieces = [model(ids[:, :8], **cache_kwargs(cache)).logits, model(ids[:, 8:11], **cache_kwargs(cache)).logits]
        pieces += [model(ids[:, t : t + 1], **cache_kwargs(cache)).logits for t in range(11, 32)]  # n = 12, 13, ...
        torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-4, rtol=0)
        prefix = DynamicCache(config=model.config)
        model(ids[:, :20], **cache_kwargs(prefix))
        got = model(ids[:, 20:], **cache_kwargs(copy.deepcopy(prefix))).logits
        torch.testing.assert_close(got, full[:, 20:], atol=1e-4, rtol=0)
    assert rotated and heads not in rotated  # queries rotated (4 heads), never a [B, Hkv, ...] key


@pytest.mark.skipif(kernels.fused_kernel() is None, reason="this torch has no fused CPU attention with log-sum-exp")
@pytest.mark.parametrize("path", ["fused", "passes"])
def test_model_paths_and_left_padded_batch(path, monkeypatch):
    """SDPA: the fused path by default on CPU, the passes path when forced (as CUDA does), both equal and each
    counted; a left-padded batch of two (the general path) equals each row alone."""
    model = make("llama", "sdpa")
    patch_model(model, **SPEC)
    ids = tiny.input_ids(32)
    with torch.no_grad():
        fused = model(ids).logits
    taken = []
    original = kernels.select_path
    if path == "passes":
        monkeypatch.setattr(primitives, "primitive_for", lambda device: primitives.CpuKernelPrimitive())
        monkeypatch.setattr(kernels, "select_path", lambda d, s, c, m: taken.append("passes" if s is not None else
                                                                                      original(d, s, c, m)) or taken[-1])
    else:
        monkeypatch.setattr(kernels, "select_path", lambda *a: taken.append(original(*a)) or taken[-1])
    rows = [tiny.input_ids(30, seed=3)[0], tiny.input_ids(21, seed=4)[0]]
    padded = torch.stack([rows[0], torch.cat((torch.zeros(9, dtype=torch.long), rows[1]))])
    mask = (torch.arange(30)[None] >= torch.tensor([0, 9])[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(ids).logits
        assert set(taken) == {path}
        batch = model(padded, attention_mask=mask, position_ids=positions).logits
        assert "general" in taken
        for b, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            torch.testing.assert_close(batch[b, 30 - len(row) :], alone, atol=1e-4, rtol=0)
    torch.testing.assert_close(got, fused, atol=1e-5, rtol=0)


def test_unpatch_restores_bit_exactly():
    model = make("llama")
    ids = tiny.input_ids(32)
    with torch.no_grad():
        before = model(ids).logits
    config = model.config.to_dict()
    assert patch_model(model, **SPEC).changed
    assert not patch_model(model, **SPEC).changed
    assert unpatch_model(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert model.config.to_dict() == config
    assert not any(runtime.CONTEXT in module.__dict__ for module in model.modules())


# --- the spec --------------------------------------------------------------------------------------------------------
def _config(window=8192):
    config = tiny.make_config("llama")
    config.max_position_embeddings = window
    return config


def test_defaults_are_the_authors():
    plan = plan_patch(_config(), method="string")
    assert (plan.spec.shifted_offset, plan.spec.local_value, plan.spec.attention_factor) == (int(0.33 * 8192), 128, 1.0)
    assert plan.spec.target_length == 8192 and plan.max_position_embeddings == 8192
    assert plan.slots == plan.old_slots  # the config's RoPE is left as it is
    plan = plan_patch(_config(), method="string", local_value=512, attention_factor=AUTHORS)
    assert (plan.spec.local_value, plan.spec.attention_factor) == (512, AUTHORS)


def test_beyond_the_window_s_keeps_every_distance_inside():
    """A target N > L raises S to N - L + W (largest distance N - 1 - S + W = L - 1); N > 2L - W is refused in one
    line naming the alternatives; an explicit S too small for N names the minimum."""
    for target in (8192 + 1000, 2 * 8192 - 128):
        spec = plan_patch(_config(), method="string", target_length=target).spec
        assert spec.shifted_offset == max(int(0.33 * 8192), target - 8192 + 128)
        assert target - 1 - spec.shifted_offset + spec.local_value <= 8191
    assert plan_patch(_config(), method="string", target_length=8192 + 1000).spec.shifted_offset == 2703
    with pytest.raises(SpecError, match="self-extend, dual-chunk or yarn") as caught:
        plan_patch(_config(), method="string", target_length=2 * 8192 - 127)
    assert "\n" not in str(caught.value)
    with pytest.raises(SpecError, match="at least N - L \\+ W = 4224"):
        plan_patch(_config(), method="string", target_length=12288, shifted_offset=3000)


def test_beyond_the_window_on_a_model_every_distance_stays_inside(monkeypatch):
    """A tiny model (L = 32) patched for a 56-token target with W = 4: S is derived as N - L + W = 28, the largest
    distance the 56-token prompt uses is 55 - 28 + 4 = 31 < L, and the logits equal the reference."""
    model = make("llama")
    report = patch_model(model, method="string", target_length=56, local_value=4)
    assert report.spec.shifted_offset == 28
    seen = []
    original = runtime.remapped_attention
    def counted(q, k, v, positions, *a, **kw):  # the largest distance this call uses
        first, last = positions.bounds()
        seen.append(max(string_distance(last, first, 28, 4), 0))
        return original(q, k, v, positions, *a, **kw)

    monkeypatch.setattr(runtime, "remapped_attention", counted)
    ids = tiny.input_ids(56)
    with torch.no_grad():
        got = model(ids).logits
    assert seen and max(seen) == 31
    with torch.no_grad(), pytest.MonkeyPatch.context() as swap:
        _string_reference(swap)
        want = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"shifted_offset": 100, "local_value": 100}, "must be below shifted_offset"),
    ({"shifted_offset": 9000}, "beyond the window"),
    ({"local_value": 0}, "must be > 0"),
    ({"replace_existing": True}, "replace_existing does not apply"),
    ({"group_size": 4}, "does not apply to method 'string'"),
    ({"shifted_offset": True}, "must be a number, got true"),  # not read as S = 1
    ({"attention_factor": 1e9}, r"attention_factor 1e\+09 must lie in \[0.5, 1.5\]"),
    ({"attention_factor": 0.1}, r"must lie in \[0.5, 1.5\]"),
    # S was not set: the message says it was derived (and raised), not that the user set it
    ({"local_value": 3000}, "shifted_offset S, which you did not set: its default 0.33·L = 2703 was raised to "
                            "N - L \\+ W = 3000"),
    ({"local_value": 2703}, "which you did not set: its default is 0.33·L = 2703"),
    # no target given: W beyond the window is named as such, not against a "target 8192"
    ({"local_value": 9000}, "local_value 9000 must be below the window L = 8192"),
])
def test_spec_errors_name_the_rule(kwargs, match):
    with pytest.raises(SpecError, match=match) as caught:
        plan_patch(_config(), method="string", **kwargs)
    assert "target" not in str(caught.value) or "target_length" in kwargs


def test_the_factor_set_is_the_factor_reported(tmp_path, capsys):
    """The patch summary prints the attention_factor that is set (not the model's own 1.0000 alone), and `inspect`
    of the written checkpoint names STRING and its parameters from the marker."""
    from rope_extend.cli import run

    source, out = tmp_path / "src", tmp_path / "out"
    tiny.make_model("llama").save_pretrained(source)
    assert run(["patch", str(source), "-o", str(out), "--method", "string", "--set", "shifted_offset=12", "--set",
                "local_value=4", "--set", "attention_factor=1.0693"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "attention_factor 1.0693" in printed and "its attention factor 1.0000" in printed
    assert run(["inspect", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert ("rope_extend marker: string (shifted_offset S 12, local_value W 4, attention_factor 1.0693" in printed
            and "re-apply it" in printed)


def test_engines_refuse_in_words():
    from rope_extend import load_spec
    from rope_extend.engines.hint import COMMAND, ORIGINAL
    from rope_extend.engines.serving import engine_hints
    from rope_extend.methods import gguf_rules

    plan = plan_patch(_config(), method="string")
    hints = {hint.engine: hint for hint in engine_hints(plan, "OUT")}
    for engine in ("vllm", "sglang"):
        assert hints[engine].route(COMMAND).settings.__dict__.get("max_model_len", 8192) == 8192
        assert "WITHOUT string" in hints[engine].warnings[0] and "no stock engine has STRING" in hints[engine].warnings[0]
    assert "--max-model-len 8192" in hints["vllm"].command and "--context-length 8192" in hints["sglang"].command
    llama_cpp = hints["llama.cpp"]
    assert llama_cpp.route(ORIGINAL).command is None and "no stock engine has STRING" in llama_cpp.warnings[0]
    with pytest.raises(SpecError, match="acts on attention at run time"):
        gguf_rules("string").rope(load_spec(method="string"), 1e4, 16, None, 1.0)


# --- on top of a shipped scheme ----------------------------------------------------------------------------------------
HUB = Path(__file__).parent / "data" / "hub"
SHIPPED = {
    # Llama 3.1 as shipped: llama3 x8 from 8192, window 131072
    "llama-3.1": ("meta-llama--Llama-3.1-8B", {}),
    # Qwen2.5 with the YaRN x4 its model card tells users to add for 128k
    "qwen2.5-yarn": ("Qwen--Qwen2.5-7B", {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32768},
                                           "max_position_embeddings": 131072}),
    # Gemma 3 (per-layer-type RoPE: local base 10000 on sliding layers, 1e6 on global ones), with the linear x8 of
    # its 4B-27B siblings on the global layers
    "gemma-3": ("google--gemma-3-1b-pt", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
}


def _shipped_model(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_extend import small_model

    folder, changes = SHIPPED[name]
    data = json.loads((HUB / folder / "config.json").read_text())
    data.update(changes)
    config = small_model.small_config(AutoConfig.for_model(**data))
    config.num_hidden_layers = len(getattr(config, "layer_types", None) or [0, 0])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    return model


@pytest.mark.parametrize("name", list(SHIPPED))
def test_keeps_a_shipped_scheme_and_adds_string_on_top(name, monkeypatch):
    """patch_model(method="string") on a model carrying a scheme (no replace_existing needed): the config and the
    rotary modules are unchanged, the window is the one the model claims, the attention re-rotates with the
    model's own (scaled) frequencies and attention factor (those stock transformers builds from the config), the
    report names the kept scheme, and the logits equal the naive reference with those frequencies."""
    from rope_extend import compat
    from rope_extend.rotary import find_rotary_modules

    model = _shipped_model(name)
    config = compat.text_config(model.config)
    before = copy.deepcopy(compat.read_slots(config))
    buffers = {n: (m.inv_freq.clone() if hasattr(m, "inv_freq") else None) for n, m, _ in find_rotary_modules(model)}
    window = config.max_position_embeddings
    S, W = 40, 8
    ids = torch.randint(3, 200, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model(ids).logits
    report = patch_model(model, method="string", shifted_offset=S, local_value=W)
    assert report.spec.original_max_position_embeddings == window and report.spec.target_length == window
    kind = {"llama-3.1": "llama3 x8", "qwen2.5-yarn": "yarn x4", "gemma-3": "linear x8"}[name]
    assert f"on top of the model's own RoPE ({kind}" in str(report)
    after = compat.read_slots(config)  # the same RoPE (a legacy "type" key may be written as "rope_type")
    assert after.keys() == before.keys() and all(compat.params_close(after[k], before[k]) for k in before)
    assert config.max_position_embeddings == window
    for n, m, _ in find_rotary_modules(model):
        if buffers[n] is not None:
            assert torch.equal(m.inv_freq, buffers[n])
    contexts = [m.__dict__[runtime.CONTEXT] for m in model.modules() if runtime.CONTEXT in m.__dict__]
    assert contexts
    slot = "full_attention" if name == "gemma-3" else compat.FLAT
    own, attention = compat.stock_rope(config, slot)
    for context in contexts:
        torch.testing.assert_close(context.inv_freq, own.float(), rtol=0, atol=0)
    if name == "qwen2.5-yarn":
        assert attention == pytest.approx(0.1 * math.log(4) + 1)
    if name == "gemma-3":  # only the global layers are remapped
        layers = [m for m in model.modules() if runtime.CONTEXT in m.__dict__]
        assert all(m.sliding_window is None for m in layers)
        assert len(layers) == config.layer_types.count("full_attention")
    with torch.no_grad():
        got = model(ids).logits
        _string_reference(monkeypatch)
        want = model(ids).logits
    assert (got - base).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    unpatch_model(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base)


def test_refuses_a_model_carrying_another_rope_extend_patch_and_repatches_itself():
    from rope_extend import AlreadyScaledError

    model = make("llama")
    patch_model(model, method="yarn", factor=2)
    with pytest.raises(AlreadyScaledError, match=r"unpatch_model\(model\) first"):
        patch_model(model, **SPEC)
    unpatch_model(model)
    patch_model(model, **SPEC)
    report = patch_model(model, **{**SPEC, "local_value": 6})  # STRING over STRING: new parameters, same RoPE
    assert report.changed and report.spec.local_value == 6


def test_refuses_a_scheme_whose_frequencies_change_with_the_length():
    config = _config()
    config.rope_scaling = {"rope_type": "dynamic", "factor": 2.0}
    if hasattr(config, "rope_parameters") and isinstance(config.rope_parameters, dict):
        config.rope_parameters = {**config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(UnsupportedModelError, match="no one rotation"):
        plan_patch(config, method="string")


# --- the CLI, inspect and eval's inline spec ---------------------------------------------------------------------------
def test_cli_patch_writes_the_model_as_it_is_and_the_marker_reapplies(tmp_path):
    """`rope-extend patch --method string`: config.json keeps the RoPE and the window, stock transformers loads the
    model as it was, and patch_model(model) re-applies STRING from the marker."""
    from transformers import AutoModelForCausalLM

    from rope_extend.cli import run

    source, out = tmp_path / "src", tmp_path / "out"
    original = tiny.make_model("llama")
    original.save_pretrained(source)
    assert run(["patch", str(source), "-o", str(out), "--method", "string", "--set", "shifted_offset=12", "--set",
                "local_value=4"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert written["rope_extend"]["spec"]["shifted_offset"] == 12 and written["max_position_embeddings"] == 32
    assert written.get("rope_scaling") in (None, {}) or written["rope_scaling"].get("rope_type") == "default"
    ids = tiny.input_ids(32)
    loaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation=IMPLS[0]).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, original(ids).logits, atol=1e-5, rtol=0)
    report = patch_model(loaded)
    assert (report.spec.shifted_offset, report.spec.local_value) == (12, 4)
    want = make("llama", IMPLS[0])
    patch_model(want, **SPEC)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, want(ids).logits, atol=1e-5, rtol=0)


def test_inspect_and_recommend_name_string(capsys):
    from rope_extend.cli import run
    from rope_extend.inspect import inspect_rope, recommend
    from rope_extend.spec import parse_inline_spec as parse_spec_arg

    config = json.loads((HUB / "meta-llama--Llama-3.1-8B" / "config.json").read_text())
    from transformers import AutoConfig

    llama31 = AutoConfig.for_model(**config)
    view = inspect_rope(llama31, method="string")
    note = next(n for n in view.notes if "keeps the model's RoPE" in n)
    assert "llama3 x8 from 8192" in note and "shifted_offset S 43253, local_value W 128" in note
    assert view.target_length == 131072 and view.counts()["interpolated"] > 0  # 'new' is llama3's own
    assert "string" in recommend(llama31, 100000).alternatives
    assert run(["inspect", str(HUB / "meta-llama--Llama-3.1-8B"), "--method", "string"]) == 0
    assert "keeps the model's RoPE" in capsys.readouterr().out
    assert parse_spec_arg("method=string,local_value=512,attention_factor=1.0693") == {
        "method": "string", "local_value": 512, "attention_factor": 1.0693}


def test_generate_after_a_reused_prefix_in_inference_mode_equals_generate_alone():
    """The eval's probes: generate() under inference_mode on a cache cropped back to a shared prefix continues
    exactly as generate() from scratch (the prompt crosses S)."""
    model = make("llama", "sdpa")
    patch_model(model, **SPEC)
    alone, reused = generate_alone_and_after_a_shared_prefix(model, 28, 10, 4)
    assert torch.equal(reused, alone)
