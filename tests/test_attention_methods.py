"""self-extend and dual-chunk: exact against a naive reference written from the papers' formulas, on tiny models.

The reference (`reference_attention`) never re-rotates anything: it takes the un-rotated queries and keys and, for
every (query, key) pair, the mapped distance computed by the scalar formulas below (`self_extend_distance`,
`dual_chunk_distance`), and scores the pair as RoPE does for that distance: sum_f Re(z_q conj(z_k) e^{i d θ_f}),
in float64. The implementation under test re-rotates the model's already-rotated keys block by block.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import tiny
import torch
from helpers import (  # the papers' formulas and the tiny patched models, shared with the passes and STRING tests
    CASES,
    IMPLS,
    SPECS,
    WINDOW,
    _cache,
    _case_id,
    _patched,
    dual_chunk_distance,
    generate_alone_and_after_a_shared_prefix,
    make,
    reference_attention,
    rope,
    self_extend_distance,
)

from rope_extend import SpecError, UnsupportedModelError, load_spec, patch_model, plan_patch, unpatch_model
from rope_extend.attention import kernels, runtime
from rope_extend.attention.maps import SelfExtendMap
from rope_extend.attention.positions import Positions
from rope_extend.compat import EAGER_THROUGH_ATTENTION_REGISTRY

warnings.filterwarnings("ignore", message=".*acts on attention.*")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("log_n", [False, True])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "general"])
def test_kernel_equals_the_papers_formulas(case, log_n, fused):
    """Every pair of a 70-token prompt (positions crossing every window, group and chunk boundary), a chunk of
    5 queries over a 45-key cache, 3 over 30 keys starting at position 17, and single decoding queries, GQA (4 query
    heads on 2 key heads), partial rotary dims, blocks of 7 queries; the fused path (segments merged by log-sum-exp)
    and the general one (per-pair selection), with the moved keys reused from a store built call by call."""
    mapping, dist_fn, params = case
    torch.manual_seed(0)
    B, H, Hkv, D, rdim = 2, 4, 2, 12, 8
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, rdim, 2).double() / rdim))
    memo, previous = {}, None
    for n_q, n_k, start in ((70, 70, 0), (5, 45, 0), (3, 30, 17), (1, 31, 17), (1, 32, 17)):
        q_raw, k_raw = torch.randn(B, H, n_q, D), torch.randn(B, Hkv, n_k, D)
        v = torch.randn(B, Hkv, n_k, D)
        k_pos = (torch.arange(n_k) + start)[None].repeat(B, 1)
        q_pos = k_pos[:, n_k - n_q :]
        q, k = rope(q_raw, q_pos, inv_freq), rope(k_raw, k_pos, inv_freq)
        if n_q == 1:  # a decoding step: the previous call's keys and one new one, the earlier moved keys reused
            (k_raw[:, :, :-1], v[:, :, :-1]), k_prev = previous
            k = torch.cat((k_prev, rope(k_raw[:, :, -1:], k_pos[:, -1:], inv_freq)), dim=2)
        else:  # new keys: a new store (runtime empties it when the cache's key tensor changes)
            store = {}
        got = kernels.remapped_attention(q, k, v, Positions.of(k_pos), None, D**-0.5, mapping, inv_freq.float(),
                                         log_n_original=20 if log_n else None, block_elements=7 * B * H * n_k,
                                         block_queries=7, fused=fused, memo=memo, key_store=store)
        previous = (k_raw, v), k
        allowed = (torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None])[None].repeat(B, 1, 1)
        want = reference_attention(q_raw, k_raw, v, q_pos, k_pos, allowed, D**-0.5, dist_fn, params, inv_freq,
                                   log_n_original=20 if log_n else None)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)


def test_kernel_masks_and_softcap():
    """A boolean mask and an additive mask with padded keys give the reference's answer; softcap applies."""
    torch.manual_seed(1)
    mapping, params = SelfExtendMap(2, 4), (2, 4)
    B, H, D, n = 2, 2, 8, 24
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, D, 2).double() / D))
    q_raw, k_raw, v = torch.randn(B, H, n, D), torch.randn(B, H, n, D), torch.randn(B, H, n, D)
    pad = torch.tensor([0, 5])  # row 1 is left-padded by 5
    pos = torch.stack([(torch.arange(n) - p).clamp(min=0) for p in pad])
    allowed = (torch.arange(n)[None, :] <= torch.arange(n)[:, None])[None] & (torch.arange(n)[None, None, :] >= pad[:, None, None])
    q, k = rope(q_raw, pos, inv_freq), rope(k_raw, pos, inv_freq)
    want = reference_attention(q_raw, k_raw, v, pos, pos, allowed, 0.3, self_extend_distance, params, inv_freq,
                               softcap=5.0)
    additive = torch.zeros(B, 1, n, n).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    for mask in (allowed[:, None], additive):
        got = kernels.remapped_attention(q, k, v, Positions.of(pos), mask, 0.3, mapping, inv_freq.float(), softcap=5.0)
        rows = torch.arange(n) >= 5  # padded query rows are garbage in every implementation
        torch.testing.assert_close(got[1, rows].double(), want[1, rows], atol=2e-5, rtol=0)
        torch.testing.assert_close(got[0].double(), want[0], atol=2e-5, rtol=0)


