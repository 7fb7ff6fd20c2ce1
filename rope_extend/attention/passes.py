"""The passes path: each method as a few whole-sequence attention passes, merged exactly by log-sum-exp.

For contiguous positions (the queries are the last n_q of n_k keys at positions first .. first + n_k - 1, every
batch row alike, no padding), each (query, key) pair of a method uses exactly one of its sub-maps, and the pairs of
one sub-map form a simple region of the (query, key) plane. A *pass* (`Pass`) is one such region over the whole
sequence; each position map lists its own (`PositionMap.passes`, in `maps/`):

- which queries: the model's rotated queries moved by the pass's query shift (None: as the model rotated them);
- which keys: the model's keys, or the keys moved by the map's key shift (`kernels.moved_keys`, kept on the KV
  cache across decoding steps);
- which pairs: a band (`band_mask`: one FlexAttention-style `mask_mod(b, h, q_idx, kv_idx)` for every pass of
  every method, its numbers closed over as tensors, so a compiled kernel does not recompile per pass, offset or
  window), and the same region as key position ranges per query position (`key_range`, what a decoding step
  slices). SelfExtend's, dual chunk attention's and STRING's passes are described in their map modules.

Each pass runs one call of a primitive (`primitives.py`: FlexAttention compiled on CUDA, the fused CPU kernel or
eager FlexAttention for tests) that returns its output and log-sum-exp; the outputs merge exactly by their
log-sum-exps, the softmax over the union of the passes' keys. A query a pass does not see has log-sum-exp -inf
and weight 0. With block-sparse masks the passes cost about one causal attention: the neighbour pass reads about
W keys per query, the grouped pass the causal rest.

The block masks come from each pass's band in closed form (`band_rows`, `band_blocks`): integer work per query row
and per block, never the mask evaluated on the n_q x n_k grid.

A decoding step (one query) sees, through each pass, one contiguous range of keys (self-extend: its last W keys and
the rest; dual chunk: its own chunk, the previous chunk and the older ones; STRING: its last S keys and the rest).
It runs the primitive's `decode` on those slices (one softmax over their union: no mask, no compilation per cache
length, no re-rotated or cast cache), with every position a Python int, so nothing is read back from the device.
The moved keys are rotated when a moved pass first needs them, in batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .rotations import log_n_factor, rotate, rotation

ROTATE_QUERIES = 8192  # queries rotated per step (bounds the float32 temporaries at long prompts)
MERGE_QUERIES = 8192  # queries merged per step (likewise)
PLANS_KEPT = 16  # prepared masks kept in the memo (one per prompt length and offset), cleared beyond this


@dataclass(frozen=True)
class Pass:
    name: str
    query_shift: Callable[[torch.Tensor], torch.Tensor] | None  # query positions -> shift; None: as rotated
    moved_keys: bool  # keys moved by the map's key shift, else as the model rotated them
    band: tuple[int, int, int, int, int]  # band_mask's (q0, k0, div, lo, hi): the pairs of this pass
    key_range: Callable[[int], tuple[int, int]]  # a query position -> [lo, hi) key positions it sees here
    device: object = None

    @functools.cached_property
    def mask_mod(self) -> Callable:
        """(b, h, q_idx, kv_idx) -> bool, built on first use (a decoding step slices by key_range instead, and
        making its tensors would copy to the device)."""
        return band_mask(*self.band, self.device)


FAR = 1 << 62  # "no upper bound" for a band
BLOCK = 128  # FlexAttention's default sparse block (queries and keys)


def band_mask(q0: int, k0: int, div: int, lo: int, hi: int, device):
    """The mask_mod of every pass: causal pairs whose u = (p_i // div) - (p_j // div) lies in [lo, hi), positions
    p_i = q0 + q_idx, p_j = k0 + kv_idx. div = 1 gives distance bands (self-extend), div = s chunk gaps (dual
    chunk). One function for every pass and method, with every number a tensor: a compiled kernel keeps one entry
    for all of them (it would compile again for each distinct function, or each Python number closed over, and
    torch.compile gives up after 8 entries per function). FlexAttention evaluates it only inside the partial
    blocks of `band_block_mask`; `band_rows` is the same band in closed form."""
    q_base, k_base, div_t, lo_t, hi_t = (torch.tensor(x, device=device) for x in (q0, k0, div, lo, hi))

    def mask_mod(b, h, q_idx, kv_idx):
        q_p, k_p = q_base + q_idx, k_base + kv_idx
        u = q_p // div_t - k_p // div_t
        return (k_p <= q_p) & (u >= lo_t) & (u < hi_t)

    return mask_mod


def band_rows(band, n_q: int, n_k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The band's pairs as one key-index range [lo, hi) per query row (int64 [n_q] each, lo >= hi: none): the keys
    p_j with p_j // div in (p_i // div - hi, p_i // div - lo] and p_j <= p_i, i.e. positions
    [(c - hi + 1)·div, min((c - lo + 1)·div, p_i + 1)) with c = p_i // div. One division per row, none per pair."""
    q0, k0, div, lo, hi = band
    p = torch.arange(q0, q0 + n_q, device=device)
    c = p // div if div != 1 else p
    start = torch.full_like(p, k0) if hi >= FAR else (c - (hi - 1)) * div
    stop = torch.minimum((c - (lo - 1)) * div, p + 1)
    return (start - k0).clamp_(0, n_k), (stop - k0).clamp_(0, n_k)


def band_dense(band, n_q: int, n_k: int, device) -> torch.Tensor:
    """bool [n_q, n_k]: the band's pairs (what `band_mask` gives on every pair), from `band_rows` by comparisons."""
    lo, hi = band_rows(band, n_q, n_k, device)
    keys = torch.arange(n_k, device=device)
    return (keys >= lo[:, None]) & (keys < hi[:, None])


def band_blocks(band, n_q: int, n_k: int, block: int = BLOCK, device=None):
    """The band as FlexAttention's block structure: (kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices), int32 [1, 1, query blocks] and [1, 1, query blocks, key blocks], what `create_block_mask`
    gives for `band_mask` (blocks padded past n_q / n_k count as partial there, so they are partial here too).

    The rows' ranges grow with the query position (both ends nondecreasing, consecutive rows' ranges overlap or
    touch), so in each block of queries the key blocks the band touches form one range [e0, e1) (from the first
    non-empty row's start to the last row's stop) and the key blocks it fills for every row one range [f0, f1)
    inside it (from the last row's start to the first row's stop; none for an incomplete block of queries): the
    partial blocks are [e0, f0) and [f1, e1). Integer work per row and per block, none per pair."""
    lo, hi = band_rows(band, n_q, n_k, device)
    n_qb, n_kb = -(-n_q // block), -(-n_k // block)
    pad = n_qb * block - n_q
    seen = hi > lo
    first = torch.nn.functional.pad(torch.where(seen, lo, n_k), (0, pad), value=n_k).view(n_qb, block).amin(1)
    last = torch.nn.functional.pad(torch.where(seen, hi, 0), (0, pad), value=0).view(n_qb, block).amax(1)
    touched = last > first
    e0 = torch.where(touched, first // block, 0)
    e1 = torch.where(touched, (last + block - 1) // block, 0)
    starts = torch.arange(n_qb, device=lo.device) * block
    row_first, row_last = starts, (starts + block - 1).clamp_(max=n_q - 1)
    f0 = (lo[row_last] + block - 1) // block
    f1 = hi[row_first] // block
    whole = (f1 > f0) & (starts + block <= n_q)
    f0, f1 = torch.where(whole, f0, e0), torch.where(whole, f1, e0)
    before = f0 - e0
    partial, full = before + (e1 - f1), f1 - f0
    # partial blocks: e0 .. f0 - 1, then f1 .. e1 - 1; in a complete block of queries each side spans at most the
    # rows' spread of range starts (or stops), under block + div keys: written into the first `wide` columns
    wide = min(n_kb, 2 * ((2 * block + (div if (div := band[2]) > 1 else 0) - 1) // block + 1))
    j = torch.arange(n_kb, dtype=torch.int32, device=lo.device)
    head = j[:wide] + torch.where(j[:wide] < before[:, None], e0[:, None], (f1 - before)[:, None])
    indices = torch.zeros(n_qb, n_kb, dtype=torch.int32, device=lo.device)  # past a row's count: never read
    indices[:, :wide] = head.clamp_(max=n_kb - 1)
    if n_q % block:  # an incomplete last block of queries: every touched key block is partial, e0 .. e1 - 1
        indices[-1] = (j + e0[-1]).clamp_(max=n_kb - 1)
    full_indices = (j + f0.to(torch.int32)[:, None]).clamp_(max=n_kb - 1)
    shape = (1, 1, n_qb)
    return (partial.to(torch.int32).view(shape), indices.view(*shape, n_kb), full.to(torch.int32).view(shape),
            full_indices.view(*shape, n_kb))


def _plan(mapping, q0, k0, n_q, n_k, primitive, device, memo):
    """[(pass, prepared mask or None for a decoding step)] without the passes no query sees, kept in the memo for
    the other layers of the forward (the masks depend only on the positions and shapes)."""
    key = ("passes", mapping, primitive.name, q0, k0, n_q, n_k, str(device))
    plans = memo.setdefault("plans", {}) if memo is not None else {}
    if key not in plans:
        if len(plans) >= PLANS_KEPT:
            plans.clear()
        if n_q > 1:  # one prefill shape per forward: drop the block masks of earlier ones (MiBs each at 128k)
            for old in [k for k in plans if k[5] > 1]:
                del plans[old]
        plan = []
        last = q0 + n_q - 1  # the last query sees the most keys of every pass (ranges grow with the position)
        for p in mapping.passes(q0, k0, device):
            lo, hi = p.key_range(last)
            if min(hi, last + 1) <= max(lo, k0):
                continue
            plan.append((p, None if n_q == 1 else primitive.prepare(p, n_q, n_k, device)))
        plans[key] = plan
    return plans[key]


def _pass_queries(query, p, q0, factor, mapping, inv_freq, memo):
    """The queries moved by the pass's query shift (and log-n scaled), rotated a slice of queries at a time. The
    rotation tables are kept for the other layers by (first position, count): positions are contiguous here, so
    no comparison of position tensors (a device sync per layer) is needed."""
    if p.query_shift is None:
        return query if factor is None else query * factor
    n_q = query.shape[2]
    key = ("pass-query", mapping, p.name)
    span = (q0, n_q, str(query.device))
    entry = memo.get(key) if memo is not None else None
    if entry is not None and entry[0] == span:
        cos, sin = entry[1], entry[2]
    else:
        cos, sin = rotation(p.query_shift(torch.arange(q0, q0 + n_q, device=query.device)[None]), inv_freq)
        if memo is not None:
            memo[key] = (span, cos, sin)
    if n_q <= ROTATE_QUERIES:
        moved = rotate(query, cos, sin)
        return moved if factor is None else moved * factor
    out = torch.empty_like(query)
    for a in range(0, n_q, ROTATE_QUERIES):
        b = a + ROTATE_QUERIES
        moved = rotate(query[:, :, a:b], cos[:, :, a:b], sin[:, :, a:b])
        out[:, :, a:b] = moved if factor is None else moved * factor[a:b]
    return out


def _log_n(q0: int, n_q: int, original: int, dtype, device, memo) -> torch.Tensor:
    """log-n's factor per query [n_q, 1] in the queries' dtype, kept for the other layers by (position, count)."""
    span = (q0, n_q, original, dtype, str(device))
    entry = memo.get("log-n") if memo is not None else None
    if entry is not None and entry[0] == span:
        return entry[1]
    factor = log_n_factor(torch.arange(q0, q0 + n_q, device=device)[None], original)[0][:, None].to(dtype)
    if memo is not None:
        memo["log-n"] = (span, factor)
    return factor


def passes_attention(query, key, value, move, first, n_k, scaling, mapping, inv_freq, log_n_original,
                     primitive, memo) -> torch.Tensor:
    """Attention output [B, n_q, Hq, Dv] for contiguous positions (see the module docstring): query [B, Hq, n_q, D]
    rotated at first + n_k - n_q .., key/value [B, Hkv, >= n_k, D], `move(needed)` the keys moved by the key shift
    (at least the first `needed`). Every position is a Python int here: nothing is read from a tensor."""
    n_q = query.shape[2]
    q0 = first + n_k - n_q
    factor = _log_n(q0, n_q, log_n_original, query.dtype, query.device, memo) if log_n_original else None
    keys = key if key.shape[2] == n_k else key[:, :, :n_k]
    values = value if value.shape[2] == n_k else value[:, :, :n_k]
    plan = _plan(mapping, q0, first, n_q, n_k, primitive, query.device, memo)
    last = q0 + n_q - 1
    needed = max([min(p.key_range(last)[1], last + 1) - first for p, _ in plan if p.moved_keys], default=0)
    moved = move(needed) if needed > 0 else None
    if n_q == 1:
        return _decode(query, keys, values, moved, plan, q0, first, factor, scaling, mapping, inv_freq, primitive,
                       memo)
    parts = [primitive.masked(_pass_queries(query, p, q0, factor, mapping, inv_freq, memo),
                              moved if p.moved_keys else keys, values, prepared, scaling) for p, prepared in plan]
    return merge(parts)


def _decode(query, keys, values, moved, plan, q0, first, factor, scaling, mapping, inv_freq, primitive, memo):
    """A decoding step: each pass sees one contiguous range of keys; the moved queries of all passes come from one
    matmul with the step's rotation matrices (`_step_rotation`, shared by the layers), and the primitive's `decode`
    runs one softmax over the union of the slices."""
    slices = []
    for p, _ in plan:
        lo, hi = p.key_range(q0)
        lo, hi = max(lo, first) - first, min(hi, q0 + 1) - first
        if hi > lo:
            slices.append((lo, hi, p))
    slices.sort(key=lambda part: part[0])
    shifted = [p for _, _, p in slices if p.query_shift is not None]
    if factor is not None:
        query = query * factor
    moved_q = {}
    if shifted:
        matrix = _step_rotation(shifted, q0, query.shape[-1], mapping, inv_freq, memo)
        stacked = torch.matmul(query.float(), matrix).to(query.dtype)
        moved_q = dict(zip([p.name for p in shifted], stacked.view(*query.shape[:3], len(shifted), -1).unbind(3)))
    return primitive.decode([moved_q.get(p.name, query) for _, _, p in slices],
                            [(moved if p.moved_keys else keys)[:, :, lo:hi] for lo, hi, p in slices],
                            [(lo, hi) for lo, hi, _ in slices], values, scaling)


def _step_rotation(shifted, q0: int, dim: int, mapping, inv_freq, memo) -> torch.Tensor:
    """[dim, K·dim] float32: side by side, the matrices that rotate a row vector (transformers' rotate_half layout,
    the first rotary dims) by each of the K passes' query shifts at position q0, so one matmul moves a query to
    every pass. Kept in `memo` for the other layers of the step; built by one matmul from `_rotation_basis`."""
    key = ("step-rotation", mapping, q0, tuple(p.name for p in shifted), dim, str(inv_freq.device))
    entry = memo.get("step-rotation") if memo is not None else None
    if entry is not None and entry[0] == key:
        return entry[1]
    position = torch.arange(q0, q0 + 1, device=inv_freq.device)[None]
    shifts = torch.cat([p.query_shift(position) for p in shifted], dim=1)[0]  # [K]
    angles = shifts.to(torch.float64)[:, None] * inv_freq.to(torch.float64)  # [K, r/2], as maps.rotation
    fixed, basis = _rotation_basis(len(shifted), dim, inv_freq.shape[0], str(inv_freq.device))
    coefficients = torch.cat((angles.cos(), angles.sin())).float().view(1, -1)
    matrix = torch.addmm(fixed, coefficients, basis).view(dim, -1)
    if memo is not None:
        memo["step-rotation"] = (key, matrix)
    return matrix


@functools.cache
def _rotation_basis(k: int, dim: int, half: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The constant parts of K rotation matrices side by side, [dim, K·dim] flattened: R_k = fixed + Σ_f cos_kf·C_f
    + sin_kf·S_f, with x @ R_k = x·cos + rotate_half(x)·sin in the first 2·half dims (the rest pass through):
    (fixed [1, dim·K·dim], basis [2·K·half, dim·K·dim]), coefficients ordered (cos of every k and f, sin of
    every k and f)."""
    rdim = 2 * half
    fixed = torch.zeros(dim, k, dim, device=device)
    cos = torch.zeros(k, half, dim, k, dim, device=device)
    sin = torch.zeros(k, half, dim, k, dim, device=device)
    for m in range(k):
        for j in range(rdim, dim):
            fixed[j, m, j] = 1.0
        for f in range(half):
            cos[m, f, f, m, f] = cos[m, f, f + half, m, f + half] = 1.0
            sin[m, f, f + half, m, f] = -1.0  # rotate_half: column f takes -x[f + half], column f + half x[f]
            sin[m, f, f, m, f + half] = 1.0
    return fixed.view(1, -1), torch.cat((cos.view(k * half, -1), sin.view(k * half, -1)))


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The passes' outputs [B, Hq, n, Dv] merged by their log-sum-exps [B, Hq, n] -> [B, n, Hq, Dv]: each weighted
    by exp(lse - logsumexp(all lse)), in float32, a slice of queries at a time. A pass's -inf rows weigh 0."""
    out0 = parts[0][0]
    if len(parts) == 1:
        return out0.transpose(1, 2).contiguous()
    batch, heads, n, dv = out0.shape
    total = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    result = out0.new_empty(batch, n, heads, dv)
    for a in range(0, n, MERGE_QUERIES):
        b = min(n, a + MERGE_QUERIES)
        acc = None
        for out, lse in parts:
            # nan_to_num: a row no pass sees (cannot happen causally) has total -inf and weight 0, not NaN
            weight = torch.exp(lse[..., a:b] - total[..., a:b]).nan_to_num_(0.0)[..., None]
            piece = out[..., a:b, :]
            # float32 accumulation; the passes' outputs stay in their dtype (addcmul_ promotes), no float copy
            acc = piece.float().mul_(weight) if acc is None else acc.addcmul_(piece, weight)
        result[:, a:b] = acc.transpose(1, 2)
    return result
