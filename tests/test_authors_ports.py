"""Dual chunk attention and STRING pinned to dense ports of the authors' own code, on a tiny Llama.

Dual chunk attention.

The port (`ChunkLlamaPort`) is written from HKUNLP/ChunkLlama's `chunkllama_attn_replace.py` at commit 847ae71 (the
current one), not from rope-extend's position map: their rotary tables (`ChunkLlamaRotaryEmbedding`: queries at
`t`, at `min(t + s, c)`, keys at `j mod s`, every table times `get_mscale(seq_len / L)` once the sequence is longer
than L, recomputed only when a longer sequence arrives), their prefill (a flash-attn call per chunk for the own
chunk, the previous chunk and the older ones, merged by `merge_attn_outputs`) and their decoding step (one softmax
over the concatenated scores). Their cache holds keys rotated with the tables of the forward that wrote them. The
flash-attn calls are dense (`_flash`: the causal mask flash-attn applies, the log-sum-exp it returns); their merge
rounds the weights to bfloat16 and the port keeps float32 (a precision choice for flash-attn's bf16 outputs, not the
method). Batch 1 without padding, as their code handles it.

What the tests show: the prefill equals rope-extend's to float32 rounding with and without the length scale, at
every length from inside the first chunk to 4L; their decoding equals it without the scale; with the scale their
decoding differs in one thing, shown: a key keeps the factor of the forward that wrote it, where rope-extend scales
every logit of a step by the factor of the step's length (so a one-shot forward, a prefill in pieces and decoding
agree).

STRING. The port (`string_forward`) is written from HKUNLP/STRING's `string_for_llama.py` (commit 216cc2f): their
rotary tables times `attention_factor` (0.1 ln 2 + 1 in their code), their prefill (`string_flash_forward`: a
flash-attn sliding window `window_size=[S, 0]` at the original positions, a causal call of the last n - S queries
rotated at `i - S + W` against the first n - S keys, merged by their log-sum-exps) and their decoding step (the cache
split at n - S, two flash-decoding calls merged the same way), dense. Their one difference, shown: the window
[S, 0] includes d = S, which the shifted call also counts, so their prefill scores the key at d = S twice; with
the window [S - 1, 0] (one character) their prefill equals rope-extend's, and their decoding (which splits the cache
at n - S and counts it once, shifted) equals it as it is.
"""

from __future__ import annotations

import math
import types
import warnings

import pytest
import tiny
import torch
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from rope_extend import patch_model

warnings.filterwarnings("ignore", message=".*acts on attention.*")

L = tiny.ORIGINAL  # 32: the tiny models' window
CHUNK_SIZE = L * 3 // 4  # replace_with_chunkllama(pretraining_length=L): chunk_size = pretraining_length * 3 // 4
LOCAL_WINDOW = L // 8  # ... local_window = pretraining_length // 8 (// 16 before d304027)
SHARPER = 3.0  # q and k projections times this: a random tiny model's attention is nearly uniform otherwise


def tiny_llama(seed: int = 0):
    """The tiny Llama with sharper attention (logits x 9), the same weights for the port and rope-extend."""
    model = tiny.make_model("llama", seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(SHARPER)
            layer.self_attn.k_proj.weight.mul_(SHARPER)
    return model


def get_mscale(scale: float, coefficient: float) -> float:
    """Their `get_mscale`: 0.05 * ln(scale) + 1 beyond the window (0.1 at a4835cf, 0.05 since 7b8ef1e)."""
    if scale <= 1:
        return 1.0
    return coefficient * math.log(scale) + 1.0


class ChunkLlamaRotary:
    """`ChunkLlamaRotaryEmbedding`: one per attention module, its tables rebuilt when a longer sequence arrives."""

    def __init__(self, dim: int, max_position_embeddings: int, base: float, coefficient: float):
        self.dim, self.base, self.coefficient = dim, base, coefficient
        self.max_position_embeddings = self.max_seq_len = max_position_embeddings
        self._set_cos_sin_cache(self.max_seq_len)

    def _set_cos_sin_cache(self, seq_len: int) -> None:
        self.mscale = mscale = get_mscale(seq_len / self.max_position_embeddings, self.coefficient)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2).float() / self.dim))
        chunk_len = CHUNK_SIZE - LOCAL_WINDOW
        q_t = torch.arange(chunk_len, dtype=inv_freq.dtype)
        qc_t = (torch.arange(chunk_len, dtype=inv_freq.dtype) + chunk_len).clamp(max=CHUNK_SIZE)
        k_t = torch.arange(seq_len + 512, dtype=inv_freq.dtype) % chunk_len  # MAX_NEW_TOKENS = 512
        tables = []
        for t in (q_t, qc_t, k_t):
            emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
            tables += [emb.cos() * mscale, emb.sin() * mscale]
        self.tables = tables

    def __call__(self, seq_len: int):
        if seq_len > self.max_seq_len:
            self._set_cos_sin_cache(seq_len)
            self.max_seq_len = seq_len
        return self.tables