REFERENCES = {  # the formula and its parameters, read from the map the runtime hands the kernel
    "self-extend": (self_extend_distance, lambda m: (m.group_size, m.neighbor_window)),
    "dual-chunk": (dual_chunk_distance, lambda m: (m.chunk_size, m.local_window)),
}


def _reference_kernel(monkeypatch, spec):
    """Swap the kernel for the reference: un-rotate the model's q/k at their positions, then the naive formulas."""
    fn, parameters = REFERENCES[spec["method"]]

    def reference(query, key, value, positions, mask, scaling, mapping, inv_freq, *, softcap=None,
                  log_n_original=None, block_elements=None, memo=None, key_store=None):
        unrotate = lambda x, p: rope(x.double(), -p, inv_freq.double()).float()
        k_pos = positions.key_ids()  # host-known positions (the runtime's) or the tensor it recorded
        q_pos = k_pos[:, k_pos.shape[1] - query.shape[2] :]
        n_k = k_pos.shape[1]
        B = query.shape[0]
        q_pos, k_pos = q_pos.expand(B, -1), k_pos.expand(B, -1)
        allowed = (torch.arange(n_k)[None, :] <= torch.arange(n_k - query.shape[2], n_k)[:, None])[None].repeat(B, 1, 1)
        out = reference_attention(unrotate(query, q_pos), unrotate(key[:, :, :n_k], k_pos), value[:, :, :n_k], q_pos,
                                  k_pos, allowed, scaling, fn, parameters(mapping), inv_freq, softcap, log_n_original)
        return out.to(query.dtype)

    monkeypatch.setattr(runtime, "remapped_attention", reference)


@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_every_rotary_architecture_equals_the_reference(arch):
    """Each architecture of the rotary matrix, both methods: exactly the original below the window, and beyond it
    the naive reference's logits (80 tokens: 2.5 times the original length)."""
    ids = tiny.input_ids(80)
    unpatched = make(arch)
    with torch.no_grad():
        base = unpatched(ids).logits
    for method in SPECS:
        model = _patched(arch, method)
        with torch.no_grad(), pytest.MonkeyPatch.context() as monkeypatch:
            got = model(ids).logits
            short = ids[:, : WINDOW[method]]
            assert torch.equal(model(short).logits, unpatched(short).logits)
            _reference_kernel(monkeypatch, SPECS[method])
            want = model(ids).logits
        assert (got - base).abs().max() > 1e-3  # it changes the model beyond the window...
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)  # ...exactly as the formulas say


