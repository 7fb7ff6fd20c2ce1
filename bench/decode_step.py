"""Decode step time: consistent dynamic scaling vs static scaling, measured side by side.

    python bench/decode_step.py [--prompt 2048] [--new 64] [--repeats 3]

Greedy `generate` on SmolLM2 from a prompt beyond nothing special; the decode time per token is
(time(prompt + new) - time(prompt + 1)) / (new - 1), so prefill cancels out. Interleaved runs, medians.
Goal: dynamic-yarn (consistent) / yarn (static) <= 1.10.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
