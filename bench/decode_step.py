"""Decode step time, measured side by side: dynamic vs static scaling, or the attention-level methods vs YaRN.

    python bench/decode_step.py [--prompt 2048] [--new 64] [--repeats 3]
    python bench/decode_step.py --attention [--caches 2048 16384] [--steps 8] [--rounds 3] [--threads 2]
    python bench/decode_step.py --attention --generate [--caches 2048] [--steps 4]

Default: greedy `generate` on SmolLM2 from a prompt beyond nothing special; the decode time per token is
(time(prompt + new) - time(prompt + 1)) / (new - 1), so prefill cancels out. Interleaved runs, medians.
Goal: dynamic-yarn (consistent) / yarn (static) <= 1.10.

`--attention` (issue 43 §3): a random Llama of the Llama-3.2-1B shape cut to 4 layers (hidden 2048, 32/8 heads,
head_dim 64; original length 1024, so that both methods act at 2k: self-extend's window and dual-chunk's chunks
are those of a 1k model; factor max(2, length / 1024)), bfloat16, attn_implementation="sdpa", its KV cache filled with random keys and
values of each length in `--caches` (no prefill: the step is what is measured). YaRN against self-extend and
dual-chunk forced onto the passes path with the CUDA primitive (`FlexPrimitive`, eager here: a decoding step runs
its math attention on the cache slices, as on CUDA). Per variant: aten ops of one step (a TorchDispatchMode), host
synchronisations of one step (ops that read a tensor's value on the host: `aten._local_scalar_dense` behind
`.item()` / `int()` / `bool()`, `aten.equal`, `aten.is_nonzero`, plus `Tensor.tolist` calls), and the median wall
time of `--steps` steps, variants interleaved round by round. Goals: ops <= 1.5x YaRN's, no synchronisation,
step time <= 1.3x YaRN's.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from common import demo_model, interleaved, median
from transformers import AutoModelForCausalLM

from rope_extend import patch_model


def load(path, method, mode="consistent"):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, method=method, factor=2, dynamic_mode=mode)
    return model


SYNC_OPS = ("_local_scalar_dense", "equal", "is_nonzero")  # aten ops that hand a tensor's value to the host


class OpCounter:
    """Counts the aten ops run inside it and those of them that synchronise with the host (and Tensor.tolist)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.ops, self.syncs = 0, []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.ops += 1
                if func.overloadpacket.__name__ in SYNC_OPS:
                    counter.syncs.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        self._tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda t: self.syncs.append("tolist") or counter._tolist(t)
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        torch.Tensor.tolist = self._tolist


ATTENTION_SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=64, num_hidden_layers=4, vocab_size=128256, max_position_embeddings=1024,
                       rope_theta=500000.0, tie_word_embeddings=True)


