"""Attention-level extension methods (self-extend, dual chunk attention, STRING): the heavy parts, imported lazily.

- `maps/`: each method's position map, one module each (`self_extend`, `dual_chunk`, `string`), behind one
  contract (`maps.PositionMap`, a `typing.Protocol`): which mapped distance each (query, key) pair sees, the
  shifts that move the model's rotated queries and keys there, the fused path's key segments and the passes path's
  passes. Adding a method is its file in `rope_extend/methods/` and its map here (docs/development.md).
- `positions`: `Positions`, the one form positions take from the runtime to the paths (known on the host, or a
  tensor).
- `rotations`: the rotations that move rotated queries and keys (RoPE rotations compose), and log-n's factor.
- `kernels`: `remapped_attention`, which picks a path per call (`select_path`): the fused CPU path (key segments,
  each one call of torch's fused CPU attention kernel, merged by log-sum-exp), the passes path, or the general path
  (every sub-map scored per block of queries, picked per pair: masks, padding, softcap, other devices), never
  holding more than one block of scores.
- `passes`, `primitives`: the whole-sequence passes path (CUDA's default): each sub-map region one attention pass
  with a block mask (FlexAttention compiled on CUDA; the CPU kernel or eager FlexAttention in tests), merged by
  log-sum-exp; decoding steps on contiguous key slices.
- `runtime`: how a patched model reaches the kernel. A dispatcher in transformers' attention-function registry
  (eager and SDPA; unpatched modules go to the original function untouched), a forward pre-hook per attention
  module that records the positions of every key in the KV cache alongside it (known on the host while the model
  derives them or generate() numbers them), and the handles that undo both.

`rope_extend.methods.self_extend` / `dual_chunk` / `string` import this package only when a model is patched, so
listing methods or parsing a spec does not import it.
"""