@pytest.mark.parametrize("method", list(SPECS))
@pytest.mark.parametrize("impl", IMPLS)
def test_decoding_with_the_cache_equals_one_forward(method, impl):
    """Prefill in pieces, token-by-token decoding, and a reused (copied, then cropped) KV prefix all give the
    logits of one forward over the final sequence, to 1e-4."""
    from transformers import DynamicCache

    model = _patched("llama", method, impl)
    ids = tiny.input_ids(64)
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        pieces = [model(ids[:, :30], **_cache(cache)).logits,
                  model(ids[:, 30:47], **_cache(cache)).logits]
        for t in range(47, 64):
            pieces.append(model(ids[:, t : t + 1], **_cache(cache)).logits)
        torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-4, rtol=0)

        prefix = DynamicCache(config=model.config)
        model(ids[:, :50], **_cache(prefix))
        for suffix in (ids[:, 50:64], tiny.input_ids(14, seed=7)):
            reused = copy.deepcopy(prefix)
            got = model(suffix, **_cache(reused)).logits
            want = model(torch.cat((ids[:, :50], suffix), 1)).logits[:, 50:]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        prefix.crop(-10)  # keep the first 40
        got = model(ids[:, 40:64], **_cache(prefix)).logits
        torch.testing.assert_close(got, full[:, 40:], atol=1e-4, rtol=0)


@pytest.mark.skipif(kernels.fused_kernel() is None, reason="this torch has no fused CPU attention with log-sum-exp")
@pytest.mark.parametrize("method", list(SPECS))
def test_sdpa_prefill_and_decoding_take_the_fused_path(method, monkeypatch):
    """Without padding, SDPA prefill and decoding run the fused path, and a decoding step rotates only its new
    key (self-extend's moved keys live on the cache) or no key at all (dual-chunk rotates the queries instead)."""
    from transformers import DynamicCache

    model = _patched("llama", method, "sdpa")
    paths, key_rows = [], []
    for name in ("_fused_attention", "_blocked_attention"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=original, _n=name, **k: paths.append(_n) or _f(*a, **k))
    rotate = kernels.rotate
    monkeypatch.setattr(kernels, "rotate", lambda x, *a: key_rows.append(x.shape[2]) or rotate(x, *a)
                        if x.dim() == 4 and x.shape[1] == model.config.num_key_value_heads else rotate(x, *a))
    ids = tiny.input_ids(64)
    with torch.no_grad():
        one_shot = model(ids).logits[0, -1]
        cache = DynamicCache(config=model.config)
        model(ids[:, :40], **_cache(cache))
        masks = []  # the second piece (20 queries after 40 cached keys) comes with transformers' causal mask
        original_start = kernels.contiguous_start
        monkeypatch.setattr(kernels, "contiguous_start", lambda q, positions, mask, *a: masks.append(mask is not None)
                            or original_start(q, positions, mask, *a))
        model(ids[:, 40:60], **_cache(cache))
        key_rows.clear()
        for t in range(60, 64):
            last = model(ids[:, t : t + 1], **_cache(cache)).logits[0, -1]
    assert any(masks), "the prefill after a cached prefix is expected to carry a mask tensor"
    assert set(paths) == {"_fused_attention"}
    layers = model.config.num_hidden_layers
    assert key_rows == ([1] * 4 * layers if method == "self-extend" else [])
    torch.testing.assert_close(last, one_shot, atol=1e-4, rtol=0)


