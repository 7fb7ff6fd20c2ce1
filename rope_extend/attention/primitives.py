"""The swappable piece of the passes path (`passes.py`): one attention call that also returns the log-sum-exp.

A primitive runs one pass of a method: queries [B, Hq, n_q, D] against keys and values [B, Hkv, n_k, D] (GQA: Hq a
multiple of Hkv, KV heads never repeated), with the pass's mask given as a FlexAttention-style
`mask_mod(b, h, q_idx, kv_idx) -> bool` (offsets closed over as tensors), and returns the output [B, Hq, n_q, Dv]
in the queries' dtype and the natural-log log-sum-exp of each query's scaled scores [B, Hq, n_q] in float32
(-inf for a query the pass does not see at all; its output row is then ignored by the merge).

- `prepare(pass_, n_q, n_k, device)` turns the pass's band (`passes.Pass.band`) into what `masked` takes (a
  FlexAttention `BlockMask` built in closed form, `passes.band_blocks`, or a dense boolean mask); the passes path
  keeps it for the other layers of the forward.
- `masked(q, k, v, prepared, scale)` runs the pass.
- `unmasked(q, k, v, scale)` runs a pass whose keys every query sees.
- `decode(queries, keys, ranges, values, scale)` runs a decoding step: each pass's query against its contiguous
  slice of the cache, one softmax over their union (`union_attention`), no log-sum-exp merge.

Two primitives:
- `FlexPrimitive`: `torch.nn.attention.flex_attention` over a block mask, so blocks the mask leaves empty are
  skipped (the neighbour pass of self-extend costs about n·W, not n²). Compiled with `torch.compile` on CUDA
  (Triton; fp16/bf16 fast, fp32 supported but slower); eager elsewhere, where torch builds the full score matrix:
  only for tests at small sizes.
- `CpuKernelPrimitive`: torch's fused CPU attention (`aten._scaled_dot_product_flash_attention_for_cpu`, the
  kernel of the CPU fused path) with the pass's mask materialised as a dense [n_q, n_k] mask: test sizes.

`primitive_for(device)` is the one place that picks the primitive by device.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch

from .passes import BLOCK, band_blocks, band_dense

_EAGER_NOTE = "flex_attention called without torch.compile"


def _empty_result(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    return out, torch.full(q.shape[:3], float("-inf"), device=q.device)


@functools.cache
def fused_kernel():
    """torch's fused CPU attention that also returns the log-sum-exp of each query's scores, or None (a torch
    without it, or whose version of it takes no ``attn_mask`` and ``scale``: the general path runs instead)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    try:
        schema = str(op.default._schema) if op is not None else ""
    except AttributeError:
        return None
    return op if "attn_mask" in schema and "scale" in schema else None


def dense_mask(mask_mod, n_q: int, n_k: int, device) -> torch.Tensor:
    """The mask_mod evaluated on every (query, key) pair: bool [n_q, n_k] (the same for every batch row and head)."""
    zero = torch.zeros((), dtype=torch.int64, device=device)
    q_idx = torch.arange(n_q, device=device)[:, None]
    kv_idx = torch.arange(n_k, device=device)[None, :]
    return mask_mod(zero, zero, q_idx, kv_idx).expand(n_q, n_k)


