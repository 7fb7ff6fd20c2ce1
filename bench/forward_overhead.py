"""Forward pass of a model patched in place vs the same model built natively from the rewritten config.

    python bench/forward_overhead.py [--tokens 4096] [--repeats 5]

Both models hold the same weights; runs are interleaved (A B A B ...) and the median ratio is reported.
Goal: patched / native <= 1.01 (patching adds no per-forward work for static methods).
"""

from __future__ import annotations

import argparse
import warnings

import torch
from common import demo_model, interleaved, median
from transformers import AutoModelForCausalLM

from rope_extend import patch_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--method", default="yarn")
    args = parser.parse_args()
    path = demo_model()
    patched = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(patched, method=args.method, factor=2)
    native = AutoModelForCausalLM.from_config(patched.config, dtype=torch.float32).eval()
    native.load_state_dict(patched.state_dict())
    ids = torch.randint(100, 40000, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        same = (patched(ids[:, :256]).logits - native(ids[:, :256]).logits).abs().max().item()

        def run(model):
            return lambda: model(ids, use_cache=False)

        times = interleaved({"patched": run(patched), "native": run(native)}, repeats=args.repeats)
    p, n = median(times["patched"]), median(times["native"])
    print(f"{args.method} x2, {args.tokens} tokens, {args.repeats} interleaved runs: patched {p:.2f} s, "
          f"native {n:.2f} s, ratio {p / n:.3f} (goal <= 1.01); max |logit diff| {same:.1e}")


if __name__ == "__main__":
    main()