def test_plain_causal_recognises_exactly_the_causal_mask_of_the_last_queries():
    """The fused path treats a mask as absent only when it is exactly the causal mask of the last n_q of n_k
    keys (boolean or additive, every row); padding, another diagonal or a full mask keep the general path."""
    n_q, n_k = 2500, 3000  # more rows than one comparison block
    causal = torch.arange(n_k) <= torch.arange(n_q)[:, None] + (n_k - n_q)
    boolean = causal[None, None].expand(2, 1, n_q, n_k).clone()
    additive = torch.zeros(2, 1, n_q, n_k).masked_fill(~boolean, torch.finfo(torch.float32).min)
    assert kernels.plain_causal(boolean, n_q, n_k) and kernels.plain_causal(additive, n_q, n_k)
    padded = boolean.clone()
    padded[1, :, :, :3] = False  # row 1 left-padded by 3 tokens
    shifted = (torch.arange(n_k) <= torch.arange(n_q)[:, None] + (n_k - n_q) - 1)[None, None]
    late = boolean.clone()
    late[0, 0, -1, -1] = False  # one pair in the last comparison block
    for mask in (padded, shifted, torch.ones(1, 1, n_q, n_k, dtype=torch.bool), late):
        assert not kernels.plain_causal(mask, n_q, n_k)
    assert not kernels.plain_causal(boolean, n_q, n_k + 1)
    assert kernels.plain_causal(boolean, n_q, n_k)
    boolean[0, 0, 0, -1] = True  # changed in place: the kept answer is not reused
    assert not kernels.plain_causal(boolean, n_q, n_k)
    with torch.inference_mode():  # generate() builds its masks there: inference tensors have no version counter
        made = causal[None, None].clone()
        assert kernels.plain_causal(made, n_q, n_k)
        made[0, 0, 0, -1] = True
        assert not kernels.plain_causal(made, n_q, n_k)


@pytest.mark.parametrize("method", list(SPECS))
def test_generate_matches_and_left_padded_batch_equals_rows(method):
    """generate() with the cache (greedy) continues as one-shot argmax does; a left-padded batch gives each row's
    logits of that row alone (eager and SDPA)."""
    for impl in IMPLS:
        model = _patched("llama", method, impl)
        rows = [tiny.input_ids(70, seed=3)[0], tiny.input_ids(55, seed=4)[0]]
        width = max(len(r) for r in rows)
        ids = torch.stack([torch.cat((torch.zeros(width - len(r), dtype=torch.long), r)) for r in rows])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            batch = model(ids, attention_mask=mask, position_ids=positions).logits
            for b, row in enumerate(rows):
                alone = model(row[None]).logits
                torch.testing.assert_close(batch[b, width - len(row) :], alone[0], atol=1e-4, rtol=0)
            out = model.generate(ids[:1, -70:], max_new_tokens=6, do_sample=False, pad_token_id=0)
            logits = model(out[:, :-1]).logits
        assert torch.equal(logits[0, 69:].argmax(-1), out[0, 70:])


@pytest.mark.parametrize("method", list(SPECS))
def test_unpatch_restores_bit_exactly_and_double_patching_is_a_no_op(method):
    model = make("llama")
    ids = tiny.input_ids(96)
    with torch.no_grad():
        before = model(ids).logits
    config = model.config.to_dict()
    report = patch_model(model, **SPECS[method], factor=3)
    assert report.changed
    assert not patch_model(model, **SPECS[method], factor=3).changed
    assert unpatch_model(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert model.config.to_dict() == config
    from rope_extend.compat import attention_functions

    assert not any(module in runtime._LIVE for module in model.modules())
    # the dispatchers leave the registry with the last patched module
    assert (attention_functions().get_local("sdpa") is None) == (not runtime._LIVE)


def test_marker_reapplies_in_process(tmp_path):
    """A saved checkpoint is the original model for stock loaders; patch_model(model) re-applies the marker."""
    from transformers import AutoModelForCausalLM

    model = _patched("llama", "self-extend")
    ids = tiny.input_ids(96)
    with torch.no_grad():
        want = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=IMPLS[0]).eval()
    with torch.no_grad():
        stock = loaded(ids).logits
        torch.testing.assert_close(stock, make("llama")(ids).logits, atol=1e-5, rtol=0)
    report = patch_model(loaded)
    assert (report.spec.group_size, report.spec.neighbor_window) == (4, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, want, atol=1e-5, rtol=0)