class CpuKernelPrimitive:
    """torch's fused CPU attention with the log-sum-exp; GQA by stacking a key head's query heads along the queries
    (as the CPU fused path does), so KV heads are never repeated."""

    name = "cpu-kernel"

    @staticmethod
    def _kernel():
        kernel = fused_kernel()
        if kernel is None:
            raise RuntimeError("this torch has no aten._scaled_dot_product_flash_attention_for_cpu with attn_mask "
                               "and scale; use FlexPrimitive")
        return kernel

    def prepare(self, pass_, n_q: int, n_k: int, device):
        allowed = band_dense(pass_.band, n_q, n_k, device)
        seen = allowed.any(-1)
        if not bool(seen.any()):
            return None
        return allowed, seen

    def masked(self, q, k, v, prepared, scale: float):
        if prepared is None:
            return _empty_result(q, v)
        allowed, seen = prepared
        # a row that sees nothing would give NaN: let it see everything, then mark its log-sum-exp -inf
        allowed = allowed | ~seen[:, None]
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
        out, lse = self._run(q, k, v, mask, scale)
        return out.masked_fill(~seen[:, None], 0.0), lse.masked_fill(~seen, float("-inf"))  # as FlexAttention

    def unmasked(self, q, k, v, scale: float):
        if k.shape[2] == 0:
            return _empty_result(q, v)
        return self._run(q, k, v, None, scale)

    def decode(self, queries, keys, ranges, values, scale: float):
        """A decoding step over the passes' contiguous key slices (`union_attention`)."""
        return union_attention(queries, keys, ranges, values, scale)

    def _run(self, q, k, v, mask, scale):
        batch, heads, n_q, dim = q.shape
        kv_heads = k.shape[1]
        rep = heads // kv_heads
        stacked = q.reshape(batch, kv_heads, rep * n_q, dim)
        if mask is not None and rep > 1:
            mask = mask.repeat(rep, 1)
        out, lse = self._kernel()(stacked, k.contiguous(), v.contiguous(), attn_mask=mask, scale=scale)
        return out.reshape(batch, heads, n_q, -1), lse.float().reshape(batch, heads, n_q)


@functools.cache
def _flex():
    """(flex_attention, create_block_mask, the keyword arguments that ask for the log-sum-exp, how to read it from
    the second output), or None without FlexAttention. torch >= 2.9 takes `return_aux=AuxRequest(lse=True)` and
    returns an AuxOutput; older ones `return_lse=True` and return the tensor. Both return the natural log."""
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError:
        return None
    if "return_aux" in inspect.signature(module.flex_attention).parameters and hasattr(module, "AuxRequest"):
        return module.flex_attention, module.create_block_mask, {"return_aux": module.AuxRequest(lse=True)}, \
            lambda aux: aux.lse
    return module.flex_attention, module.create_block_mask, {"return_lse": True}, lambda lse: lse


