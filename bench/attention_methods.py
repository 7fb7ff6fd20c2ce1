"""self-extend and dual-chunk against plain SDPA with YaRN: prefill time, peak RSS and decode step, side by side.

    python bench/attention_methods.py [--lengths 4096 16384] [--decode 8] [--threads 2] [--results FILE]

Each (method, length) runs in a fresh child process (SmolLM2-135M, float32, attn_implementation="sdpa", factor 2
specs with the methods' defaults, factor max(2, length / L); self-extend and dual-chunk on top of the original RoPE): one prefill of `length`
random tokens with the KV cache on (logits of the last token only, as `generate` does), then `--decode` single-token steps with the cache (the median step). Peak RSS
is the child's (model + KV cache + activations). Ratios are against YaRN at the same length, of wall time and of
CPU time (`time.process_time`, all threads: less sensitive to other jobs on a shared machine).
Goals (issue 19): prefill at 16k <= 1.6x, peak RSS at 32k <= 1.3x, decode step at 16k <= 1.3x.

    python bench/attention_methods.py --device cuda [--lengths 16384 32768 65536 131072] [--decode-length 65536]
    python bench/attention_methods.py --device cpu --synthetic [--lengths 1024 2048]   (the same, small, on CPU)

`--device cuda` (or `--synthetic`) runs in one process on a model of the Llama-3.2-1B shape with random weights
(hidden 2048, 32 query / 8 KV heads, head_dim 64, 4 layers, original length 8192, bfloat16 on CUDA; `--quick`
shrinks it for a CPU smoke run): SDPA + YaRN against self-extend and dual-chunk, each also with log_n, factor
max(2, length / L). Each variant first runs at two other lengths (compilation for dynamic shapes). Per length:
a kernel row (causal FlexAttention, the passes' primitive, against SDPA alone), then per variant the first prefill
at that length (a shape the process has not run: the block masks are built in it; the goals read this one) and the
best of the other `--repeats` (the steady state), on CUDA the peak memory allocated by torch (the maximum over every
repeat and step); at `--decode-length` the median of `--decode` single-token steps. Every forward checks that the
cache holds what it was given and that each layer took the method's path (`counted_calls`), else the row is an
error (`CheckFailed`). On CPU it also runs each attention method forced onto the passes path (the CUDA decomposition, with
the CPU kernel primitive) next to the default fused path. Goals on CUDA (issue 35): prefill <= 1.5x SDPA + YaRN at
64k and 128k, decode step <= 1.3x, peak memory <= 1.2x. `bench/gpu_check.py` calls this and the gpu tests.

`--results FILE` makes a run resumable: each finished child's result is appended to FILE (one JSON object a line)
and a rerun with the same FILE skips what it holds, so a long run (32k is minutes per child on 2 cores) survives an
interruption. Each row records the 1-minute load average before and after its child (`os.getloadavg`): on a shared
machine, read the times against it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from common import demo_model, run_child

CHILD = r"""
import json, statistics, sys, time, warnings
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from rope_extend import patch_model
from rope_extend.compat import GENERATE_CACHE_KEYWORD
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
    model(ids[:, :length], **{GENERATE_CACHE_KEYWORD: cache}, use_cache=True, logits_to_keep=1)  # as generate() prefills
    prefill, prefill_cpu = time.perf_counter() - started, time.process_time() - cpu
    times, cpus = [], []
    for t in range(length, length + steps):
        started, cpu = time.perf_counter(), time.process_time()
        model(ids[:, t : t + 1], **{GENERATE_CACHE_KEYWORD: cache}, use_cache=True)
        times.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
spec = {k: v for k, v in report.spec.method_params().items()}
print(json.dumps({"prefill_s": prefill, "prefill_cpu_s": prefill_cpu, "decode_s": statistics.median(times),
                  "decode_cpu_s": statistics.median(cpus), "factor": factor, "spec": spec}))