def attention_main(args) -> None:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from rope_extend import unpatch_model
    from rope_extend.attention import kernels, primitives

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(**ATTENTION_SHAPE, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    flex = primitives.FlexPrimitive(compiled=False)
    select = kernels.select_path
    forced = lambda device, start, case, mapping: "passes" if start is not None else select(device, start, case,
                                                                                           mapping)
    shape = (1, config.num_key_value_heads, 0, config.head_dim)
    for length in args.caches:
        factor = max(2.0, (length + args.steps + 2) / config.max_position_embeddings)
        generator = torch.Generator().manual_seed(length)
        filled = [(torch.randn(*shape[:2], length, shape[3], generator=generator, dtype=torch.bfloat16),
                   torch.randn(*shape[:2], length, shape[3], generator=generator, dtype=torch.bfloat16))
                  for _ in range(config.num_hidden_layers)]
        ids = torch.randint(100, 40000, (1, 1), generator=generator)
        rows = {}
        for _ in range(args.rounds):
            for method in ("yarn", "self-extend", "dual-chunk"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    patch_model(model, method=method, factor=factor)
                kernels.select_path, kernels.primitive_for = forced, lambda device: flex
                calls = []
                original_passes = kernels.passes_attention
                kernels.passes_attention = lambda *a, _c=calls, _f=original_passes, **k: _c.append(1) or _f(*a, **k)
                try:
                    cache = DynamicCache(config=model.config)
                    for layer, (k, v) in enumerate(filled):
                        cache.update(k, v, layer)
                    with torch.no_grad():
                        model(ids, past_key_values=cache, use_cache=True)  # first step: moved keys, tables
                        with OpCounter() as counted:
                            model(ids, past_key_values=cache, use_cache=True)
                        times = []
                        for _ in range(args.steps):
                            started = time.perf_counter()
                            model(ids, past_key_values=cache, use_cache=True)
                            times.append(time.perf_counter() - started)
                    assert cache.get_seq_length() == length + 2 + args.steps, cache.get_seq_length()
                    if method != "yarn":  # the method's passes path ran, on every layer of every step
                        assert len(calls) == config.num_hidden_layers * (2 + args.steps), len(calls)
                finally:
                    kernels.select_path, kernels.primitive_for = select, primitives.primitive_for
                    kernels.passes_attention = original_passes
                    unpatch_model(model)
                row = rows.setdefault(method, {"ops": counted.ops, "syncs": len(counted.syncs),
                                               "sync_ops": sorted(set(counted.syncs)), "times": []})
                row["times"] += times
        base = rows["yarn"]
        for method, row in rows.items():
            step = statistics.median(row["times"])
            ratio = step / statistics.median(base["times"])
            print(f"{length:>6} {method:<12} {row['ops']:4d} aten ops/step ({row['ops'] / base['ops']:.2f}x)  "
                  f"{row['syncs']:3d} syncs {row['sync_ops'] or ''}  step {1000 * step:7.2f} ms ({ratio:.2f}x)",
                  flush=True)


def generate_main(args) -> None:
    """`--attention --generate` (issue 51 §4): host synchronisations of each decoding step of `generate()`, which
    passes its own position ids: greedy on batch 1 and on a left-padded batch of 2 (prompts of `--caches` tokens and
    3/4 of that), YaRN against self-extend, dual-chunk and STRING (their defaults on the 4-layer random model,
    forced onto the passes path with the CUDA primitive, as above). Prints per variant the syncs of each step and
    the sync ops; the methods' goal is YaRN's count, step by step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rope_extend import unpatch_model
    from rope_extend.attention import kernels, primitives

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**ATTENTION_SHAPE, attn_implementation="sdpa")).to(torch.bfloat16).eval()
    flex = primitives.FlexPrimitive(compiled=False)
    select = kernels.select_path
    forced = lambda device, start, case, mapping: "passes" if start is not None else select(device, start, case,
                                                                                           mapping)
    for length in args.caches:
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(100, 40000, (2, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[1, : length // 4] = 0
        factor = max(2.0, (length + args.steps + 2) / model.config.max_position_embeddings)
        specs = {"yarn": {"method": "yarn", "factor": factor}, "self-extend": {"method": "self-extend", "factor": factor},
                 "dual-chunk": {"method": "dual-chunk", "factor": factor}, "string": {"method": "string"}}
        for batch in (1, 2):
            for name, spec in specs.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    patch_model(model, **spec)
                kernels.select_path, kernels.primitive_for = forced, lambda device: flex
                steps = []

                def enter(module, a, kw, _steps=steps):
                    if kw["input_ids"].shape[1] == 1:
                        _steps.append(OpCounter().__enter__())

                def leave(module, a, kw, out, _steps=steps):
                    if kw["input_ids"].shape[1] == 1:
                        _steps[-1].__exit__(None, None, None)

                hooks = [model.register_forward_pre_hook(enter, with_kwargs=True),
                         model.register_forward_hook(leave, with_kwargs=True)]
                try:
                    with torch.no_grad():
                        model.generate(ids[2 - batch :], attention_mask=mask[2 - batch :], max_new_tokens=args.steps,
                                       min_new_tokens=args.steps, do_sample=False, pad_token_id=0)
                finally:
                    for hook in hooks:
                        hook.remove()
                    kernels.select_path, kernels.primitive_for = select, primitives.primitive_for
                    unpatch_model(model)
                counts = [len(c.syncs) for c in steps]
                ops = sorted({op for c in steps for op in c.syncs})
                print(f"{length:>6} batch {batch} {'(left-padded)' if batch == 2 else '             '} {name:<12} "
                      f"syncs per step {counts} {ops or ''}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", action="store_true", help="self-extend / dual-chunk decoding vs YaRN")
    parser.add_argument("--caches", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--generate", action="store_true", help="with --attention: syncs of generate()'s steps")
    args = parser.parse_args()
    if args.attention and args.generate:
        generate_main(args)
        return
    if args.attention:
        attention_main(args)
        return
    path = demo_model()
    models = {"static yarn": load(path, "yarn"), "dynamic-yarn (consistent)": load(path, "dynamic-yarn"),
              "dynamic ntk (consistent)": load(path, "dynamic")}
    ids = torch.randint(100, 40000, (1, args.prompt), generator=torch.Generator().manual_seed(0))

    def gen(model, new):
        return lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, pad_token_id=0)

    with torch.no_grad():
        fns = {}
        for name, model in models.items():
            fns[(name, 1)] = gen(model, 1)
            fns[(name, args.new)] = gen(model, args.new)
        times = interleaved(fns, repeats=args.repeats)
    step = {name: (median(times[(name, args.new)]) - median(times[(name, 1)])) / (args.new - 1) for name in models}
    base = step["static yarn"]
    for name, value in step.items():
        print(f"{name}: {1000 * value:.1f} ms/token, ratio vs static {value / base:.3f}")


if __name__ == "__main__":
    main()
