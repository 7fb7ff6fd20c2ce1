"""self-extend and dual-chunk against plain SDPA with YaRN: prefill time, peak RSS and decode step, side by side.

    python bench/attention_methods.py [--lengths 4096 16384] [--decode 8] [--threads 2] [--results FILE]

Each (method, length) runs in a fresh child process (SmolLM2-135M, float32, attn_implementation="sdpa", factor 2
specs with the methods' defaults, factor max(2, length / L); self-extend and dual-chunk on top of the original RoPE): one prefill of `length`
random tokens with the KV cache on (logits of the last token only, as `generate` does), then `--decode` single-token steps with the cache (the median step). Peak RSS
is the child's (model + KV cache + activations). Ratios are against YaRN at the same length, of wall time and of
CPU time (`time.process_time`, all threads: less sensitive to other jobs on a shared machine).
Goals (issue 19): prefill at 16k <= 1.6x, peak RSS at 32k <= 1.3x, decode step at 16k <= 1.3x.

`--results FILE` makes a run resumable: each finished child's result is appended to FILE (one JSON object a line)
and a rerun with the same FILE skips what it holds, so a long run (32k is minutes per child on 2 cores) survives an
interruption. Each row records the 1-minute load average before and after its child (`os.getloadavg`): on a shared
machine, read the times against it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from common import demo_model, run_child

CHILD = r"""
import json, statistics, sys, time, warnings
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from rope_extend import patch_model
path, method, length, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    factor = max(2.0, (length + steps) / model.config.max_position_embeddings)
    report = patch_model(model, method=method, factor=factor)
ids = torch.randint(100, 40000, (1, length + steps), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    cache = DynamicCache(config=model.config)
    started, cpu = time.perf_counter(), time.process_time()
    model(ids[:, :length], cache=cache, use_cache=True, logits_to_keep=1)  # as generate() prefills
    prefill, prefill_cpu = time.perf_counter() - started, time.process_time() - cpu
    times, cpus = [], []
    for t in range(length, length + steps):
        started, cpu = time.perf_counter(), time.process_time()
        model(ids[:, t : t + 1], cache=cache, use_cache=True)
        times.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
spec = {k: v for k, v in report.spec.method_params().items()}
print(json.dumps({"prefill_s": prefill, "prefill_cpu_s": prefill_cpu, "decode_s": statistics.median(times),
                  "decode_cpu_s": statistics.median(cpus), "factor": factor, "spec": spec}))
"""

METHODS = ("yarn", "self-extend", "dual-chunk")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--decode", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--results", help="append each child's result here and skip those already in it (resume)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    path = demo_model()
    done = {}
    if args.results and Path(args.results).exists():
        for line in Path(args.results).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["length"], r["method"], r["decode_steps"], r["threads"])] = r
    rows = []
    for length in args.lengths:
        results = {}
        for m in ["yarn", *[m for m in args.methods if m != "yarn"]]:
            held = done.get((length, m, args.decode, args.threads))
            if held is None:
                load_before = os.getloadavg()[0]
                held = run_child(CHILD, str(path), m, str(length), str(args.decode), str(args.threads))
                held.update(length=length, method=m, decode_steps=args.decode, threads=args.threads,
                            load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2))
                if args.results:
                    with open(args.results, "a") as handle:
                        handle.write(json.dumps(held) + "\n")
            results[m] = held
        base = results["yarn"]
        for method, r in results.items():
            row = {
                "length": length, "method": method, "spec": r["spec"],
                "prefill_s": round(r["prefill_s"], 2), "prefill_ratio": round(r["prefill_s"] / base["prefill_s"], 3),
                "peak_rss_mib": round(r["peak_rss_mib"]), "rss_ratio": round(r["peak_rss_mib"] / base["peak_rss_mib"], 3),
                "decode_ms": round(1000 * r["decode_s"], 1), "decode_ratio": round(r["decode_s"] / base["decode_s"], 3),
                "prefill_cpu_ratio": round(r["prefill_cpu_s"] / base["prefill_cpu_s"], 3),
                "decode_cpu_ratio": round(r["decode_cpu_s"] / base["decode_cpu_s"], 3),
                "load": f"{r.get('load_before', float('nan')):.1f}-{r.get('load_after', float('nan')):.1f}",
            }
            rows.append(row)
            print(f"{length:>6} {method:<12} prefill {row['prefill_s']:8.2f} s ({row['prefill_ratio']:.2f}x)  "
                  f"peak RSS {row['peak_rss_mib']:6d} MiB ({row['rss_ratio']:.2f}x)  decode {row['decode_ms']:7.1f} ms "
                  f"({row['decode_ratio']:.2f}x)  CPU-time ratios prefill {row['prefill_cpu_ratio']:.2f}x decode "
                  f"{row['decode_cpu_ratio']:.2f}x  load {row['load']}  {row['spec']}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