"""

METHODS = ("yarn", "self-extend", "dual-chunk")

# --- in-process synthetic bench (CUDA, or CPU at small sizes) ---------------------------------------------------------
LLAMA_1B_SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=64, num_hidden_layers=4, vocab_size=128256, max_position_embeddings=8192,
                      rope_theta=500000.0, tie_word_embeddings=True)
QUICK_SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                   head_dim=32, num_hidden_layers=2, vocab_size=1024, max_position_embeddings=512,
                   rope_theta=10000.0, tie_word_embeddings=True)
VARIANTS = {  # name -> (patch_model keywords, forced attention path or None)
    "yarn": ({"method": "yarn"}, None),
    "self-extend": ({"method": "self-extend"}, None),
    "self-extend+log_n": ({"method": "self-extend", "log_n": True}, None),
    "dual-chunk": ({"method": "dual-chunk"}, None),
    "dual-chunk+log_n": ({"method": "dual-chunk", "log_n": True}, None),
}
CPU_PASSES_VARIANTS = {  # on CPU the default is the fused path: these run the CUDA decomposition there too
    "self-extend [passes]": ({"method": "self-extend"}, "passes"),
    "dual-chunk [passes]": ({"method": "dual-chunk"}, "passes"),
}


def synthetic_model(shape: dict, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**shape, attn_implementation="sdpa")
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


@contextlib.contextmanager
def forced_path(path: str | None):
    """Every call with contiguous positions takes `path` ("passes" on CPU: the CUDA decomposition there)."""
    from rope_extend.attention import kernels

    original = kernels.select_path
    if path is not None:
        kernels.select_path = lambda device, start, case, mapping: path if start is not None else original(
            device, start, case, mapping)
    try:
        yield
    finally:
        kernels.select_path = original


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class CheckFailed(RuntimeError):
    """A row measured something other than what it names (an empty cache, the method's path not taken)."""


class _CountedPrimitive:
    """The primitive a call of the passes path got, its calls counted (`calls`: masked, unmasked, decode)."""

    def __init__(self, inner, calls: dict):
        self.inner, self.name, self.calls = inner, inner.name, calls

    def prepare(self, *args):
        return self.inner.prepare(*args)

    def masked(self, *args):
        self.calls["masked"] += 1
        return self.inner.masked(*args)

    def unmasked(self, *args):
        self.calls["unmasked"] += 1
        return self.inner.unmasked(*args)

    def decode(self, *args):
        self.calls["decode"] += 1
        return self.inner.decode(*args)


@contextlib.contextmanager
def counted_calls():
    """{path chosen -> calls, "masked"/"unmasked"/"decode" -> the passes primitive's calls} for what runs inside: the
    attention methods' path per layer call and the primitive's calls, counted where `kernels.remapped_attention`
    looks them up (`select_path`, `primitive_for`), so a row can assert that its method ran."""
    from collections import Counter

    from rope_extend.attention import kernels

    calls = Counter()
    select, primitive_for = kernels.select_path, kernels.primitive_for

    def counted_select(*args):
        path = select(*args)
        calls[path] += 1
        return path

    def counted_primitive(device):
        primitive = primitive_for(device)
        return None if primitive is None else _CountedPrimitive(primitive, calls)

    kernels.select_path, kernels.primitive_for = counted_select, counted_primitive
    try:
        yield calls
    finally:
        kernels.select_path, kernels.primitive_for = select, primitive_for


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def _method_ran(calls, before: dict, layers: int, passes_path: bool, decoding: bool, what: str) -> None:
    """Every layer's attention took the method's path in the forward just run, and on the passes path the
    primitive ran (its masked call in a prefill, its decode call on the cache's slices in a decoding step)."""
    taken = {path: n - before.get(path, 0) for path, n in calls.items() if n - before.get(path, 0)}
    path = "passes" if passes_path else "fused"
    _expect(taken.get(path, 0) == layers and set(taken) - {"masked", "unmasked", "decode"} == {path},
            f"{what}: the method's {path} path in {layers} layers expected, got {taken or 'no call'}")
    if passes_path:
        kind = "decode" if decoding else "masked"
        _expect(taken.get(kind, 0) >= layers, f"{what}: the primitive's {kind} call in every layer expected, "
                f"got {taken}")


def measure_variant(model, spec: dict, path, length: int, decode_steps: int, repeats: int, device: str) -> dict:
    """Prefill `length` random tokens (logits of the last one, as generate() does) `repeats` times, then
    `decode_steps` single-token steps after the last prefill (0: none).

    The first prefill is the one a new prompt pays (this process has not run this length: the method's block masks
    are built in it), and it is the one the goals read (`prefill_s`); the best of the others is the steady state
    (`steady_prefill_s`). Peak CUDA memory: the maximum over every repeat and the decoding steps, each reset and
    read on its own. Checked, raising CheckFailed: the cache holds the prefilled length after each prefill and one
    more token after each step; a method's every layer takes its path (the passes path on CUDA or when forced, with
    its primitive's calls counted; the fused path on CPU), YaRN's none."""
    import torch
    from transformers import DynamicCache

    from rope_extend import patch_model, unpatch_model
    from rope_extend.compat import GENERATE_CACHE_KEYWORD

    original = model.config.max_position_embeddings
    factor = max(2.0, (length + decode_steps) / original)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*acts on attention.*")
        report = patch_model(model, **spec, factor=factor)
    method = spec["method"] != "yarn"
    passes_path = path == "passes" or device != "cpu"
    layers = model.config.num_hidden_layers
    ids = torch.randint(100, model.config.vocab_size, (1, length + decode_steps),
                        generator=torch.Generator().manual_seed(0)).to(device)
    times, steps, peaks, cache = [], [], [], None

    def forward(tokens, cache, what: str, decoding: bool):
        before = dict(calls)
        extra = {} if decoding else {"logits_to_keep": 1}
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        started = time.perf_counter()
        model(tokens, **{GENERATE_CACHE_KEYWORD: cache}, use_cache=True, **extra)
        _sync(device)
        seconds = time.perf_counter() - started
        if device == "cuda":
            peaks.append(torch.cuda.max_memory_allocated() / 2**30)
        if method:
            _method_ran(calls, before, layers, passes_path, decoding, what)
        else:
            _expect(dict(calls) == before, f"{what}: YaRN reached the attention methods' kernel: {dict(calls)}")
        return seconds

    try:
        with torch.no_grad(), forced_path(path), counted_calls() as calls:
            for repeat in range(repeats):
                cache = DynamicCache(config=model.config)
                if device == "cuda":
                    torch.cuda.empty_cache()
                times.append(forward(ids[:, :length], cache, f"prefill {repeat + 1} at {length}", False))
                _expect(cache.get_seq_length() == length, f"the cache holds {cache.get_seq_length()} tokens after "
                        f"a prefill of {length} (the forward did not fill the cache it was given as "
                        f"{GENERATE_CACHE_KEYWORD}=)")
            for t in range(length, length + decode_steps):
                steps.append(forward(ids[:, t : t + 1], cache, f"decoding step at {t}", True))
                _expect(cache.get_seq_length() == t + 1, f"the cache holds {cache.get_seq_length()} tokens after "
                        f"the decoding step at position {t}, not {t + 1}")
            counts = dict(calls)
    finally:
        del cache
        unpatch_model(model)
    return {"prefill_s": times[0], "steady_prefill_s": min(times[1:]) if len(times) > 1 else None,
            "decode_s": statistics.median(steps) if steps else None, "peak_gib": max(peaks) if peaks else None,
            "calls": counts, "factor": factor, "spec": report.spec.method_params()}


def kernel_row(device: str, length: int, shape: dict, dtype, repeats: int) -> dict:
    """Causal FlexAttention (the passes path's primitive, as the passes call it: block mask, GQA, log-sum-exp)
    against SDPA alone on the model's attention shape at `length`: the kernel ratio that bounds every method's
    prefill ratio. Best of `repeats` after one warm call each; the causal block mask's build timed apart."""
    import torch

    from rope_extend.attention import passes, primitives

    heads, kv_heads, dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    generator = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, heads, length, dim, device=device, dtype=dtype, generator=generator)
    k, v = (torch.randn(1, kv_heads, length, dim, device=device, dtype=dtype, generator=generator) for _ in "kv")
    scale = dim**-0.5
    flex = primitives.FlexPrimitive(compiled=device == "cuda")
    # plain causal attention as a pass (every distance >= 0), so its block mask is built the methods' way
    causal = passes.Pass("causal", None, False, (0, 0, 1, 0, passes.FAR), lambda p: (0, p + 1), device)

    def best(run) -> float:
        seconds = []
        for _ in range(repeats + 1):  # the first one warms up (compiles)
            _sync(device)
            started = time.perf_counter()
            run()
            _sync(device)
            seconds.append(time.perf_counter() - started)
        return min(seconds[1:])

    with torch.no_grad():
        mask_s = best(lambda: flex.prepare(causal, length, length, device))
        mask = flex.prepare(causal, length, length, device)
        k_rep, v_rep = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))  # as transformers' repeat_kv
        sdpa_s = best(lambda: torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True,
                                                                               scale=scale))
        flex_s = best(lambda: flex.masked(q, k, v, mask, scale))
    return {"length": length, "variant": "kernel: causal flex / sdpa", "path": flex.name, "sdpa_s": sdpa_s,
            "flex_s": flex_s, "flex_ratio": round(flex_s / sdpa_s, 3), "causal_mask_s": mask_s}


