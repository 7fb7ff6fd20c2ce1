"""The passes path of self-extend and dual-chunk (rope_extend/attention/passes.py, primitives.py), on CPU through
the same decomposition the CUDA path runs, against the naive reference from the papers' formulas
(tests/test_attention_methods.py's `reference_attention`), with both CPU primitives: torch's fused CPU kernel with
dense masks, and FlexAttention in eager mode. The `gpu`-marked tests run the same checks with FlexAttention
compiled on CUDA (`python bench/gpu_check.py` runs them and the GPU bench).
"""

from __future__ import annotations

import math
import warnings

import pytest
import tiny
import torch
from helpers import (
    CASES,
    SPECS,
    attention_inputs,
    cache_kwargs,
    case_id,
    dual_chunk_distance,
    patched_model,
    reference_attention,
    rope,
    self_extend_distance,
)

from rope_extend import unpatch_model
from rope_extend.attention import kernels, passes, primitives
from rope_extend.attention.maps import DualChunkMap, SelfExtendMap
from rope_extend.attention.positions import Positions

PRIMITIVES = {
    "cpu-kernel": primitives.CpuKernelPrimitive,
    "flex-eager": lambda: primitives.FlexPrimitive(compiled=False),
}
needs_kernel = pytest.mark.skipif(kernels.fused_kernel() is None, reason="this torch has no fused CPU attention "
                                  "kernel with log-sum-exp")
needs_flex = pytest.mark.skipif(not primitives.flex_available(), reason="this torch has no FlexAttention")


def _primitive_params():
    return [pytest.param("cpu-kernel", marks=needs_kernel), pytest.param("flex-eager", marks=needs_flex)]


# --- the decomposition itself -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_passes_partition_the_causal_pairs_as_the_maps_select(case):
    """Every causal (query, key) pair lies in exactly one pass, the one `mapping.select` names, and sees there the
    papers' distance: (query position + the pass's query shift) - (key position + key shift if the pass moves the
    keys). Non-causal pairs lie in none. Each pass's `key_range` is the row of its mask (what a decoding step
    slices). Prompts that start at 0 and a chunk after a cached prefix starting at position 17."""
    mapping, dist_fn, params = case
    for q0, k0, n_q, n_k in ((0, 0, 50, 50), (40, 17, 7, 30)):
        plan = mapping.passes(q0, k0, "cpu")
        q_pos = torch.arange(q0, q0 + n_q)
        k_pos = torch.arange(k0, k0 + n_k)
        masks = torch.stack([primitives.dense_mask(p.mask_mod, n_q, n_k, "cpu") for p in plan])
        causal = k_pos[None, :] <= q_pos[:, None]
        assert torch.equal(masks.sum(0), causal.long())
        which = masks.int().argmax(0)
        want = torch.tensor(distances_of(dist_fn, q_pos, k_pos, params))
        selected = mapping.select(q_pos[None, :, None], k_pos[None, None, :])[0].long()
        index_of = {"neighbour": 0, "grouped": 1, "shifted": 1, "intra": 0, "successive": 1, "inter": 2}
        for index, p in enumerate(plan):
            shift = torch.zeros(n_q, dtype=torch.long) if p.query_shift is None else p.query_shift(q_pos[None])[0]
            k_shift = mapping.key_shift(k_pos) if p.moved_keys else torch.zeros_like(k_pos)
            got = (q_pos + shift)[:, None] - (k_pos + k_shift)[None, :]
            mine = masks[index]
            assert torch.equal(got[mine], want[mine]), p.name
            assert bool((selected[mine] == index_of[p.name]).all()), p.name
            for row, position in enumerate(q_pos.tolist()):
                lo, hi = p.key_range(position)
                lo, hi = max(lo, k0), min(hi, position + 1, k0 + n_k)
                expect = torch.zeros(n_k, dtype=torch.bool)
                expect[max(0, lo - k0) : max(0, hi - k0)] = True
                assert torch.equal(mine[row], expect), (p.name, position)
        assert bool((which[causal] >= 0).all())


def distances_of(fn, q_pos, k_pos, params):
    return [[fn(i, j, *params) for j in k_pos.tolist()] for i in q_pos.tolist()]