# --- specs -------------------------------------------------------------------------------------------------------------
def test_defaults_follow_the_reach_rule():
    config = tiny.make_config("llama")
    config.max_position_embeddings = 8192
    for factor, group in ((2, 4), (4, 8)):
        plan = plan_patch(config, method="self-extend", factor=factor)
        assert (plan.spec.group_size, plan.spec.neighbor_window) == (group, 1024)
        largest = (plan.spec.target_length - 1) // group + 1024 - 1024 // group
        assert largest <= 0.625 * 8192
    plan = plan_patch(config, method="self-extend", factor=2, group_size=16)
    assert plan.spec.group_size == 16  # explicit values override
    plan = plan_patch(config, method="dual-chunk", factor=2)  # ChunkLlama at 847ae71: 3L/4, L // 8, 0.05·ln(n/L) + 1
    assert (plan.spec.chunk_size, plan.spec.local_window, plan.spec.length_scale) == (6144, 1024, 0.05)


def test_every_attention_method_hands_the_kernel_a_position_map():
    """Each attention-level method's map keeps the declared contract `maps.PositionMap` (the paths read nothing
    else): every attribute it declares, every method with the protocol's parameters, hashable (the paths key their
    memos by the map); and every sub-map the map selects is one of its passes."""
    import inspect

    from rope_extend.attention.maps import PositionMap
    from rope_extend.methods import all_methods

    functions = [name for name, value in vars(PositionMap).items() if inspect.isfunction(value) and name[0] != "_"]
    attributes = list(PositionMap.__annotations__)
    assert {"passes", "segments", "is_identity", "logits_times"} <= set(functions) and attributes
    config = tiny.make_config("llama")
    config.max_position_embeddings = 8192
    methods = [m for m in all_methods() if m.acts_on_attention]
    assert {m.name for m in methods} == {"self-extend", "dual-chunk", "string"}
    for method in methods:
        plan = plan_patch(config, method=method.name, **({"factor": 2} if method.needs_factor else {}))
        mapping = method.mapping(plan.spec)
        assert isinstance(mapping, PositionMap), method.name
        for name in functions:
            want = list(inspect.signature(getattr(PositionMap, name)).parameters)
            assert list(inspect.signature(getattr(type(mapping), name)).parameters) == want, (method.name, name)
        assert all(isinstance(getattr(mapping, name), bool) for name in attributes)
        assert hash(mapping) == hash(method.mapping(plan.spec))
        q_pos, k_pos = torch.arange(0, 20000, 997)[None, :, None], torch.arange(0, 20000, 499)[None, None, :]
        used = {int(i) for i in mapping.select(q_pos, k_pos)[k_pos <= q_pos].unique()}
        assert used <= set(range(len(mapping.passes(0, 0, "cpu")))) and len(used) > 1, (method.name, used)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"method": "self-extend", "factor": 4, "group_size": 2}, r"reach rule is N <= \(L - W\)·G \+ W"),
        ({"method": "self-extend", "factor": 2, "neighbor_window": 8192}, "below the original length"),
        ({"method": "dual-chunk", "factor": 2, "chunk_size": 8192}, "must be below the original length"),
        ({"method": "dual-chunk", "factor": 2, "chunk_size": 100, "local_window": 100}, "must be below chunk_size"),
        ({"method": "self-extend", "factor": 2, "group_size": 0}, "must be > 0"),
        ({"method": "self-extend", "factor": 2, "group_size": 2.5}, "group_size"),
        ({"method": "self-extend"}, "needs 'factor' or 'target_length'"),
        ({"method": "dual-chunk", "factor": 2, "beta_fast": 3.0}, "does not apply to method 'dual-chunk'"),
        ({"method": "dual-chunk", "factor": 2, "length_scale": 0.9}, r"length_scale 0.9 must lie in \[0, 0.5\]"),
        ({"method": "dual-chunk", "factor": 2, "length_scale": -0.05}, r"must lie in \[0, 0.5\]"),
        ({"method": "dual-chunk"}, "needs 'factor' or 'target_length'"),  # issue 57: it reached L -> L
    ],
)
def test_spec_errors_name_the_rule(kwargs, match):
    config = tiny.make_config("llama")
    config.max_position_embeddings = 8192
    with pytest.raises(SpecError, match=match):
        plan_patch(config, **kwargs)


