"""Attention-level extension methods (self-extend, dual-chunk): the heavy parts, imported lazily.

- `maps`: the position maps (`SelfExtendMap`, `DualChunkMap`), log-n, and the rotations that move rotated queries
  and keys to mapped positions; every path reads them.
- `kernels`: `remapped_attention`, which picks a path per call (`select_path`): the fused CPU path, a query-blocked
  attention that re-rotates the already-rotated queries and keys to the mapped positions (rotations compose) and
  merges the maps into one softmax: by log-sum-exp over key segments, each one call of torch's fused CPU attention
  kernel (the common case), or per (query, key) pair (masks, padding, softcap, other devices), never holding more
  than one block of scores.
- `passes`, `primitives`: the whole-sequence passes path (CUDA's default): each position map one attention pass
  with a block mask (FlexAttention compiled on CUDA; the CPU kernel or eager FlexAttention in tests), merged by
  log-sum-exp; decoding steps on contiguous key slices.
- `runtime`: how a patched model reaches the kernel. A dispatcher in transformers' attention-function registry
  (eager and SDPA; unpatched modules go to the original function untouched), a forward pre-hook per attention
  module that records the position of every key in the KV cache alongside it, and the handles that undo both.

`rope_extend.methods.self_extend` / `dual_chunk` import this package only when a model is patched, so listing
methods or parsing a spec does not import it.
"""