# --- the passes path against the papers' formulas -----------------------------------------------------------------
def _allowed(B, n_q, n_k):
    return (torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None])[None].repeat(B, 1, 1)


@pytest.mark.parametrize("primitive", _primitive_params())
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_passes_equal_the_papers_formulas(case, primitive):
    """A 48-token prompt (crossing every window, group and chunk boundary), 5 queries after a 28-key cache
    starting at position 17 (a prompt prefilled after a cached prefix), then two decoding steps reusing the moved
    keys from the store; GQA (4 query heads on 2 key heads), batch 2, partial rotary dims; log_n on every other
    case. float32, to 2e-5 of the float64 reference."""
    check_passes_equal_the_papers_formulas(case, PRIMITIVES[primitive], "cpu")


def check_passes_equal_the_papers_formulas(case, make, device: str) -> None:
    """`test_passes_equal_the_papers_formulas` with the primitive `make()` builds, on `device` (the GPU test
    below runs it on CUDA with compiled FlexAttention)."""
    mapping, dist_fn, params = case
    log_n = 20 if CASES.index(case) % 2 else None
    B, H, Hkv, D, rdim = 2, 4, 2, 16, 8
    memo, store, previous = {}, {}, None
    for n_q, n_k, start in ((48, 48, 0), (5, 33, 17), (1, 34, 17), (1, 35, 17)):
        q_raw, k_raw, v, q_pos, k_pos, inv_freq = attention_inputs(B, H, Hkv, D, rdim, n_q, n_k, start, seed=n_k)
        q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
        if n_q == 1:  # a decoding step: the previous call's keys plus one, the moved ones reused from the store
            (k_raw[:, :, :-1], v[:, :, :-1]), k_prev = previous
            k = torch.cat((k_prev, rope(k_raw[:, :, -1:], k_pos[:, -1:], inv_freq)), dim=2)
        elif start:
            store = {}
        got = kernels.remapped_attention(q.to(device), k.to(device), v.to(device), Positions.of(k_pos), None, D**-0.5,
                                         mapping, inv_freq.float(), log_n_original=log_n, memo=memo,
                                         key_store=store, path="passes", primitive=make())
        previous = (k_raw, v), k
        want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, _allowed(B, n_q, n_k), D**-0.5, dist_fn, params,
                                   inv_freq, log_n_original=log_n)
        assert not got.isnan().any()
        torch.testing.assert_close(got.cpu().double(), want, atol=2e-5, rtol=0)


BF16_CASES = [(SelfExtendMap(4, 8), self_extend_distance, (4, 8)), (DualChunkMap(16, 4), dual_chunk_distance, (16, 4))]


@pytest.mark.parametrize("primitive", _primitive_params())
@pytest.mark.parametrize("mapping, dist_fn, params", BF16_CASES, ids=["self-extend", "dual-chunk"])
def test_passes_bf16_within_bf16_rounding(mapping, dist_fn, params, primitive):
    """bfloat16 inputs: the passes path's error against the float64 reference is within 3x the error that plain
    causal SDPA makes in bfloat16 against float64 on the same inputs (bf16 rounding, not the method), over 64
    tokens with log_n."""
    check_passes_bf16_within_bf16_rounding(mapping, dist_fn, params, PRIMITIVES[primitive], "cpu")


def check_passes_bf16_within_bf16_rounding(mapping, dist_fn, params, make, device: str) -> None:
    """`test_passes_bf16_within_bf16_rounding` with the primitive `make()` builds, on `device`."""
    B, H, Hkv, D, n = 2, 4, 2, 16, 64
    q_raw, k_raw, v, q_pos, k_pos, inv_freq = attention_inputs(B, H, Hkv, D, D, n, n, 0, seed=3)
    q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
    bf = {name: t.to(device=device, dtype=torch.bfloat16) for name, t in (("q", q), ("k", k), ("v", v))}
    got = kernels.remapped_attention(bf["q"], bf["k"], bf["v"], Positions.of(k_pos), None, D**-0.5, mapping,
                                     inv_freq.float(), log_n_original=20, memo={}, path="passes", primitive=make())
    assert got.dtype == torch.bfloat16
    want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, _allowed(B, n, n), D**-0.5, dist_fn, params, inv_freq,
                               log_n_original=20)
    rep = H // Hkv
    plain = torch.nn.functional.scaled_dot_product_attention(
        bf["q"], bf["k"].repeat_interleave(rep, 1), bf["v"].repeat_interleave(rep, 1), is_causal=True)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1), is_causal=True)
    rounding = (plain.cpu().double() - exact).abs().max().item()
    error = (got.cpu().double() - want).abs().max().item()
    assert 0 < error <= 3 * rounding, (error, rounding)