def test_refusals_name_why():
    from rope_extend import gguf  # noqa: F401  (the refusal is the method's)
    from rope_extend.methods import gguf_rules

    with pytest.raises(SpecError, match="-gan G -gaw W"):
        gguf_rules("self-extend").rope(load_spec(method="self-extend", factor=2), 1e4, 16, None, 1.0)
    with pytest.raises(SpecError, match="no dual chunk attention"):
        gguf_rules("dual-chunk").rope(load_spec(method="dual-chunk", factor=2), 1e4, 16, None, 1.0)
    if not EAGER_THROUGH_ATTENTION_REGISTRY:
        with pytest.raises(UnsupportedModelError, match="calls its eager attention directly"):
            patch_model(tiny.make_model("llama"), method="self-extend", factor=4)
    model = make("mistral")
    model.config.sliding_window = 16
    for layer in model.model.layers:
        layer.self_attn.sliding_window = 16
    with pytest.raises(UnsupportedModelError, match="sliding-window attention"):
        patch_model(model, method="self-extend", factor=4)
    assert not hasattr(model, "_rope_extend_state")
    assert not any(runtime.CONTEXT in module.__dict__ for module in model.modules())


def test_cli_patch_and_validate(tmp_path, capsys):
    """`rope-extend patch --method self-extend --set group_size=4` writes the resolved spec into the marker;
    `rope-extend validate` applies the reach rule once it knows the original length."""
    import json

    from rope_extend.cli import run

    source, out = tmp_path / "src", tmp_path / "out"
    tiny.make_model("llama").save_pretrained(source)
    assert run(["patch", str(source), "-o", str(out), "--method", "self-extend", "--factor", "3", "--set",
                "group_size=4"]) == 0
    marker = json.loads((out / "config.json").read_text())["rope_extend"]
    assert marker["spec"]["group_size"] == 4 and marker["spec"]["neighbor_window"] == 4
    capsys.readouterr()
    assert "the model WITHOUT self-extend" in (out / "README.md").read_text()  # the model card says what stock engines serve
    spec = tmp_path / "se.yaml"
    spec.write_text("method: self-extend\nfactor: 4\ngroup_size: 2\n")
    assert run(["validate", str(spec)]) == 0
    assert run(["validate", str(spec), "--original-length", "8192"]) == 2
    assert "reach rule" in capsys.readouterr().err