def apply_rotary_pos_emb(x, cos, sin, position_ids):
    cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def _flash(q, k, v, causal: bool = True):
    """flash_attn_func(..., causal, return_attn_probs=True) densely: output and the natural-log log-sum-exp of the
    scaled scores (1/sqrt(head_dim)); causal aligned to the bottom right (the calls here are square when causal)."""
    scores = torch.matmul(q.float(), k.float().transpose(2, 3)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = scores.shape[-2:]
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_k - n_q, n_k)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v.float()).to(q.dtype), lse


def merge_attn_outputs(flash_results):
    attn_outputs_all = [flash_results[0][0]]
    for flash_per_chunk in flash_results[1:]:
        attn_outputs = torch.stack([output for output, _ in flash_per_chunk])
        logits = torch.stack([lse for _, lse in flash_per_chunk]).to(torch.float32)
        stable_logits = logits - torch.max(logits, dim=0).values.unsqueeze(0)
        lse_s = torch.exp(stable_logits)
        lse_s /= torch.sum(lse_s, dim=0)  # their code then rounds lse_s to bfloat16: kept in float32 here
        attn_outputs_all.append((attn_outputs * lse_s.unsqueeze(-1)).sum(dim=0))
    return torch.cat(attn_outputs_all, dim=2)


def port_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """Their `forward` (the model's own RoPE and cache are not used: their rotary tables, their cache)."""
    state = self.chunkllama
    bsz, q_len, _ = hidden_states.size()
    chunk_len = CHUNK_SIZE - LOCAL_WINDOW
    shape = (bsz, q_len, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    past = state["keys"].shape[2] if state["keys"] is not None else 0
    kv_seq_len = q_len + past
    position_ids = torch.arange(past, kv_seq_len)[None]
    has_kv_cache = q_len != kv_seq_len
    q_cos, q_sin, qc_cos, qc_sin, k_cos, k_sin = state["rotary"](kv_seq_len)
    key_states = apply_rotary_pos_emb(key_states, k_cos, k_sin, position_ids)
    position_ids = position_ids % chunk_len
    written = torch.full((q_len,), state["rotary"].mscale)  # the factor these keys carry (for the one difference)
    if state["keys"] is not None:  # past_key_value.update: the cache holds the keys as rotated above
        key_states = torch.cat((state["keys"], key_states), dim=2)
        value_states = torch.cat((state["values"], value_states), dim=2)
        written = torch.cat((state["written"], written))
    state["keys"], state["values"], state["written"] = key_states, value_states, written
    if state["rescale"]:  # NOT their code: every cached key at the current forward's factor (rope-extend's rule)
        key_states = key_states * (state["rotary"].mscale / written)[None, None, :, None]
    key_states = repeat_kv(key_states, self.num_key_value_groups)
    value_states = repeat_kv(value_states, self.num_key_value_groups)

    flash_results = []
    if not has_kv_cache:
        q_states_intra = apply_rotary_pos_emb(query_states[:, :, :chunk_len, :], q_cos, q_sin,
                                             position_ids[:, :chunk_len])
        k_states_prev = key_states[:, :, :chunk_len, :]
        v_states_prev = value_states[:, :, :chunk_len, :]
        flash_results.append(_flash(q_states_intra, k_states_prev, v_states_prev))
        remain_len = kv_seq_len - chunk_len
        while remain_len > 0:
            flash_per_chunk = []
            begin = kv_seq_len - remain_len
            curr_chunk_len = min(chunk_len, remain_len)
            end = begin + curr_chunk_len
            q_states_intra = apply_rotary_pos_emb(query_states[:, :, begin:end, :], q_cos, q_sin,
                                                 position_ids[:, begin:end])
            k_states_intra = key_states[:, :, begin:end, :]
            v_states_intra = value_states[:, :, begin:end, :]
            flash_per_chunk.append(_flash(q_states_intra, k_states_intra, v_states_intra))
            q_states_succ = apply_rotary_pos_emb(query_states[:, :, begin:end, :], qc_cos, qc_sin,
                                                position_ids[:, begin:end])
            flash_per_chunk.append(_flash(q_states_succ, k_states_prev, v_states_prev, False))
            if begin - (k_states_prev.size(-2)) > 0:
                prev_len = k_states_prev.size(-2)
                q_states_inter = apply_rotary_pos_emb(query_states[:, :, begin:end, :], qc_cos, qc_sin,
                                                     position_ids[:, chunk_len - 1][:, None].repeat(1, curr_chunk_len))
                k_states_inter = key_states[:, :, : begin - prev_len, :]
                v_states_inter = value_states[:, :, : begin - prev_len, :]
                flash_per_chunk.append(_flash(q_states_inter, k_states_inter, v_states_inter, False))
            flash_results.append(flash_per_chunk)
            k_states_prev, v_states_prev = k_states_intra, v_states_intra
            remain_len = remain_len - chunk_len
        attn_output = merge_attn_outputs(flash_results)
    else:
        chunk_num_curr = (kv_seq_len - 1) // chunk_len
        q_states_intra = apply_rotary_pos_emb(query_states, q_cos, q_sin, position_ids)
        k_states_intra = key_states[:, :, chunk_len * chunk_num_curr : kv_seq_len, :]
        attn_scores = [torch.matmul(q_states_intra, k_states_intra.transpose(2, 3)) / math.sqrt(self.head_dim)]
        if chunk_num_curr >= 1:
            q_states_succ = apply_rotary_pos_emb(query_states, qc_cos, qc_sin, position_ids)
            k_states_succ = key_states[:, :, chunk_len * (chunk_num_curr - 1) : chunk_len * chunk_num_curr, :]
            attn_scores = [torch.matmul(q_states_succ, k_states_succ.transpose(2, 3)) / math.sqrt(self.head_dim),
                           *attn_scores]
        if chunk_num_curr >= 2:
            q_states_inter = apply_rotary_pos_emb(query_states, qc_cos, qc_sin, torch.tensor([[chunk_len - 1]]))
            k_states_inter = key_states[:, :, : chunk_len * (chunk_num_curr - 1), :]
            attn_scores = [torch.matmul(q_states_inter, k_states_inter.transpose(2, 3)) / math.sqrt(self.head_dim),
                           *attn_scores]
        attn_weights = torch.cat(attn_scores, dim=-1)
        attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
    return self.o_proj(attn_output), None


class ChunkLlamaPort:
    """A tiny Llama whose attention modules run `port_forward`; `reset()` empties their cache (not their rotary
    tables' longest length, as in their code)."""

    def __init__(self, coefficient: float, seed: int = 0, rescale: bool = False):
        self.model = tiny_llama(seed)
        config = self.model.config
        for layer in self.model.model.layers:
            attention = layer.self_attn
            attention.chunkllama = {"keys": None, "values": None, "written": None, "rescale": rescale,
                                    "rotary": ChunkLlamaRotary(attention.head_dim, config.max_position_embeddings,
                                                               config.rope_theta if hasattr(config, "rope_theta")
                                                               else config.rope_parameters["rope_theta"],
                                                               coefficient)}
            attention.forward = types.MethodType(port_forward, attention)

    def reset(self) -> None:
        for layer in self.model.model.layers:
            layer.self_attn.chunkllama.update(keys=None, values=None, written=None)

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """The logits of the new tokens `ids`, after what the port's cache holds (its own cache: the model's is
        off, and the port numbers positions from its cache's length)."""
        return self.model(ids, use_cache=False).logits


def _rope_extend(coefficient: float):
    model = tiny_llama()
    model.set_attn_implementation("sdpa")
    patch_model(model, method="dual-chunk", factor=4, chunk_size=CHUNK_SIZE, local_window=LOCAL_WINDOW,
                length_scale=coefficient)
    return model


@pytest.mark.parametrize("coefficient", [0.0, 0.05], ids=["no-scale", "scale-0.05"])
def test_prefill_equals_the_authors_port(coefficient):
    """One forward at lengths from inside the first chunk (the original model) to 4L: the authors' prefill and
    rope-extend give the same logits, with and without their length scale; and the scale changes the logits
    beyond L by what it should (so the comparison can see it)."""
    ours = _rope_extend(coefficient)
    for n in (CHUNK_SIZE - LOCAL_WINDOW - 1, L, 2 * L + 5, 4 * L):
        port = ChunkLlamaPort(coefficient)
        ids = tiny.input_ids(n)
        want = port.logits(ids)
        with torch.no_grad():
            got = ours(ids).logits
        torch.testing.assert_close(got, want, atol=5e-5, rtol=0)
    if coefficient:
        with torch.no_grad():
            plain = _rope_extend(0.0)(ids).logits
        assert (got - plain).abs().max() > 1e-3


def test_decoding_equals_the_authors_port_without_the_scale():
    """Their decoding branch (one softmax over intra, successive and inter-chunk scores of the cache) after their
    prefill, step by step across two chunk boundaries (chunks of 20 tokens: 100, 120), against rope-extend's
    decoding with the KV cache: the same logits at every step."""
    from transformers import DynamicCache

    port, ours = ChunkLlamaPort(0.0), _rope_extend(0.0)
    ids = tiny.input_ids(4 * L)
    cache = DynamicCache(config=ours.config)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids[:, :96], past_key_values=cache, use_cache=True).logits,
                                   port.logits(ids[:, :96]), atol=5e-5, rtol=0)
        for t in range(96, 4 * L):
            got = ours(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(got, port.logits(ids[:, t : t + 1]), atol=5e-5, rtol=0)


def test_with_the_scale_their_keys_keep_the_factor_of_the_forward_that_wrote_them():
    """Their one difference with the scale, shown. Their cache holds keys rotated with the tables of the forward
    that wrote them, so a decoding step at length m scores a key written at length n with
    get_mscale(m / L)·get_mscale(n / L), where rope-extend scales every logit of the step by get_mscale(m / L)², as
    their own prefill does within one forward (a one-shot forward, a prefill in pieces and decoding then agree).
    After a prompt of 2L tokens, decoding 40 steps (across the chunk boundaries at 80 and 100): rope-extend equals the port with that one line added (each
    cached key rescaled to the step's factor) at every step, and differs from the port as it is."""
    from transformers import DynamicCache

    n, end = 2 * L, 2 * L + 40
    ids = tiny.input_ids(end)
    port, rescaled, ours = ChunkLlamaPort(0.05), ChunkLlamaPort(0.05, rescale=True), _rope_extend(0.05)
    cache = DynamicCache(config=ours.config)
    with torch.no_grad():
        ours(ids[:, :n], past_key_values=cache, use_cache=True)
        port.logits(ids[:, :n])
        rescaled.logits(ids[:, :n])
        differences = []
        for t in range(n, end):
            got = ours(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(got, rescaled.logits(ids[:, t : t + 1]), atol=5e-5, rtol=0)
            differences.append((got - port.logits(ids[:, t : t + 1])).abs().max().item())
    assert get_mscale(end / L, 0.05) / get_mscale(n / L, 0.05) > 1.02  # what the prompt keys lack at the end
    assert max(differences) > 5e-4  # visible in the logits (10x the tolerance above)


# --- STRING: HKUNLP/STRING string_for_llama.py ------------------------------------------------------------------------
SHIFTED_OFFSET, LOCAL_VALUE = 12, 4  # S and W on the tiny window L = 32 (their defaults 0.33 L and 128 are for 128k)
AUTHORS_FACTOR = 0.1 * math.log(2) + 1  # replace_with_string: attention_factor = 0.1*math.log(2) + 1


def _window_flash(q, k, v, left: int):
    """flash_attn_func(..., causal=True, window_size=[left, 0], return_attn_probs=True) densely: query i sees the
    keys i - left .. i (bottom-right aligned, square here)."""
    scores = torch.matmul(q.float(), k.float().transpose(2, 3)) / math.sqrt(q.shape[-1])
    d = torch.arange(q.shape[2])[:, None] - torch.arange(k.shape[2])[None, :]
    scores = scores.masked_fill((d < 0) | (d > left), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v.float()).to(q.dtype), lse


def string_flash_forward(state, neighbor_query_states, shifted_query_states, key_states, value_states):
    """Theirs, in [B, H, n, D] layout (flash-attn's is [B, n, H, D]); `state["window"]` is their diag_size."""
    diag_size = state["S"]
    kv_seq_len = neighbor_query_states.shape[2]
    diag_out, diag_lse = _window_flash(neighbor_query_states, key_states, value_states, state["window"])
    triangle_len = kv_seq_len - diag_size
    if triangle_len <= 0:  # theirs: `< 0` (a zero-length flash call at n = S)
        return diag_out
    shifted_out, shifted_lse = _flash(shifted_query_states[:, :, -triangle_len:], key_states[:, :, :triangle_len],
                                      value_states[:, :, :triangle_len])
    S = kv_seq_len - triangle_len
    diag_lse_tail = diag_lse[:, :, S:]
    lse_gap = 1 / (1 + torch.exp(diag_lse_tail - shifted_lse))
    lse_gap_re = 1 / (1 + torch.exp(shifted_lse - diag_lse_tail))
    merge_out_tail = diag_out[:, :, S:] * lse_gap_re[..., None] + shifted_out * lse_gap[..., None]
    return torch.cat([diag_out[:, :, :S], merge_out_tail], dim=2)


def string_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """Their `forward` (their rotary tables and cache, not the model's)."""
    state = self.string
    bsz, q_len, _ = hidden_states.size()
    shape = (bsz, q_len, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    past = state["keys"].shape[2] if state["keys"] is not None else 0
    kv_seq_len = q_len + past
    position_ids = torch.arange(past, kv_seq_len)[None]
    has_kv_cache = q_len != kv_seq_len
    dim = self.head_dim  # RotaryEmbedding: _compute_default_rope_parameters, tables times attention_factor
    inv_freq = 1.0 / (state["base"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    emb = torch.cat((torch.outer(torch.arange(kv_seq_len, dtype=inv_freq.dtype), inv_freq),) * 2, dim=-1)
    cos, sin = state["factor"] * emb.cos(), state["factor"] * emb.sin()
    key_states = apply_rotary_pos_emb(key_states, cos, sin, position_ids)
    if state["keys"] is not None:
        key_states = torch.cat((state["keys"], key_states), dim=2)
        value_states = torch.cat((state["values"], value_states), dim=2)
    state["keys"], state["values"] = key_states, value_states
    diag_size, local_window = state["S"], state["W"]
    query_states_1 = apply_rotary_pos_emb(query_states, cos, sin, position_ids)
    # i - S + W: negative for the first queries, which the shifted call never reads (as in theirs, where the
    # negative index wraps around the table)
    query_states_2 = apply_rotary_pos_emb(query_states, cos, sin, position_ids - diag_size + local_window)
    key_states = repeat_kv(key_states, self.num_key_value_groups)
    value_states = repeat_kv(value_states, self.num_key_value_groups)
    if not has_kv_cache:
        attn_output = string_flash_forward(state, query_states_1, query_states_2, key_states, value_states)
    else:  # flash decoding: the cache split at n - S, each part one unmasked call
        shifted_size = kv_seq_len - diag_size
        out1, lse1 = _flash(query_states_1, key_states[:, :, shifted_size:], value_states[:, :, shifted_size:],
                            False)
        out2, lse2 = _flash(query_states_2, key_states[:, :, :shifted_size], value_states[:, :, :shifted_size],
                            False)
        gap21 = 1 / (1 + torch.exp(lse2 - lse1))
        gap12 = 1 / (1 + torch.exp(lse1 - lse2))
        attn_output = out1 * gap21[..., None] + out2 * gap12[..., None]
    attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
    return self.o_proj(attn_output), None


class StringPort(ChunkLlamaPort):
    """A tiny Llama whose attention modules run `string_forward` (neighbour window `window`: theirs is S)."""

    def __init__(self, window: int = SHIFTED_OFFSET, seed: int = 0):
        self.model = tiny_llama(seed)
        config = self.model.config
        base = config.rope_theta if hasattr(config, "rope_theta") else config.rope_parameters["rope_theta"]
        for layer in self.model.model.layers:
            attention = layer.self_attn
            attention.string = {"keys": None, "values": None, "S": SHIFTED_OFFSET, "W": LOCAL_VALUE,
                                "factor": AUTHORS_FACTOR, "base": base, "window": window}
            attention.forward = types.MethodType(string_forward, attention)


def _string():
    model = tiny_llama()
    model.set_attn_implementation("sdpa")
    patch_model(model, method="string", shifted_offset=SHIFTED_OFFSET, local_value=LOCAL_VALUE,
                attention_factor=AUTHORS_FACTOR)
    return model


def test_string_prefill_equals_the_authors_port_but_for_the_key_at_d_equal_to_s():
    """Prompts of S - 1 (every distance below S), S + 1 (one pair at d = S) and L tokens: rope-extend's one
    forward equals their prefill with the neighbour window [S - 1, 0] at every length, and their prefill as it is
    (window [S, 0]: the key at d = S in both calls) only while no distance reaches S."""
    ours = _string()
    for n in (SHIFTED_OFFSET - 1, SHIFTED_OFFSET + 1, L):
        ids = tiny.input_ids(n)
        with torch.no_grad():
            got = ours(ids).logits
        torch.testing.assert_close(got, StringPort(window=SHIFTED_OFFSET - 1).logits(ids), atol=5e-5, rtol=0)
        theirs = StringPort().logits(ids)
        if n < SHIFTED_OFFSET:
            torch.testing.assert_close(got, theirs, atol=5e-5, rtol=0)
        else:
            assert (got - theirs)[:, SHIFTED_OFFSET:].abs().max() > 5e-4  # the rows with a pair at d = S
            torch.testing.assert_close(got[:, :SHIFTED_OFFSET], theirs[:, :SHIFTED_OFFSET], atol=5e-5, rtol=0)


def test_string_decoding_equals_the_authors_port():
    """Their decoding step (the cache split at n - S: the last S keys at their distance, the rest shifted) after a
    prompt of S + 2 tokens, to L tokens, against rope-extend's decoding with the KV cache: the same logits at every
    step. The port's prompt is prefilled with the window [S - 1, 0], so that the two caches hold the same keys and
    values (their own prefill counts d = S twice, above); their decoding branch is as they wrote it."""
    from transformers import DynamicCache

    port, ours = StringPort(window=SHIFTED_OFFSET - 1), _string()
    ids = tiny.input_ids(L)
    n = SHIFTED_OFFSET + 2
    cache = DynamicCache(config=ours.config)
    with torch.no_grad():
        ours(ids[:, :n], past_key_values=cache, use_cache=True)
        port.logits(ids[:, :n])
        for t in range(n, L):
            got = ours(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(got, port.logits(ids[:, t : t + 1]), atol=5e-5, rtol=0)