def synthetic_bench(device: str, lengths: list[int], decode_length: int | None, decode_steps: int, variants: dict,
                    shape: dict, dtype, repeats: int, log=None, rows: list | None = None,
                    deadline: float | None = None, warm_lengths: list[int] | None = None) -> dict:
    """At each length: first the kernel row (causal FlexAttention against SDPA alone), then every variant on one
    model, side by side; ratios against "yarn" at the same length. A variant that fails (out of memory, a failed
    check) is recorded with its error and the run goes on. `log(row)` after each row; past `deadline`
    (time.monotonic()) the rows left are recorded as skipped. `warm_lengths`: the lengths each variant runs once
    before (compilation for dynamic shapes; never one of `lengths`, so every measured prefill is a shape the
    process has not seen)."""
    import torch

    model = synthetic_model(shape, device, dtype)
    rows = [] if rows is None else rows  # the caller's list fills as the run goes (gpu_check saves it row by row)
    if warm_lengths is None:
        warm = 2 * shape["max_position_embeddings"] + 64
        warm_lengths = [warm, warm + 128]
    assert not set(warm_lengths) & set(lengths), "a warm-up length would make that length's prefill a seen shape"
    over = lambda: deadline is not None and time.monotonic() > deadline

    def add(row: dict) -> None:
        rows.append(row)
        (log or (lambda row: print(describe(row), flush=True)))(row)

    for name, (spec, path) in variants.items():  # compile / first-call costs, at other lengths (dynamic shapes)
        for length in warm_lengths:
            if over():
                break
            try:
                measure_variant(model, spec, path, length, 2, 1, device)
            except Exception as error:
                print(f"warm-up {name} at {length}: {type(error).__name__}: {str(error)[:200]}", flush=True)
    for length in lengths:
        if over():
            add({"length": length, "variant": "kernel: causal flex / sdpa", "skipped": "time budget spent"})
        else:
            try:
                add(kernel_row(device, length, shape, dtype, repeats))
            except Exception as error:
                add({"length": length, "variant": "kernel: causal flex / sdpa",
                     "error": f"{type(error).__name__}: {str(error)[:500]}"})
        base = None
        for name, (spec, path) in variants.items():
            steps = decode_steps if length == decode_length else 0
            row = {"length": length, "variant": name, "path": path or "default"}
            if over():
                add({**row, "skipped": "time budget spent"})
                continue
            try:
                row.update(measure_variant(model, spec, path, length, steps, repeats, device))
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
                if device == "cuda":
                    torch.cuda.empty_cache()
            if name == "yarn":
                base = row
            if base is not None and "error" not in row and "error" not in base:
                row["prefill_ratio"] = round(row["prefill_s"] / base["prefill_s"], 3)
                if row["steady_prefill_s"] and base["steady_prefill_s"]:
                    row["steady_prefill_ratio"] = round(row["steady_prefill_s"] / base["steady_prefill_s"], 3)
                if row["decode_s"] and base["decode_s"]:
                    row["decode_ratio"] = round(row["decode_s"] / base["decode_s"], 3)
                if row["peak_gib"] and base["peak_gib"]:
                    row["memory_ratio"] = round(row["peak_gib"] / base["peak_gib"], 3)
            add(row)
    return {"rows": rows, "shape": shape, "dtype": str(dtype), "device": device, "repeats": repeats,
            "decode_length": decode_length, "decode_steps": decode_steps, "warm_lengths": warm_lengths}


