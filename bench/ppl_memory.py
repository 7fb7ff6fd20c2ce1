"""Perplexity evaluation at 8k and 16k tokens: peak RSS and tokens/s of rope-extend's chunked loss vs a naive
`model(input_ids, labels=...)` and vs lm-eval's rolling loglikelihood, each in a fresh child process.

    python bench/ppl_memory.py [--lengths 8192 16384] [--skip-lm-eval]

Goal: RSS <= 0.5x naive, throughput >= 1x lm-eval.
"""

from __future__ import annotations

import argparse

from common import demo_model, run_child

SETUP = """
import json, sys, time, warnings, torch
warnings.simplefilter("ignore")
torch.set_grad_enabled(False)
from transformers import AutoModelForCausalLM, AutoTokenizer
from rope_extend import patch_model
from rope_extend.eval.texts import load_text
path, n = sys.argv[1], int(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
patch_model(model, method="yarn", factor=2)
tok = AutoTokenizer.from_pretrained(path)
ids = tok(load_text(), return_tensors="pt").input_ids[:, :n]
assert ids.shape[1] == n, ids.shape
"""

CHUNKED = SETUP + """
from rope_extend.eval.perplexity import token_losses
t = time.perf_counter(); loss = token_losses(model, ids).mean().item(); s = time.perf_counter() - t
print(json.dumps({"loss": loss, "seconds": s}))
"""

NAIVE = SETUP + """
t = time.perf_counter(); loss = model(ids, labels=ids).loss.item(); s = time.perf_counter() - t
print(json.dumps({"loss": loss, "seconds": s}))
"""

LM_EVAL = SETUP + """
from lm_eval.models.huggingface import HFLM
from lm_eval.api.instance import Instance
lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=n)
text = tok.decode(ids[0])
req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
t = time.perf_counter(); ll = lm.loglikelihood_rolling([req], disable_tqdm=True)[0]; s = time.perf_counter() - t
print(json.dumps({"loss": -ll / n, "seconds": s}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--skip-lm-eval", action="store_true")
    args = parser.parse_args()
    path = str(demo_model())
    baseline = run_child(SETUP + "\nprint('{}')", path, "16")  # model + tokenizer + text, no forward
    print(f"baseline child (model loaded, no forward): {baseline['peak_rss_mib']:.0f} MiB RSS")
    for n in args.lengths:
        runs = {"chunked (rope-extend)": run_child(CHUNKED, path, str(n)), "naive labels=": run_child(NAIVE, path, str(n))}
        if not args.skip_lm_eval:
            runs["lm-eval rolling"] = run_child(LM_EVAL, path, str(n))
        ours = runs["chunked (rope-extend)"]
        for name, r in runs.items():
            print(f"{n} tokens, {name}: loss {r['loss']:.4f}, {n / r['seconds']:.0f} tok/s, peak RSS {r['peak_rss_mib']:.0f} MiB")
        naive = runs["naive labels="]
        print(f"  RSS chunked/naive {ours['peak_rss_mib'] / naive['peak_rss_mib']:.2f} (above baseline: "
              f"{(ours['peak_rss_mib'] - baseline['peak_rss_mib']) / max(1.0, naive['peak_rss_mib'] - baseline['peak_rss_mib']):.2f})")
        if "lm-eval rolling" in runs:
            print(f"  throughput chunked/lm-eval {runs['lm-eval rolling']['seconds'] / ours['seconds']:.2f}x")


if __name__ == "__main__":
    main()
