"""One attention layer of self-extend and dual-chunk against plain SDPA: where the time goes, in CPU time.

    python bench/attention_kernels.py [--lengths 8192 16384] [--threads 1]

Random queries, keys and values at SmolLM2-135M's attention shape (9 query heads on 3 key heads, head_dim 64,
float32), the factor-2 defaults (self-extend G = 4, W = 1024; dual-chunk chunk_size 6144, local_window 512). For
each length: SDPA with `is_causal` (what transformers' SDPA runs for an unpadded prefill), then
`kernels.remapped_attention` on the fused path, split into the fused-kernel calls and everything else (rotations,
masks, the log-sum-exp merge); then a decoding step (one query over `length` keys, the moved keys held in a store
as on a KV cache) against SDPA's. Times are CPU seconds of this process (`time.process_time`, all threads), the
best of `--repeats`, so other jobs on a shared machine disturb them less than wall time; ratios are against SDPA.
"""

from __future__ import annotations

import argparse
import time

import torch

from rope_extend.attention import kernels


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
        kernels.remapped_attention(q, k, v, pos, pos, None, 0.125, mapping, inv_freq, memo=memo)

    prefill()  # the masks and rotation tables, built once per forward and shared by its layers
    SPENT[:] = [0.0, 0]
    total = cpu_time(prefill, repeats)
    fused_s, calls = SPENT[0] / repeats, SPENT[1] // repeats
    store: dict = {}
    kernels.remapped_attention(q[:, :, -2:-1], k[:, :, :-1], v[:, :, :-1], pos[:, -2:-1], pos[:, :-1], None, 0.125,
                               mapping, inv_freq, memo=memo, key_store=store)
    held = dict(store)

    def decode():
        for _ in range(20):
            store.clear()
            store.update(held)
            kernels.remapped_attention(q[:, :, -1:], k, v, pos[:, -1:], pos, None, 0.125, mapping, inv_freq,
                                       memo=memo, key_store=store)

    dstep = cpu_time(decode, repeats) / 20
    print(f"{n:>6} {name:<12} prefill {total:7.3f} s ({total / base:.2f}x; fused kernel {fused_s:.3f} s in {calls} "
          f"calls, the rest {total - fused_s:.3f} s)  decode step {1000 * dstep:6.2f} ms ({dstep / step:.2f}x)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
        method_row("self-extend", kernels.SelfExtendMap(4, 1024), q, k, v, inv_freq, base, step, args.repeats)
        method_row("dual-chunk", kernels.DualChunkMap(6144, 512), q, k, v, inv_freq, base, step, args.repeats)


if __name__ == "__main__":
    main()