def describe(row: dict) -> str:
    """One line for a row of `synthetic_bench`."""
    head = f"{row['length']:>7} {row['variant']:<26}"
    if "error" in row:
        return f"{head} ERROR {row['error'][:160]}"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    if "flex_ratio" in row:
        return (f"{head} sdpa {1000 * row['sdpa_s']:9.2f} ms  {row['path']} {1000 * row['flex_s']:9.2f} ms "
                f"({row['flex_ratio']:.2f}x)  causal block mask {1000 * row['causal_mask_s']:.1f} ms")
    text = f"{head} prefill {row['prefill_s']:8.3f} s ({row.get('prefill_ratio', 1.0):.2f}x, new shape)"
    if row["steady_prefill_s"]:
        text += f" steady {row['steady_prefill_s']:.3f} s ({row.get('steady_prefill_ratio', 1.0):.2f}x)"
    if row["decode_s"]:
        text += f"  decode {1000 * row['decode_s']:7.2f} ms ({row.get('decode_ratio', 1.0):.2f}x)"
    if row["peak_gib"]:
        text += f"  peak {row['peak_gib']:.2f} GiB ({row.get('memory_ratio', 1.0):.2f}x)"
    return text


def environment(device: str) -> dict:
    import torch
    import transformers

    import rope_extend

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
            "device": device, "rope_extend": str(Path(rope_extend.__file__).parent)}
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
    else:
        info["device_name"] = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    return info


def synthetic_main(args) -> None:
    import torch

    device = args.device
    quick = args.quick or device == "cpu"
    shape = QUICK_SHAPE if quick else LLAMA_1B_SHAPE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lengths = args.lengths or ([1024, 2048] if quick else [16384, 32768, 65536, 131072])
    decode_length = args.decode_length or (lengths[-1] if quick else 65536)
    variants = dict(VARIANTS)
    if device == "cpu":
        torch.set_num_threads(args.threads)
        variants.update(CPU_PASSES_VARIANTS)
    result = {"environment": environment(device),
              **synthetic_bench(device, lengths, decode_length, args.decode, variants, shape, dtype, args.repeats)}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--decode", type=int, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the synthetic Llama-3.2-1B-shape bench in bfloat16 (one process)")
    parser.add_argument("--synthetic", action="store_true", help="on CPU: the synthetic bench instead of SmolLM2")
    parser.add_argument("--quick", action="store_true", help="synthetic bench with a tiny shape (a smoke run)")
    parser.add_argument("--decode-length", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--results", help="append each child's result here and skip those already in it (resume)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    if args.device == "cuda" or args.synthetic or args.quick:
        synthetic_main(args)
        return
    args.lengths = args.lengths or [4096, 16384]
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
