"""Config-only fast path vs load + save_pretrained: time and peak RSS, measured side by side in one run.

    python bench/patch_speed.py [--synthetic-gb 20]

1. SmolLM2-135M: `rope-extend patch` config-only vs the full path (load, patch, save_pretrained), each in a fresh
   child process (peak RSS of that child).
2. A synthetic sharded checkpoint of N GB (sparse files: valid safetensors headers, holes for the data) with a
   Llama-3-70B-like config: the config-only path only. Its full path would need N GB of RAM; the ratio reported is
   against the SmolLM2 full path scaled by size, a lower bound.
Goal: config-only >= 100x faster and < 300 MiB RSS whatever the size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import tempfile
from pathlib import Path

from common import demo_model, run_child

PATCH = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from rope_extend.checkpoint import patch_checkpoint
# warm-up on a tiny checkpoint of the same kind: one-time imports are not the patch's cost
patch_checkpoint(sys.argv[4], {"method": "yarn", "factor": 2}, sys.argv[2] + "-warm", mode=sys.argv[3])
t = time.perf_counter()
r = patch_checkpoint(sys.argv[1], {"method": "yarn", "factor": 2}, sys.argv[2], mode=sys.argv[3], verify=True)
end = time.perf_counter()
print(json.dumps({"seconds": end - t, "first_call_s": end - t0, "linked": r.linked, "copied": r.copied}))
"""


# Checkpoints are built in child processes too: a child's peak RSS counts the parent's memory at fork time, so
# the parent must stay small (no torch import) for the RSS numbers to mean anything.
TINY = """
import sys
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                              num_hidden_layers=2, intermediate_size=96, vocab_size=128, max_position_embeddings=64)
AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
"""

# A TinyLlama-1.1B-shaped model with random bf16 weights (2 GiB): large enough for the full path to matter, small
# enough to load here.
REAL = """
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                              num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                              max_position_embeddings=2048, rope_theta=10000.0)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="1GB")
"""


def synthetic_checkpoint(folder: Path, gigabytes: float, shards: int = 30) -> int:
    """A sparse sharded safetensors checkpoint: real headers, data as holes. Returns its apparent size."""
    folder.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
        "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    per_shard = int(gigabytes * 2**30 / shards)
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        n = per_shard // 2  # bf16 elements
        header = json.dumps({f"layers.{i}.weight": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
        path = folder / name
        with open(path, "wb") as handle:
            handle.write(struct.pack("<Q", len(header)) + header)
            handle.truncate(8 + len(header) + 2 * n)  # sparse: no data blocks allocated
        weight_map[f"layers.{i}.weight"] = name
        total += path.stat().st_size
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-gb", type=float, default=20.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rope-bench-"))
    try:
        smol = demo_model()
        size = sum(p.stat().st_size for p in smol.iterdir() if p.is_file())
        tiny = str(work / "tiny")
        run_child(TINY, tiny)
        base = run_child("import torch, transformers, rope_extend.checkpoint; print('{}')")
        fast = run_child(PATCH, str(smol), str(work / "fast"), "config-only", tiny)
        full = run_child(PATCH, str(smol), str(work / "full"), "full", tiny)
        print(f"import floor (python + torch + transformers + rope_extend): {base['peak_rss_mib']:.0f} MiB RSS")
        print(f"SmolLM2-135M ({size / 2**20:.0f} MiB): config-only {fast['seconds']:.3f} s / {fast['peak_rss_mib']:.0f} MiB "
              f"peak RSS; full {full['seconds']:.2f} s / {full['peak_rss_mib']:.0f} MiB")
        print(f"  ratio full/config-only: time {full['seconds'] / fast['seconds']:.0f}x, RSS {full['peak_rss_mib'] / fast['peak_rss_mib']:.1f}x; "
              f"whole command incl. Python start and imports: {full['wall_s']:.1f} s vs {fast['wall_s']:.1f} s")
        real = work / "real"
        run_child(REAL, str(real))
        real_size = sum(p.stat().st_size for p in real.iterdir() if p.is_file())
        rfast = run_child(PATCH, str(real), str(work / "real-fast"), "config-only", tiny)
        rfull = run_child(PATCH, str(real), str(work / "real-full"), "full", tiny)
        print(f"random TinyLlama-shaped 1.1B bf16 ({real_size / 2**30:.1f} GiB, 3 shards): config-only {rfast['seconds']:.3f} s / "
              f"{rfast['peak_rss_mib']:.0f} MiB; full {rfull['seconds']:.1f} s / {rfull['peak_rss_mib']:.0f} MiB -> "
              f"{rfull['seconds'] / rfast['seconds']:.0f}x time, {rfull['peak_rss_mib'] / rfast['peak_rss_mib']:.1f}x RSS; "
              f"whole command {rfull['wall_s']:.1f} s vs {rfast['wall_s']:.1f} s")
        apparent = synthetic_checkpoint(work / "big", args.synthetic_gb)
        big = run_child(PATCH, str(work / "big"), str(work / "big-out"), "config-only", tiny)
        full_estimate = full["seconds"] * apparent / size
        print(f"synthetic {apparent / 2**30:.1f} GiB, {big['linked']} files (sparse): config-only {big['seconds']:.3f} s / "
              f"{big['peak_rss_mib']:.0f} MiB peak RSS (whole command {big['wall_s']:.1f} s); full path not run "
              f"(needs >{apparent / 2**30:.0f} GiB RAM), at SmolLM2's full-path rate it would take >= {full_estimate:.0f} s "
              f"-> >= {full_estimate / big['seconds']:.0f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