def test_smollm2_smoke_with_small_windows(smollm2_path):
    """SmolLM2-135M with G/W and chunks shrunk to a 150-token prompt: the original below the window, a real change
    beyond it, and cached decoding equal to one forward."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(100, 20000, (1, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base, short = model(ids).logits, model(ids[:, :40]).logits
    for spec in ({"method": "self-extend", "factor": 1.5, "group_size": 2, "neighbor_window": 48},
                 {"method": "dual-chunk", "factor": 1.5, "chunk_size": 96, "local_window": 16}):
        patch_model(model, **spec)
        with torch.no_grad():
            full = model(ids).logits
            # every distance below the window: the original model's forward of the same 40 tokens, bit for bit
            # (not a slice of the 150-token forward, whose matmul blocking differs in the last bits)
            assert torch.equal(model(ids[:, :40]).logits, short)
            cache = DynamicCache(config=model.config)
            steps = [model(ids[:, :145], **_cache(cache)).logits]
            steps += [model(ids[:, t : t + 1], **_cache(cache)).logits for t in range(145, 150)]
        assert (full[0, 100:] - base[0, 100:]).abs().max() > 0.1
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=0)
        unpatch_model(model)


@pytest.mark.parametrize("method", list(SPECS))
def test_generate_after_a_reused_prefix_takes_the_fused_path_in_inference_mode(method, monkeypatch):
    """The eval's probes: generate() under inference_mode on a cache cropped back to a shared prefix (its prefill
    carries transformers' causal mask, an inference tensor) continues exactly as generate() from scratch, on the
    fused path."""

    model = _patched("llama", method, "sdpa")
    paths = []
    for name in ("_fused_attention", "_blocked_attention"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=original, _n=name, **k: paths.append(_n) or _f(*a, **k))
    alone, reused = generate_alone_and_after_a_shared_prefix(model, 70, 30, 5, before_reuse=paths.clear)
    assert torch.equal(reused, alone)
    assert set(paths) == {"_fused_attention"}


# --- on a model that ships a scheme (docs/attention-methods.md, "On a model that ships a scheme") ---------------------
def _shipped(name: str):
    """A tiny random-weight model with the RoPE section and window of a real config: Llama 3.1 as shipped (llama3
    x8 over 8192, 131072), Qwen2.5-7B-Instruct with the YaRN x4 over 32768 its card adds (max_position_embeddings
    32768: the window 131072 is the scheme's)."""
    import json
    from pathlib import Path

    import hubcache
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_extend import verify

    repo = {"llama-3.1": "meta-llama/Llama-3.1-8B", "qwen2.5-instruct-yarn": "Qwen/Qwen2.5-7B-Instruct"}[name]
    data = json.loads(Path(hubcache.config_path(repo)).read_text())
    data.update(hubcache.QWEN_YARN if "qwen" in name else {})
    config = verify.small_config(AutoConfig.for_model(**data))
    config.num_hidden_layers = len(getattr(config, "layer_types", None) or [0, 0])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5-instruct-yarn"])
@pytest.mark.parametrize("method", list(SPECS))
def test_a_shipped_scheme_is_kept_and_the_remap_rotates_with_its_frequencies(name, method, monkeypatch):
    """self-extend and dual-chunk keep a shipped scheme as STRING does: the config's RoPE slots, its
    max_position_embeddings and the rotary modules stay as they were; L is the window the scheme reaches (131072);
    every remapped layer re-rotates with the frequencies and attention factor stock transformers builds from the
    config (llama3's; Qwen's YaRN x4 with 0.1 ln 4 + 1), not the bare RoPE; the logits equal the naive reference
    with those frequencies; unpatch_model restores the model bit for bit."""
    from rope_extend import compat
    from rope_extend.rotary import find_rotary_modules

    model = _shipped(name)
    config = compat.text_config(model.config)
    before, window = copy.deepcopy(compat.read_slots(config)), config.max_position_embeddings
    buffers = {n: m.inv_freq.clone() for n, m, _ in find_rotary_modules(model)}
    ids = torch.randint(3, 200, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model(ids).logits
    report = patch_model(model, **SPECS[method], factor=2)
    assert (report.spec.original_max_position_embeddings, report.spec.target_length) == (131072, 262144)
    after = compat.read_slots(config)
    assert after.keys() == before.keys() and all(compat.params_close(after[k], before[k]) for k in before)
    assert config.max_position_embeddings == window == (32768 if "qwen" in name else 131072)
    assert all(torch.equal(m.inv_freq, buffers[n]) for n, m, _ in find_rotary_modules(model))
    own, attention = compat.stock_rope(config, compat.FLAT)
    bare = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, own.numel() * 2, 2).float()
                                                            / (own.numel() * 2)))
    assert not torch.allclose(own.float(), bare)  # the scheme's frequencies are not the bare RoPE's
    contexts = [m.__dict__[runtime.CONTEXT] for m in model.modules() if runtime.CONTEXT in m.__dict__]
    assert contexts and all(torch.equal(c.inv_freq, own.float()) for c in contexts)
    assert attention == pytest.approx(0.1 * math.log(4) + 1 if "qwen" in name else 1.0)
    with torch.no_grad():
        got = model(ids).logits
        _reference_kernel(monkeypatch, SPECS[method])
        want = model(ids).logits
    assert (got - base).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    monkeypatch.undo()
    unpatch_model(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base)