@needs_kernel
@needs_flex
def test_primitives_agree_and_unseen_rows_are_not_nan():
    """Both primitives give the same output and natural-log log-sum-exp as a dense float64 softmax for one pass
    whose first rows see no key (log-sum-exp -inf, output finite), and the merge gives such rows weight 0."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 20, 8), torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8)
    far = passes.Pass("far", None, False, (0, 0, 1, 6, passes.FAR), lambda p: (0, p - 5), "cpu")
    allowed = primitives.dense_mask(lambda b, h, q_idx, kv_idx: q_idx - kv_idx >= 6, 20, 20, "cpu")
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) * 0.4).masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, -1)
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ v.double().repeat_interleave(2, 1)
    results = []
    for make in PRIMITIVES.values():
        primitive = make()
        got, got_lse = primitive.masked(q, k, v, primitive.prepare(far, 20, 20, "cpu"), 0.4)
        assert got_lse.dtype == torch.float32 and bool(torch.isneginf(got_lse[..., :6]).all())
        torch.testing.assert_close(got.double(), out, atol=1e-5, rtol=0)
        torch.testing.assert_close(got_lse[..., 6:].double(), lse[..., 6:], atol=1e-5, rtol=0)
        results.append((got, got_lse))
    full = primitives.math_attention(q, k, v, 0.4)
    merged = passes.merge([results[0], full])
    assert not merged.isnan().any()
    torch.testing.assert_close(merged[:, :6], full[0].transpose(1, 2)[:, :6], atol=1e-6, rtol=0)


# --- which path runs where ----------------------------------------------------------------------------------------
def test_path_selection_and_one_warning_per_fallback_case(monkeypatch):
    """CPU: the fused path, silently also when it falls back. A CUDA tensor with contiguous positions: the passes
    path; a fallback case off the CPU warns once per process per case, naming it."""
    monkeypatch.setattr(kernels, "_WARNED", set())
    mapping = SelfExtendMap(2, 4)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if kernels.fused_kernel() is not None:
            assert kernels.select_path(cpu, 0, None, mapping) == "fused"
        assert kernels.select_path(cpu, None, "left padding", mapping) == "general"
        assert kernels.select_path(cuda, 5, None, mapping) == "passes"
        assert not seen
        for _ in range(3):
            assert kernels.select_path(cuda, None, "attention logit softcapping", mapping) == "general"
        assert kernels.select_path(cuda, None, "an attention mask other than the causal one", mapping) == "general"
    messages = [str(w.message) for w in seen]
    assert len(messages) == 2 and "softcapping" in messages[0] and "slow" in messages[0]
    assert "mask" in messages[1]
    q = torch.zeros(2, 2, 6, 8)
    pos = torch.arange(6)[None].repeat(2, 1)
    assert kernels.contiguous_start(q, Positions.of(pos), None, None) == (0, None)
    assert "softcapping" in kernels.contiguous_start(q, Positions.of(pos), None, 30.0)[1]
    padded = pos.clone()
    padded[1] = (padded[1] - 2).clamp(min=0)
    assert "left padding" in kernels.contiguous_start(q, Positions.of(padded), None, None)[1]


# --- through a real tiny model --------------------------------------------------------------------------------------
class CountedPrimitive:
    """A primitive whose calls are counted, so a test that forces it asserts that it ran (a patched name nobody looks
    up would leave the default primitive running and every count 0)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.calls = {"prepare": 0, "masked": 0, "unmasked": 0, "decode": 0}

    def prepare(self, *args, **kwargs):
        self.calls["prepare"] += 1
        return self.inner.prepare(*args, **kwargs)

    def masked(self, *args, **kwargs):
        self.calls["masked"] += 1
        return self.inner.masked(*args, **kwargs)

    def unmasked(self, *args, **kwargs):
        self.calls["unmasked"] += 1
        return self.inner.unmasked(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self.calls["decode"] += 1
        return self.inner.decode(*args, **kwargs)


def _force_passes(monkeypatch, primitive) -> tuple[list, CountedPrimitive]:
    """Every contiguous call takes the passes path with `primitive` (the others the general path), as CUDA does.
    `primitive_for` is patched in `kernels`, where `remapped_attention` looks it up (it imported the name, so
    patching `primitives.primitive_for` is never reached). Returns the paths chosen and the counted primitive."""
    paths = []
    original = kernels.select_path
    counted = CountedPrimitive(primitive)

    def select(device, start, case, mapping):
        chosen = "passes" if start is not None else original(device, start, case, mapping)
        paths.append(chosen)
        return chosen

    monkeypatch.setattr(kernels, "select_path", select)
    monkeypatch.setattr(kernels, "primitive_for", lambda device: counted)
    return paths, counted


@needs_kernel
@pytest.mark.parametrize("method", list(SPECS))
def test_model_on_the_passes_path_equals_the_fused_path(method, monkeypatch):
    """A patched tiny Llama (SDPA) forced onto the passes path (CPU kernel primitive, each of its calls counted):
    one forward equals the fused path's; a prompt prefilled in pieces and token-by-token decoding equal one
    forward, the decoding steps running the primitive's decode call in every layer and moving each new key at most
    once, never the cache (the moved keys live on the cache, and a key is moved when a moved pass first reads it:
    in batches); the original below the window; unpatch restores the original bit for bit."""
    from transformers import DynamicCache

    model = patched_model("llama", method, "sdpa")
    layers = model.config.num_hidden_layers
    ids = tiny.input_ids(64)
    with torch.no_grad():
        fused = model(ids).logits
        paths, counted = _force_passes(monkeypatch, primitives.CpuKernelPrimitive())
        full = model(ids).logits
        assert counted.calls["masked"] >= 2 * layers and counted.calls["decode"] == 0, counted.calls
        torch.testing.assert_close(full, fused, atol=1e-5, rtol=0)
        cache = DynamicCache(config=model.config)
        pieces = [model(ids[:, :30], **cache_kwargs(cache)).logits, model(ids[:, 30:47], **cache_kwargs(cache)).logits]
        assert cache.get_seq_length() == 47
        key_rows, rotate = [], kernels.rotate  # keys moved during the decoding steps: each new key at most once
        monkeypatch.setattr(kernels, "rotate", lambda x, *a: key_rows.append(x.shape[2]) or rotate(x, *a))
        masked = counted.calls["masked"]
        pieces += [model(ids[:, t : t + 1], **cache_kwargs(cache)).logits for t in range(47, 64)]
        assert cache.get_seq_length() == 64
        assert counted.calls["masked"] == masked and counted.calls["decode"] >= 17 * layers, counted.calls
        assert sum(key_rows) <= 17 * layers and max(key_rows, default=0) <= 17, key_rows
        torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-4, rtol=0)
        assert set(paths) == {"passes"}
        unpatched = tiny.make_model("llama")
        unpatched.set_attn_implementation("sdpa")
        assert torch.equal(model(ids[:, :6]).logits, unpatched(ids[:, :6]).logits)  # below every window
        unpatch_model(model)
        assert torch.equal(model(ids).logits, unpatched(ids).logits)