@functools.cache
def _forward_only() -> dict:
    """from_kv_blocks' switch that skips the transposed (backward) indices, where this torch has it (2.7+)."""
    from torch.nn.attention.flex_attention import BlockMask

    return {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters \
        else {}


def flex_available() -> bool:
    return _flex() is not None


@functools.cache
def _compiled_flex():
    """flex_attention compiled once per process (the Triton kernel; a new sequence length after the first one
    makes it dynamic in the length, so prompts of other lengths reuse it)."""
    return torch.compile(_flex()[0])


class FlexPrimitive:
    """FlexAttention over a block mask: compiled on CUDA (`compiled=True`), eager (full scores: tests) otherwise."""

    def __init__(self, compiled: bool):
        if not flex_available():
            raise RuntimeError("this torch has no torch.nn.attention.flex_attention (torch >= 2.5 needed)")
        self.compiled = compiled
        self.name = "flex-compiled" if compiled else "flex-eager"

    def prepare(self, pass_, n_q: int, n_k: int, device):
        """The pass's BlockMask from its band in closed form (`passes.band_blocks`: per block of queries the ranges
        of partial and full key blocks), never evaluating the mask on the n_q x n_k grid; `mask_mod` runs only
        inside the partial blocks. Forward only (no transposed indices for a backward pass)."""
        from torch.nn.attention.flex_attention import BlockMask

        blocks = band_blocks(pass_.band, n_q, n_k, BLOCK, device)
        return BlockMask.from_kv_blocks(*blocks, BLOCK_SIZE=BLOCK, mask_mod=pass_.mask_mod, seq_lengths=(n_q, n_k),
                                        **_forward_only())

    def masked(self, q, k, v, prepared, scale: float):
        flex_attention, _, lse_kwargs, read_lse = _flex()
        function = _compiled_flex() if self.compiled else flex_attention
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*{_EAGER_NOTE}.*")
            out, aux = function(q, k, v, block_mask=prepared, scale=scale, enable_gqa=True, **lse_kwargs)
        return out, read_lse(aux).float()

    def unmasked(self, q, k, v, scale: float):
        """A few queries against contiguous key slices (a decoding step): plain matmuls, GQA by stacking query
        heads along the queries. The step is memory-bound on reading the keys once, which cuBLAS does at full
        bandwidth; no block mask, no compilation per cache length."""
        return math_attention(q, k, v, scale)

    def decode(self, queries, keys, ranges, values, scale: float):
        """A decoding step: one softmax over the passes' key slices of the cache (`union_attention`), matmuls in
        the model's dtype; no block mask, no compilation per cache length."""
        return union_attention(queries, keys, ranges, values, scale)


def math_attention(q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention with its log-sum-exp by matmuls, any device, GQA without repeats: scores in the inputs'
    dtype (the matmuls accumulate in float32 on CPU and CUDA; nothing of k or v is cast), softmax and log-sum-exp
    in float32, the probabilities in v's dtype for the values' matmul."""
    batch, heads, n_q, dim = q.shape
    kv_heads = k.shape[1]
    if k.shape[2] == 0:
        return _empty_result(q, v)
    stacked = q.reshape(batch, kv_heads, heads // kv_heads * n_q, dim)
    scores = torch.matmul(stacked, k.transpose(-1, -2)).float().mul_(scale)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.matmul(torch.exp(scores - lse).to(v.dtype), v)
    return out.reshape(batch, heads, n_q, -1), lse.reshape(batch, heads, n_q)


def union_attention(queries, keys, ranges, values, scale: float) -> torch.Tensor:
    """A decoding step's attention [B, n_q, Hq, Dv] as one softmax over the union of the passes' key slices: pass
    i scores its queries queries[i] [B, Hq, n_q, D] against keys[i] [B, Hkv, n_i, D], the keys ranges[i] = (lo, hi)
    of `values` [B, Hkv, n_k, Dv] (in key order). Scores in the inputs' dtype (no cast of the cache), softmax in
    float32, then one matmul with the values the ranges cover (one slice when they touch, as every method's do):
    the same softmax as the passes merged by log-sum-exp, without the log-sum-exps."""
    batch, heads, n_q, dim = queries[0].shape
    kv_heads = keys[0].shape[1]
    rows, groups = heads // kv_heads * n_q, batch * kv_heads
    # keys on the left, [keys, dim] @ [dim, rows]: a slice of the cache as it lies (CPU's bf16 bmm copies a
    # transposed right operand: ~7x slower at 16k); scores [groups, keys, rows], softmax over the keys
    scores = [torch.bmm(k.reshape(groups, -1, dim), q.reshape(groups, rows, dim).transpose(1, 2))
              for q, k in zip(queries, keys)]
    probs = torch.softmax((torch.cat(scores, dim=1) if len(scores) > 1 else scores[0]).float().mul_(scale), dim=1)
    lo, hi = ranges[0][0], ranges[-1][1]
    if any(a[1] != b[0] for a, b in zip(ranges[:-1], ranges[1:])):
        v = torch.cat([values[:, :, a:b] for a, b in ranges], dim=2)
    else:
        v = values if (lo, hi) == (0, values.shape[2]) else values[:, :, lo:hi]
    out = torch.bmm(probs.transpose(1, 2).to(v.dtype), v.reshape(groups, -1, v.shape[-1]))
    if n_q == 1:
        return out.view(batch, 1, heads, -1)
    return out.view(batch, heads, n_q, -1).transpose(1, 2)


def primitive_for(device: torch.device):
    """The primitive the passes path uses on `device` by default, or None (no fast whole-sequence primitive there:
    the general path runs). CPU takes the fused path by default; this is what a forced `path="passes"` uses."""
    if device.type == "cuda" and flex_available():
        return FlexPrimitive(compiled=True)
    if device.type == "cpu":
        return CpuKernelPrimitive() if fused_kernel() is not None else (FlexPrimitive(False) if flex_available()
                                                                        else None)
    return None
