"""The attention of the attention-level methods (self-extend, dual chunk attention, STRING), computed on queries and
keys the model already rotated.

Each method gives each (query i, key j) pair a *mapped* relative distance instead of i - j, through a few
sub-maps of its position map (`maps/`: `SelfExtendMap`, `DualChunkMap`, `StringMap`, each with its formulas, all
keeping the contract `maps.PositionMap`). A sub-map is a pair of position shifts (one per query, one per key): RoPE
rotations compose, so a key rotated at position p is moved to p + delta by one more rotation of delta·θ, and q·k
then sees the mapped distance. `remapped_attention` computes one softmax over the merged sub-maps, per block of
queries, never an n×n score matrix per head. Positions arrive as one `positions.Positions`.

`log_n` multiplies each query's logits by max(1, ln(p_i + 1) / ln(L)) (Qwen's logn attention; p_i its position).

Three paths compute the same attention (`select_path` picks one per call):
- the passes path (`passes.py`, the common case off the CPU: contiguous positions, as below): each sub-map region
  is one whole-sequence pass of a swappable attention primitive that returns the log-sum-exp (`primitives.py`:
  FlexAttention with block masks, compiled on CUDA), merged exactly by log-sum-exp; a decoding step runs each pass
  on the contiguous key slice it sees.
- the fused path (`_fused_attention`, the common case: CPU, no mask or softcap, every row at the same contiguous
  positions, as in a prefill or a decoding step without padding; a mask that is exactly the causal mask of queries
  that are the last keys, which transformers builds for a prompt prefilled after a cached prefix, counts as none:
  `plain_causal`). For a block of queries, each sub-map's keys form a few contiguous key ranges (the map's
  `segments`): the keys every query of the block sees through that sub-map (no mask), and a band near the
  boundaries where a mask picks the pairs. Each segment is one call of torch's fused CPU attention kernel, which
  returns the softmax's log-sum-exp, and the segments are merged exactly by log-sum-exp: the same softmax over the
  union, without a score matrix in Python and with each key scored once per query (twice only in the band).
- the general path (`_blocked_attention`: masks, left padding, softcap, devices without a passes primitive):
  scores each sub-map per block of queries, picks per pair (the map's `select`), applies the mask, softmax,
  values. Off the CPU it is a slow Python loop, so taking it there warns once per process per case.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from .maps import PositionMap
from .passes import passes_attention
from .positions import Positions
from .primitives import fused_kernel, primitive_for
from .rotations import log_n_factor, rotate, rotation

BLOCK_ELEMENTS = 1 << 24  # general path: scores per block (B · heads · queries · keys), 64 MiB in float32
STORE_SLACK = 256  # moved keys kept on the cache: spare rows for the next decoding steps
MASKS_KEPT = 64  # fused path: band masks kept for reuse (a few per prompt length), cleared beyond this
QUERY_BLOCK = 256  # fused path: queries per block (the band of keys scored by two maps grows with it)


def key_rotation(mapping, positions: Positions, n_old: int, inv_freq: torch.Tensor, memo: dict | None):
    """cos/sin of the map's key shift for keys n_old .. of `positions`, reused from `memo` (shared by the layers of a
    model): host-known positions by their range, a tensor by the positions it holds or extends (every layer of a
    forward, every decoding step)."""
    if positions.known:
        span = (positions.first + n_old, positions.first + positions.count, str(inv_freq.device))
        entry = memo.get(("key-span", mapping)) if memo is not None else None
        if entry is not None and entry[0] == span:
            return entry[1], entry[2]
        cos, sin = rotation(mapping.key_shift(torch.arange(span[0], span[1], device=inv_freq.device)[None]),
                            inv_freq)
        if memo is not None:
            memo[("key-span", mapping)] = (span, cos, sin)
        return cos, sin
    k_pos = positions.ids
    if memo is None:
        cos, sin = rotation(mapping.key_shift(k_pos), inv_freq)
        return cos[:, :, n_old:], sin[:, :, n_old:]
    entry = memo.get(mapping)
    if entry is not None:
        held, cos, sin = entry
        n_held = held.shape[1]
        if (held.shape[0] == k_pos.shape[0] and held.device == k_pos.device and n_held <= k_pos.shape[1]
                and torch.equal(held, k_pos[:, :n_held])):
            if n_held < k_pos.shape[1]:
                more = rotation(mapping.key_shift(k_pos[:, n_held:]), inv_freq)
                cos, sin = torch.cat((cos, more[0]), dim=2), torch.cat((sin, more[1]), dim=2)
                memo[mapping] = (k_pos, cos, sin)
            return cos[:, :, n_old:], sin[:, :, n_old:]
    cos, sin = rotation(mapping.key_shift(k_pos), inv_freq)
    memo[mapping] = (k_pos, cos, sin)
    return cos[:, :, n_old:], sin[:, :, n_old:]


def remapped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: Positions,
    attention_mask: torch.Tensor | None,
    scaling: float,
    mapping: PositionMap,
    inv_freq: torch.Tensor,
    *,
    softcap: float | None = None,
    log_n_original: int | None = None,
    block_elements: int = BLOCK_ELEMENTS,
    block_queries: int = QUERY_BLOCK,
    memo: dict | None = None,
    key_store: dict | None = None,
    fused: bool | None = None,
    path: str | None = None,
    primitive=None,
) -> torch.Tensor:
    """Attention output [B, q, Hq, Dv] (transformers' attention-function layout).

    query [B, Hq, q, D]; key/value [B, Hkv, K, D], the first `positions.count` keys rotated at `positions` (later
    ones are unfilled static-cache slots), the queries rotated at the last q of them. attention_mask: None (causal
    by index), a boolean mask (True = attend) or an additive float mask, [B or 1, 1 or Hq, q, >= k]. Causality by
    index always holds (transformers' decoder masks are causal), so each block reads only the keys it can see.
    `memo` holds rotation tables by position (shared by the layers of a model); `key_store` holds this layer's
    keys moved by the map's key shift, extended call by call (see `moved_keys`). Positions known on the host
    (`Positions.known`) decide the path without reading a tensor: a decoding step on the passes path synchronises
    nothing.

    `path`: None picks by device and case (`select_path`); "fused", "passes" or "general" insist (tests, benches;
    "fused"/"passes" raise ValueError where they do not apply). `primitive`: the passes path's primitive
    (`primitives.py`), by default `primitives.primitive_for(query.device)`. `fused` is the older switch: True is
    path="fused", False path="general".
    """
    if path is None and fused is not None:
        path = "fused" if fused else "general"
    n_q, n_k = query.shape[2], positions.count
    if positions.padded:  # host-known left padding (the runtime splits such a batch by rows): as a tensor here
        positions = Positions.of(positions.key_ids(query.device))
    if path == "general":
        start, case = None, "the general path asked for"
    else:
        start, case = contiguous_start(query, positions, attention_mask, softcap)
    if path is None:
        if start is not None and primitive is None and query.device.type != "cpu":
            primitive = primitive_for(query.device)
            if primitive is None:
                start, case = None, f"no fast attention primitive for {query.device.type} tensors"
        path = select_path(query.device, start, case, mapping)
    if path in ("fused", "passes") and start is None:
        raise ValueError(f"the {path} path needs no softcap, no mask but the plain causal one, and the same "
                         f"contiguous positions in every row; here: {case}")
    if path == "fused" and (query.device.type != "cpu" or fused_kernel() is None):
        raise ValueError("the fused path needs a CPU tensor and torch's fused CPU attention kernel")
    scaling = scaling * mapping.logits_times(n_k)
    if not positions.known:  # the key store and rotation tables compare a tensor of every row
        positions = Positions.of(positions.key_ids(query.device).expand(query.shape[0], n_k))
    if path == "passes":
        primitive = primitive or primitive_for(query.device)
        if primitive is None:
            raise ValueError(f"no passes primitive for {query.device.type} tensors")
        move = lambda needed: moved_keys(mapping, key, positions, inv_freq, memo, key_store, needed)
        return passes_attention(query, key, value, move, start, n_k, scaling, mapping, inv_freq, log_n_original,
                                primitive, memo)
    k_pos = positions.key_ids(query.device)
    q_pos = k_pos[:, n_k - n_q :]
    moved = None
    if mapping.keys_move and (path != "fused" or mapping.fused_moves_keys):
        moved = moved_keys(mapping, key, positions, inv_freq, memo, key_store)
    if path == "general":
        return _blocked_attention(query, key, value, q_pos, k_pos, attention_mask, scaling, mapping, inv_freq,
                                  moved, softcap, log_n_original, block_elements, memo)
    return _fused_attention(query, key, value, moved, q_pos, n_k, start, scaling, mapping, inv_freq,
                            log_n_original, max(1, block_queries), memo)


_WARNED: set = set()  # the fallback cases already warned about in this process


def select_path(device: torch.device, start: int | None, case: str | None, mapping) -> str:
    """The path for a call: "fused" on CPU (its kernel at hand), "passes" on other devices, both for contiguous
    positions (`start` not None); otherwise "general", with one warning per process per case off the CPU, where the
    general path's Python loop over query blocks is far slower than attention (67-195x on an H200 at 16k-64k)."""
    if start is not None:
        if device.type == "cpu" and fused_kernel() is not None:
            return "fused"
        if device.type != "cpu":
            return "passes"
        case = "no fused CPU attention kernel in this torch"
    if device.type != "cpu" and case not in _WARNED:
        _WARNED.add(case)
        warnings.warn(f"rope-extend: {case}: attention-level methods on {device.type} fall back to the general "
                      "blocked path, which is slow (a Python loop over query blocks); see "
                      "docs/attention-methods.md, 'Speed by device'", RuntimeWarning, stacklevel=3)
    return "general"


def moved_keys(mapping, key, positions: Positions, inv_freq, memo, store, needed: int | None = None) -> torch.Tensor:
    """The keys rotated by the map's key shift [B, Hkv, >= needed, D] (all `positions.count` of them when `needed`
    is None, or when some must be rotated). With a `store` (this layer's, kept on the KV cache by `runtime`, which
    empties it when the cache's key tensor is not the one it last saw) the keys moved at earlier calls at the same
    positions are reused and only the new ones are rotated. A caller that reads only the first `needed` (the passes
    path: a key joins the moved passes W steps after it is written, or when its chunk ends) gets the held ones while
    they suffice, so the cache's new keys are rotated in batches (all that have arrived) every so many steps, not
    one per layer and step; with host-known positions nothing is compared on the device."""
    n_k = positions.count
    needed = n_k if needed is None else min(needed, n_k)
    held = store.get("moved") if store is not None else None
    n_old = 0
    if held is not None:
        n_old = min(store["count"], n_k)
        kept = store["positions"]
        same = held.shape[0] == key.shape[0] and held.dtype == key.dtype and held.device == key.device and (
            isinstance(kept, int) and kept == positions.first if positions.known else
            isinstance(kept, torch.Tensor) and torch.equal(kept[:, :n_old], positions.ids[:, :n_old]))
        held, n_old = (held[:, :, :n_old], n_old) if same else (None, 0)
        if held is not None and n_old >= needed:
            store["keys"] = key
            return held
    if held is None or n_old < n_k:
        cos, sin = key_rotation(mapping, positions, n_old, inv_freq, memo)
        fresh = rotate(key[:, :, n_old:n_k], cos, sin)
        if store is None:
            return fresh
        buffer = store.get("buffer") if n_old else None
        if buffer is None or buffer.shape[2] < n_k:  # room for the next decoding steps, so a step writes one key
            extra = max(STORE_SLACK, n_k // 8) if n_old else STORE_SLACK
            grown = fresh.new_empty(*fresh.shape[:2], n_k + extra, fresh.shape[3])
            if n_old:
                grown[:, :, :n_old] = held
            buffer = grown
        buffer[:, :, n_old:n_k] = fresh
        store["buffer"], held = buffer, buffer[:, :, :n_k]
    if store is not None:
        store.update(moved=held, positions=positions.first if positions.known else positions.ids, count=n_k,
                     keys=key)
    return held


_CAUSAL_SEEN: list = [None, None, False]  # plain_causal's last answer: (mask weakref, its version, the answer)
CAUSAL_ROWS = 1024  # plain_causal compares the mask in blocks of this many query rows


def plain_causal(mask: torch.Tensor, n_q: int, n_k: int) -> bool:
    """Whether *mask* ([B, 1 or heads, n_q, n_k], boolean or additive) lets exactly each query see the keys up to
    its own, the queries being the last n_q of n_k keys, in every row: the mask transformers builds for a prompt
    prefilled after a cached prefix (no padding), which the fused path applies by construction. The answer for
    the last mask is kept while that tensor lives unchanged (all layers of one forward share it); a mask made under
    `torch.inference_mode` has no version counter, so it is compared again at each call."""
    if mask.dim() != 4 or tuple(mask.shape[-2:]) != (n_q, n_k) or n_q > n_k:
        return False
    version = None if mask.is_inference() else mask._version  # inference tensors keep no version: not kept
    ref, seen_version, answer = _CAUSAL_SEEN
    if version is not None and ref is not None and ref() is mask and seen_version == version:
        return answer
    answer = True
    keys = torch.arange(n_k, device=mask.device)
    for a in range(0, n_q, CAUSAL_ROWS):
        rows = mask[..., a : a + CAUSAL_ROWS, :]
        block = rows if mask.dtype == torch.bool else rows == 0  # additive masks: 0 where a key is seen
        causal = keys <= torch.arange(a, a + rows.shape[-2], device=mask.device)[:, None] + (n_k - n_q)
        if not bool((block == causal).all()):
            answer = False
            break
    _CAUSAL_SEEN[:] = [weakref.ref(mask), version, answer]
    return answer


def contiguous_start(query, positions: Positions, mask, softcap) -> tuple[int | None, str | None]:
    """(the position of key 0, None) when the fused and passes paths apply: no softcap, no mask or the plain causal
    one, the same contiguous positions in every row; else (None, the case that does not). Host-known positions are
    checked without reading a tensor (unless a mask is given)."""
    if softcap is not None:
        return None, "attention logit softcapping"
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None, f"dtype {query.dtype}"
    n_q, n_k = query.shape[2], positions.count
    if positions.known:
        if positions.padded:
            return None, "left padding"
        first = positions.first
    else:
        ids = positions.ids.to(query.device)
        first = int(ids[0, 0])
        if first < 0 or not torch.equal(ids, (torch.arange(n_k, device=ids.device) + first).expand_as(ids)):
            return None, "positions not contiguous or not the same in every batch row (left padding, packed sequences)"
    if mask is not None and not plain_causal(mask, n_q, n_k):  # last: the one check that reads n_q x n_k values
        return None, "an attention mask other than the causal one (padding or a custom mask)"
    return first, None


def _fused_attention(query, key, value, moved, q_pos, n_k, first, scaling, mapping, inv_freq, log_n_original, block,
                     memo):
    """See the module docstring: per block of queries, one fused-kernel call per segment, merged by log-sum-exp."""
    kernel = fused_kernel()
    batch, heads, n_q, dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    offset = n_k - n_q
    row = q_pos[:1]
    factor = log_n_factor(row, log_n_original)[0] if log_n_original else None
    queries = []  # per map, [B, Hkv, rep, q, D] (GQA: a key head's query heads stacked along the queries)
    for index, q_shift in enumerate(mapping.query_shifts(row)):
        q_v = query if q_shift is None else rotate(query, *query_rotation(mapping, index, row, q_shift, inv_freq,
                                                                        memo))
        if factor is not None:
            q_v = q_v * factor[:, None].to(q_v.dtype)
        queries.append(q_v.reshape(batch, kv_heads, rep, n_q, dim))
    keys = [key if q_shift is None or moved is None else moved for q_shift in mapping.query_shifts(row[:, :1])]
    out = value.new_empty(batch, kv_heads, rep, n_q, value.shape[-1])
    edges = [0, *[p - first - offset for p in mapping.split_points(first + offset, first + n_k)], n_q]
    bounds, masks = [], memo.setdefault("masks", {}) if memo is not None else {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        bounds += [(s, min(hi, s + block)) for s in range(lo, hi, block)]
    for start, stop in bounds:
        a, b = first + offset + start, first + offset + stop  # the block's query positions [a, b)
        parts = []
        for index, k_lo, k_hi, full, key_shift in mapping.segments(a, b):
            k_lo, k_hi = max(k_lo, first), min(k_hi, b)
            if k_hi <= k_lo:
                continue
            q_b = queries[index][:, :, :, start:stop]
            if key_shift is None:  # the map's keys (moved by its key shift, or the original ones)
                ks = keys[index][:, :, k_lo - first : k_hi - first]
            else:  # one shift for every key of the segment: the query takes its inverse, the keys stay as they are
                q_b = rotate(q_b, *rotation(torch.full((1, 1), -key_shift, device=query.device), inv_freq))
                ks = key[:, :, k_lo - first : k_hi - first]
            q_b = q_b.reshape(batch, kv_heads, rep * (stop - start), dim)
            vs = value[:, :, k_lo - first : k_hi - first]
            mask = empty = None
            if not full:
                mask, empty = _segment_mask(mapping, index, a, b, k_lo, k_hi, rep, query, masks)
                if mask is False:
                    continue
            o, lse = kernel(q_b, ks, vs, attn_mask=mask, scale=scaling)
            if empty is not None:
                lse = lse.masked_fill(empty, float("-inf"))
            parts.append((o, lse.float()))
        if len(parts) == 1:
            merged = parts[0][0]
        else:
            total = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
            merged = sum(o.float() * torch.exp(lse - total)[..., None] for o, lse in parts).to(value.dtype)
        out[:, :, :, start:stop] = merged.reshape(batch, kv_heads, rep, stop - start, -1)
    return out.reshape(batch, heads, n_q, -1).transpose(1, 2).contiguous()


def _segment_mask(mapping, index, a, b, k_lo, k_hi, rep, query, masks):
    """The additive mask [rep·(b - a), k_hi - k_lo] of a partial segment (None: every pair attends, False: none)
    and its rows that attend nothing (None if none), from the map's own `select` and causality. A partial segment's
    mask depends only on its shape and the gap a - k_lo (self-extend: on distances; dual-chunk: the causal square
    of one chunk), so it is kept in `masks` and reused by the other blocks and layers."""
    key = (mapping, index, a - k_lo, b - a, k_hi - k_lo, rep, query.dtype, query.device)
    if key not in masks:
        if len(masks) >= MASKS_KEPT:  # prompts of many lengths: their last blocks' masks would pile up
            masks.clear()
        q_p = torch.arange(a, b, device=query.device)[None, :, None]
        k_p = torch.arange(k_lo, k_hi, device=query.device)[None, None, :]
        allowed = ((mapping.select(q_p, k_p) == index) & (k_p <= q_p))[0]
        if not bool(allowed.any()):
            masks[key] = (False, None)
        elif bool(allowed.all()):
            masks[key] = (None, None)
        else:
            rows = allowed.any(-1)
            mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
            mask = mask.masked_fill_(~allowed, float("-inf")).repeat(rep, 1)
            masks[key] = (mask, None if bool(rows.all()) else ~rows.repeat(rep))
    return masks[key]


def query_rotation(mapping, index, q_pos, q_shift, inv_freq, memo):
    """cos/sin of map `index`'s query shift at q_pos, reused from `memo` by the layers of one forward."""
    if memo is None:
        return rotation(q_shift, inv_freq)
    entry = memo.get(("query", mapping, index))
    if entry is not None and entry[0].shape == q_pos.shape and torch.equal(entry[0], q_pos):
        return entry[1], entry[2]
    cos, sin = rotation(q_shift, inv_freq)
    memo[("query", mapping, index)] = (q_pos, cos, sin)
    return cos, sin


def _blocked_attention(query, key, value, q_pos, k_pos, attention_mask, scaling, mapping, inv_freq, moved,
                       softcap, log_n_original, block_elements, memo):
    """The general path: every map scored per block of queries, picked per pair, masked, one softmax."""
    batch, heads, n_q, dim = query.shape
    kv_heads, n_k = key.shape[1], k_pos.shape[1]
    rep = heads // kv_heads
    q_pos = q_pos.to(query.device).expand(batch, n_q)
    k_pos = k_pos.to(query.device).expand(batch, n_k)
    key, value = key[:, :, :n_k], value[:, :, :n_k]

    moved = (key if moved is None else moved)[:, :, None]  # None: the map moves no key (STRING)
    maps = []
    for q_shift in mapping.query_shifts(q_pos):
        q_v = query * scaling if q_shift is None else rotate(query, *rotation(q_shift, inv_freq)) * scaling
        maps.append((q_v.reshape(batch, kv_heads, rep, n_q, dim), key[:, :, None] if q_shift is None else moved))
    values = value[:, :, None]
    factor = log_n_factor(q_pos, log_n_original) if log_n_original else None
    mask = attention_mask
    if mask is not None and mask.dim() == 4:
        mask = mask.reshape(mask.shape[0], kv_heads if mask.shape[1] == heads else 1, rep if mask.shape[1] == heads
                            else 1, mask.shape[2], mask.shape[3])

    out = value.new_empty(batch, kv_heads, rep, n_q, value.shape[-1])
    block = max(1, min(n_q, block_elements // max(1, batch * heads * n_k)))
    offset = n_k - n_q  # index of the first query among the keys
    # With positions increasing along the keys (no padding), the keys far enough behind a block use the last map
    # (grouped / inter-chunk) for all its queries: only the band after them needs every map.
    monotone = n_k < 2 or bool((k_pos[:, 1:] >= k_pos[:, :-1]).all())
    for start in range(0, n_q, block):
        stop = min(n_q, start + block)
        visible = offset + stop  # causal: no query of the block sees keys beyond this index
        far = 0
        if monotone:
            threshold = torch.full((batch, 1), mapping.far_threshold(int(q_pos[:, start:stop].min())),
                                   dtype=k_pos.dtype, device=k_pos.device)
            far = min(visible, int(torch.searchsorted(k_pos[:, :visible].contiguous(), threshold).min()))
        q_last, k_last = maps[-1]
        scores = torch.matmul(q_last[..., start:stop, :], k_last[..., :visible, :].transpose(-1, -2))
        if far < visible:
            which = mapping.select(q_pos[:, start:stop, None], k_pos[:, None, far:visible])[:, None, None]
            band = scores[..., far:visible]
            for index, (q_v, k_v) in enumerate(maps[:-1]):
                part = torch.matmul(q_v[..., start:stop, :], k_v[..., far:visible, :].transpose(-1, -2))
                band.copy_(torch.where(which == index, part, band, out=part))
        scores = scores.float()
        if factor is not None:
            scores = scores * factor[:, None, None, start:stop, None]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if mask is None:
            rows = torch.arange(offset + start, offset + stop, device=query.device)[:, None]
            allowed = torch.arange(visible, device=query.device)[None, :] <= rows
            scores = scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
        elif mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask[..., start:stop, :visible], torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask[..., start:stop, :visible].float()
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        out[..., start:stop, :] = torch.matmul(probs, values[..., :visible, :])
    return out.reshape(batch, heads, n_q, -1).transpose(1, 2).contiguous()