@needs_flex
@pytest.mark.parametrize("method", list(SPECS))
def test_model_decoding_with_flex_eager_equals_one_forward(method, monkeypatch):
    """The FlexAttention primitive (eager on CPU) through the model, each call counted: one forward equals the
    fused path's; cached decoding equals one forward (the prefill runs FlexAttention over block masks in every
    layer, the decoding steps its decode call on the cache's slices); no call reaches the CPU kernel."""
    from transformers import DynamicCache

    model = patched_model("llama", method, "sdpa")
    layers = model.config.num_hidden_layers
    ids = tiny.input_ids(50)
    with torch.no_grad():
        fused = model(ids).logits
        paths, counted = _force_passes(monkeypatch, primitives.FlexPrimitive(compiled=False))
        kernel_calls = []
        run = primitives.CpuKernelPrimitive._run
        monkeypatch.setattr(primitives.CpuKernelPrimitive, "_run",
                            lambda self, *a: kernel_calls.append(1) or run(self, *a))
        full = model(ids).logits
        assert counted.calls["masked"] >= 2 * layers and counted.calls["prepare"] >= 2, counted.calls
        torch.testing.assert_close(full, fused, atol=1e-5, rtol=0)
        cache = DynamicCache(config=model.config)
        pieces = [model(ids[:, :47], **cache_kwargs(cache)).logits]
        assert cache.get_seq_length() == 47
        before = dict(counted.calls)
        pieces += [model(ids[:, t : t + 1], **cache_kwargs(cache)).logits for t in range(47, 50)]
        assert cache.get_seq_length() == 50
        assert counted.calls["masked"] == before["masked"], counted.calls
        assert counted.calls["decode"] - before["decode"] >= 3 * layers, counted.calls
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-4, rtol=0)
    assert set(paths) == {"passes"} and not kernel_calls


