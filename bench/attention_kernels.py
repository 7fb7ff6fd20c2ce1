"""One attention layer of self-extend and dual-chunk against plain SDPA: where the time goes, in CPU time.

    python bench/attention_kernels.py [--lengths 8192 16384] [--threads 1]
    python bench/attention_kernels.py --masks [--lengths 16384 65536 131072] [--grid-up-to 16384] [--threads 1]
    python bench/attention_kernels.py --passes [--lengths 16384] [--threads 1]

Random queries, keys and values at SmolLM2-135M's attention shape (9 query heads on 3 key heads, head_dim 64,
float32), the factor-2 defaults (self-extend G = 4, W = 1024; dual-chunk chunk_size 6144, local_window 512). For
each length: SDPA with `is_causal` (what transformers' SDPA runs for an unpadded prefill), then
`kernels.remapped_attention` on the fused path, split into the fused-kernel calls and everything else (rotations,
masks, the log-sum-exp merge); then a decoding step (one query over `length` keys, the moved keys held in a store
as on a KV cache) against SDPA's. Times are CPU seconds of this process (`time.process_time`, all threads), the
best of `--repeats`, so other jobs on a shared machine disturb them less than wall time; ratios are against SDPA.

`--masks` (issue 43 §3): the block masks of the passes path (the FlexAttention primitive's `prepare`, closed form:
`passes.band_blocks`) of every pass of each method for a whole prompt of each length, Llama-3.2-1B's original
length 8192 with the defaults of factor max(2, length / 8192) (self-extend W = 1024 and its default G, dual-chunk
chunk_size 6144, local_window 512). Per method: CPU and wall seconds to build all its masks, the first build (fresh
memory) and the best of `--repeats`; the blocks the kernel visits (partial + full, summed over the passes) against
a causal mask's; and, up to `--grid-up-to`, the same masks from torch's `create_block_mask` evaluating `mask_mod`
on the whole grid (what the primitive did before), with a check that both give the same blocks.
Goal: all of a method's masks at 128k in at most 50 ms.

`--passes` (issue 43 §3): one layer's prefill on the passes path (the CUDA decomposition) with the CPU kernel
primitive, bfloat16, 8 query heads on 8 key heads, head_dim 64 (smaller than SmolLM2's 9/3 so that the dense
masks of this CPU stand-in fit: 0.5 GiB a pass at 16k), the same method defaults as `--masks`: CPU seconds in the
rotations (the passes' queries, the moved keys), the log-sum-exp merge, the masks and the primitive's calls, next
to SDPA `is_causal` on the same inputs. The share that counts for the GPU is rotations + merge against SDPA (the
primitive here scores every pair under a dense mask; FlexAttention skips the empty blocks).
"""

from __future__ import annotations

import argparse
import time

import torch

from rope_extend.attention import kernels, maps
from rope_extend.attention.positions import Positions


def cpu_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


SPENT = [0.0, 0]  # CPU seconds and calls of the fused kernel


def counting(kernel):
    def counted(*args, **kwargs):
        started = time.process_time()
        result = kernel(*args, **kwargs)
        SPENT[0] += time.process_time() - started
        SPENT[1] += 1
        return result

    return counted


def method_row(name, mapping, q, k, v, inv_freq, base, step, repeats):
    n = q.shape[2]
    pos = torch.arange(n)[None]
    memo: dict = {}

    def prefill():
        kernels.remapped_attention(q, k, v, Positions.of(pos), None, 0.125, mapping, inv_freq, memo=memo)

    prefill()  # the masks and rotation tables, built once per forward and shared by its layers
    SPENT[:] = [0.0, 0]
    total = cpu_time(prefill, repeats)
    fused_s, calls = SPENT[0] / repeats, SPENT[1] // repeats
    store: dict = {}
    kernels.remapped_attention(q[:, :, -2:-1], k[:, :, :-1], v[:, :, :-1], Positions.of(pos[:, :-1]), None, 0.125,
                               mapping, inv_freq, memo=memo, key_store=store)
    held = dict(store)

    def decode():
        for _ in range(20):
            store.clear()
            store.update(held)
            kernels.remapped_attention(q[:, :, -1:], k, v, Positions.of(pos), None, 0.125, mapping, inv_freq,
                                       memo=memo, key_store=store)

    dstep = cpu_time(decode, repeats) / 20
    print(f"{n:>6} {name:<12} prefill {total:7.3f} s ({total / base:.2f}x; fused kernel {fused_s:.3f} s in {calls} "
          f"calls, the rest {total - fused_s:.3f} s)  decode step {1000 * dstep:6.2f} ms ({dstep / step:.2f}x)",
          flush=True)


def timed(fn, repeats: int) -> tuple[tuple[float, float], tuple[float, float], object]:
    """((CPU s, wall s) of the first call, (CPU s, wall s) of the best of `repeats` calls, the last result)."""
    runs, result = [], None
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        result = fn()
        runs.append((time.process_time() - cpu, time.perf_counter() - wall))
    return runs[0], min(runs), result


def mask_rows(lengths: list[int], repeats: int, grid_up_to: int) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    from rope_extend.attention import passes, primitives
    from rope_extend.methods.self_extend import default_group

    original, window = 8192, 1024
    flex = primitives.FlexPrimitive(compiled=False)
    for n in lengths:
        n_b = -(-n // passes.BLOCK)
        causal = n_b * (n_b + 1) // 2
        methods = {"self-extend": maps.SelfExtendMap(default_group(n, original, window), window),
                   "dual-chunk": maps.DualChunkMap(6144, 512)}
        for name, mapping in methods.items():
            plan = mapping.passes(0, 0, "cpu")
            first, best, masks = timed(lambda plan=plan, n=n: [flex.prepare(p, n, n, "cpu") for p in plan], repeats)
            visited = sum(int(m.kv_num_blocks.sum() + m.full_kv_num_blocks.sum()) for m in masks)
            text = (f"{n:>7} {name:<12} {mapping}  closed form: first {1000 * first[0]:7.1f} ms CPU "
                    f"({1000 * first[1]:7.1f} wall), best {1000 * best[0]:6.1f} ms CPU ({1000 * best[1]:6.1f} wall) "
                    f"for {len(plan)} masks; blocks visited {visited / causal:.4f}x causal")
            if n <= grid_up_to:
                grid_first, _, grid = timed(lambda plan=plan, n=n: [create_block_mask(p.mask_mod, None, None, n, n,
                                                                                 device="cpu") for p in plan], 1)
                same = all(torch.equal(a.to_dense(), b.to_dense()) for a, b in zip(masks, grid))
                text += f"; grid (create_block_mask) {grid_first[0]:.2f} s CPU, same blocks: {same}"
            print(text, flush=True)


def passes_rows(lengths: list[int], repeats: int) -> None:
    from rope_extend.attention import passes, primitives
    from rope_extend.methods.self_extend import default_group

    spent: dict = {}

    def timing(owner, name, label):
        original = getattr(owner, name)

        def timed_call(*args, **kwargs):
            started = time.process_time()
            result = original(*args, **kwargs)
            spent[label] = spent.get(label, 0.0) + time.process_time() - started
            return result

        setattr(owner, name, timed_call)

    primitive = primitives.CpuKernelPrimitive()
    timing(passes, "_pass_queries", "rotate queries")
    timing(passes, "merge", "merge")
    timing(kernels, "moved_keys", "move keys")
    timing(primitive, "prepare", "masks")
    timing(primitive, "masked", "primitive")
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 64, 2).float() / 64))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for n in lengths:
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, 64, generator=generator).to(torch.bfloat16) for _ in range(3))
        pos = torch.arange(n)[None]
        base = cpu_time(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, scale=0.125), repeats)
        print(f"{n:>6} sdpa is_causal {base:.3f} s CPU", flush=True)
        methods = {"self-extend": maps.SelfExtendMap(default_group(n, 8192, 1024), 1024),
                   "dual-chunk": maps.DualChunkMap(6144, 512)}
        for name, mapping in methods.items():
            best = None
            for _ in range(repeats):
                spent.clear()
                started = time.process_time()
                kernels.remapped_attention(q, k, v, Positions.of(pos), None, 0.125, mapping, inv_freq, memo={}, key_store={},
                                           path="passes", primitive=primitive)
                total = time.process_time() - started
                if best is None or total < best[0]:
                    best = (total, dict(spent))
            total, parts = best
            moved = sum(parts.get(label, 0.0) for label in ("rotate queries", "move keys", "merge"))
            print(f"{n:>6} {name:<12} passes prefill {total:.3f} s CPU: "
                  + ", ".join(f"{label} {seconds:.3f} s" for label, seconds in parts.items())
                  + f"; rotations + merge {moved:.3f} s = {100 * moved / total:.1f} % of it, "
                  f"{100 * moved / base:.1f} % of SDPA", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--passes", action="store_true", help="one layer's passes-path prefill, where the time goes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--masks", action="store_true", help="the passes' block masks: closed form vs the grid")
    parser.add_argument("--grid-up-to", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.masks:
        mask_rows(args.lengths or [16384, 65536, 131072], max(args.repeats, 3), args.grid_up_to)
        return
    if args.passes:
        passes_rows(args.lengths or [16384], args.repeats)
        return
    args.lengths = args.lengths or [8192, 16384]
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, 64, 2).float() / 64))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    counted = counting(kernels.fused_kernel())
    kernels.fused_kernel = lambda: counted
    for n in args.lengths:
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(1, 9, n, 64, generator=generator)
        k, v = torch.randn(1, 3, n, 64, generator=generator), torch.randn(1, 3, n, 64, generator=generator)
        base = cpu_time(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, enable_gqa=True, scale=0.125),
                        args.repeats)
        step = cpu_time(lambda q=q, k=k, v=v: [sdpa(q[:, :, -1:], k, v, enable_gqa=True, scale=0.125)
                                               for _ in range(20)], args.repeats) / 20
        print(f"{n:>6} sdpa         prefill {base:7.3f} s  decode step {1000 * step:6.2f} ms", flush=True)
        method_row("self-extend", maps.SelfExtendMap(4, 1024), q, k, v, inv_freq, base, step, args.repeats)
        method_row("dual-chunk", maps.DualChunkMap(6144, 512), q, k, v, inv_freq, base, step, args.repeats)


if __name__ == "__main__":
    main()