def test_flash_and_flex_models_are_refused_in_one_line():
    """A model loaded with attn_implementation='flex_attention' (or flash_attention_2) is refused at patch time in
    one line that says to load it with 'sdpa'."""
    from rope_extend import UnsupportedModelError, patch_model

    model = tiny.make_model("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedModelError) as caught:
        patch_model(model, method="self-extend", factor=4)
    message = str(caught.value)
    assert "\n" not in message and "attn_implementation='sdpa'" in message and "flex_attention" in message


# --- the same on CUDA: compiled FlexAttention ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gpu_passes_equal_the_papers_formulas(case):
    check_passes_equal_the_papers_formulas(case, lambda: primitives.FlexPrimitive(compiled=True), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mapping, dist_fn, params", BF16_CASES, ids=["self-extend", "dual-chunk"])
def test_gpu_passes_bf16_within_bf16_rounding(mapping, dist_fn, params):
    check_passes_bf16_within_bf16_rounding(mapping, dist_fn, params, lambda: primitives.FlexPrimitive(compiled=True),
                                           "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("method", list(SPECS))
def test_gpu_model_takes_the_passes_path_and_equals_cpu(method, monkeypatch):
    """On CUDA, a patched tiny Llama takes the passes path by itself (no fallback warning) and gives the CPU's
    logits; cached decoding equals one forward; a left-padded batch falls back with one warning and equals the
    rows alone."""
    from transformers import DynamicCache

    model = patched_model("llama", method, "sdpa")
    ids = tiny.input_ids(200)
    with torch.no_grad():
        cpu = model(ids).logits
        model.cuda()
        monkeypatch.setattr(kernels, "_WARNED", set())
        paths, used = [], []
        original, original_for = kernels.select_path, kernels.primitive_for
        monkeypatch.setattr(kernels, "select_path", lambda *a: paths.append(original(*a)) or paths[-1])
        monkeypatch.setattr(kernels, "primitive_for",
                            lambda device: used.append(CountedPrimitive(original_for(device))) or used[-1])
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            gpu = model(ids.cuda()).logits
            cache = DynamicCache(config=model.config)
            pieces = [model(ids[:, :190].cuda(), **cache_kwargs(cache)).logits]
            pieces += [model(ids[:, t : t + 1].cuda(), **cache_kwargs(cache)).logits for t in range(190, 200)]
        assert set(paths) == {"passes"} and {p.name for p in used} == {"flex-compiled"}
        assert cache.get_seq_length() == 200
        assert sum(p.calls["masked"] for p in used) >= 2 * 2 * model.config.num_hidden_layers  # 2 prefills
        assert sum(p.calls["decode"] for p in used) >= 10 * model.config.num_hidden_layers  # 10 decoding steps
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.cat(pieces, 1), gpu, atol=1e-4, rtol=0)
        rows = [tiny.input_ids(70, seed=3)[0], tiny.input_ids(55, seed=4)[0]]
        ids2 = torch.stack([torch.cat((torch.zeros(15, dtype=torch.long), rows[1])), rows[0]][::-1]).cuda()
        mask = torch.ones_like(ids2)
        mask[1, :15] = 0
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with pytest.warns(RuntimeWarning, match="slow"):
            batch = model(ids2, attention_mask=mask, position_ids=positions).logits
        alone = model(rows[1][None].cuda()).logits
        torch.testing.assert_close(batch[1, 15:], alone[0], atol=1e-4, rtol=0)
