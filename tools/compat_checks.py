"""One row of the compatibility matrix: rope-extend's core paths against the transformers this interpreter has.

    python tools/compat_checks.py WORKDIR [CHECK ...]     # PYTHONPATH=<repo>; prints one JSON line at the end

Each check builds tiny seeded models (seconds on 2 CPU cores) and compares against an independent reference:

- ``yarn``: `patch_model(method="yarn")` on a Llama-2-shaped (head_dim 128, theta 10000, 4096 tokens) and a
  Llama-3-shaped (head_dim 128, theta 500000, 8192 tokens) RoPE gives the inverse frequencies, attention factor and
  logits (at positions up to 4x the original length) of transformers' own YaRN built from a user's config.json.
- ``reload``: the patched model saved, then reloaded by stock transformers in a fresh process that cannot import
  rope_extend, gives the same logits.
- ``cli-patch``: `rope-extend patch ckpt --method yarn --factor 4 -o out` exits 0 (it verifies by reloading) and
  writes YaRN into out/config.json.
- ``cached-decode``: self-extend and dual-chunk, prefilled in pieces then decoded token by token with transformers'
  KV cache, give the logits of one forward (1e-4), which differ from the unpatched model's (the method ran), with
  every attention implementation the release can route (eager only where it looks eager up in the registry;
  elsewhere patching an eager model must be refused in one line).
- ``probes``: the evaluation's shared-prefix probes (`eval.probes.run_probes_sharing_prefix`, also behind `tune`'s
  held-out passkey) give the outputs of the same prompts run one by one without a cache, for YaRN and self-extend.
- ``train``: `rope-extend train` for 2 steps writes a checkpoint whose training.json records 2 steps.

Results: ``{"transformers": version, "checks": {name: "ok" | "FAIL: <one line>"}, "seconds": {name: s}}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import traceback
import warnings
from pathlib import Path

import torch
import transformers

from rope_extend import UnsupportedModelError, patch_model
from rope_extend.compat import EAGER_THROUGH_ATTENTION_REGISTRY, GENERATE_CACHE_KEYWORD

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

CHECKS: dict = {}
ROOT = Path(__file__).resolve().parent.parent


def check(name: str):
    def register(fn):
        CHECKS[name] = fn
        return fn

    return register


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *args], env=_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    return result


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> None:
    diff = float((got.double() - want.double()).abs().max())
    if not diff <= atol:
        raise AssertionError(f"{what}: max |diff| {diff:.3g} > {atol:g}")


# --- RoPE shapes of real checkpoints, on a 1-layer model ------------------------------------------------------------
SHAPES = {"llama-2": (10000.0, 4096), "llama-3": (500000.0, 8192)}


def realistic_llama(theta: float, length: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=length, rope_theta=theta,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def user_yarn_config(theta: float, length: int, factor: float):
    """transformers' own YaRN as a user's config.json states it (the 4.x layout, which 5.x converts itself)."""
    from transformers import LlamaConfig

    model = realistic_llama(theta, length)
    data = model.config.to_dict()
    data.pop("rope_parameters", None)
    data.update(rope_theta=theta, max_position_embeddings=int(length * factor),
                rope_scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": length})
    return LlamaConfig.from_dict(data)


def long_positions(length: int, n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(1))
    return ids, (torch.arange(n) * (4 * length - 1) // (n - 1))[None]  # 0 .. 4x the original length


@check("yarn")
def yarn(work: Path) -> None:
    from transformers import LlamaForCausalLM

    for shape, (theta, length) in SHAPES.items():
        model = realistic_llama(theta, length)
        patch_model(model, method="yarn", factor=4)
        stock = LlamaForCausalLM(user_yarn_config(theta, length, 4.0)).eval()
        stock.load_state_dict(model.state_dict())
        ours, theirs = model.model.rotary_emb, stock.model.rotary_emb
        _close(ours.inv_freq, theirs.inv_freq, 0.0, f"{shape} inv_freq")
        if abs(ours.attention_scaling - theirs.attention_scaling) > 1e-12:
            raise AssertionError(f"{shape} attention factor {ours.attention_scaling} != {theirs.attention_scaling}")
        ids, positions = long_positions(length)
        with torch.no_grad():
            _close(model(ids, position_ids=positions).logits, stock(ids, position_ids=positions).logits, 1e-5,
                   f"{shape} logits")


STOCK = textwrap.dedent("""
    import importlib.abc, sys, torch
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "rope_extend":
                raise ImportError("stock transformers only")
    sys.meta_path.insert(0, Block())
    from transformers import AutoModelForCausalLM
    folder, ids, positions, out = sys.argv[1:]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        torch.save(model(torch.load(ids), position_ids=torch.load(positions)).logits, out)
""")


@check("reload")
def reload(work: Path) -> None:
    theta, length = SHAPES["llama-3"]
    model = realistic_llama(theta, length)
    patch_model(model, method="yarn", factor=4)
    folder = work / "reload"
    model.save_pretrained(folder)
    ids, positions = long_positions(length)
    torch.save(ids, work / "ids.pt")
    torch.save(positions, work / "positions.pt")
    _run(["-c", STOCK, str(folder), str(work / "ids.pt"), str(work / "positions.pt"), str(work / "stock.pt")])
    with torch.no_grad():
        _close(torch.load(work / "stock.pt"), model(ids, position_ids=positions).logits, 1e-5, "stock reload logits")


def tiny_checkpoint(work: Path) -> Path:
    from rope_extend.eval.toy_models import tiny_checkpoint as build

    return build(work / "tiny-llama", max_position_embeddings=64)


@check("cli-patch")
def cli_patch(work: Path) -> None:
    out = work / "cli-out"
    _run(["-m", "rope_extend", "patch", str(tiny_checkpoint(work)), "--method", "yarn", "--factor", "4", "-o", str(out)])
    config = json.loads((out / "config.json").read_text())
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if scaling.get("rope_type") != "yarn" or config["max_position_embeddings"] != 256:
        raise AssertionError(f"out/config.json: rope {scaling}, max_position_embeddings {config['max_position_embeddings']}")


ATTENTION = {"self-extend": {"group_size": 4, "neighbor_window": 8},  # dual-chunk: the map alone (length scale off:
             "dual-chunk": {"chunk_size": 20, "local_window": 6, "length_scale": 0.0}}  # pieces != one forward with it)


def small_llama(impl: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=96, num_hidden_layers=2, max_position_embeddings=32,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()


@check("cached-decode")
def cached_decode(work: Path) -> None:
    from transformers import DynamicCache

    ids = torch.randint(3, 128, (1, 64), generator=torch.Generator().manual_seed(1))
    impls = ["eager", "sdpa"] if EAGER_THROUGH_ATTENTION_REGISTRY else ["sdpa"]
    if not EAGER_THROUGH_ATTENTION_REGISTRY:
        try:
            patch_model(small_llama("eager"), method="self-extend", factor=4)
        except UnsupportedModelError:
            pass
        else:
            raise AssertionError("patching an eager model was not refused, though eager bypasses the registry here")
    for method, params in ATTENTION.items():
        for impl in impls:
            model = small_llama(impl)
            with torch.no_grad():
                plain = model(ids).logits
                patch_model(model, method=method, factor=3, **params)
                full = model(ids).logits
                cache = DynamicCache()
                step = {GENERATE_CACHE_KEYWORD: cache, "use_cache": True}
                pieces = [model(ids[:, :30], **step).logits, model(ids[:, 30:47], **step).logits]
                pieces += [model(ids[:, t : t + 1], **step).logits for t in range(47, 64)]
            if cache.get_seq_length() != 64:
                raise AssertionError(f"{method}/{impl}: the KV cache holds {cache.get_seq_length()} tokens, not 64")
            _close(torch.cat(pieces, 1), full, 1e-4, f"{method}/{impl} cached decode vs one forward")
            if float((full - plain).abs().max()) < 1e-3:
                raise AssertionError(f"{method}/{impl}: logits equal the unpatched model's; the method did not run")


@check("probes")
def probes(work: Path) -> None:
    from rope_extend.eval.probes import make_passkey, run_probe, run_probes_sharing_prefix
    from rope_extend.eval.toy_models import tiny_llama, tiny_tokenizer
    from rope_extend.tune import heldout

    tok = tiny_tokenizer()
    samples = [make_passkey(tok, 120, depth, index=i) for i, depth in enumerate((0.2, 0.5, 0.8))]
    for method, params in (("yarn", {}), ("self-extend", ATTENTION["self-extend"])):
        model = tiny_llama(len(tok), max_position_embeddings=64, attn_implementation="sdpa")
        patch_model(model, method=method, factor=3, **params)
        shared = [r["output"] for r in run_probes_sharing_prefix(model, tok, samples)]
        alone = [run_probe(model, tok, sample)["output"] for sample in samples]
        if shared != alone:
            raise AssertionError(f"{method}: shared-prefix outputs {shared} != one-by-one {alone}")
        passkey = heldout.passkey(model, tok, 128, 2)
        if len(passkey["scores"]) != 2:
            raise AssertionError(f"{method}: tune's held-out passkey returned {passkey}")


@check("train")
def train(work: Path) -> None:
    source = tiny_checkpoint(work)
    text = work / "train.txt"
    text.write_text(" ".join(f"word{i % 60}" for i in range(3000)))
    out = work / "train-out"
    _run(["-m", "rope_extend", "train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text),
          "--window", "32", "--steps", "2", "--batch-tokens", "64", "--lr", "3e-3", "--warmup", "0",
          "--dtype", "float32", "-o", str(out)])
    summary = json.loads((out / "training.json").read_text())
    if summary["steps"] != 2:
        raise AssertionError(f"training.json records {summary['steps']} steps, not 2")


def main() -> None:
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or list(CHECKS)
    results, seconds = {}, {}
    for name in names:
        started = time.perf_counter()
        try:
            CHECKS[name](work)
            results[name] = "ok"
        except Exception as exc:  # one row of a table: the failure in one line, the traceback on stderr
            traceback.print_exc()
            results[name] = f"FAIL: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        seconds[name] = round(time.perf_counter() - started, 1)
    print(json.dumps({"transformers": transformers.__version__, "checks": results, "seconds": seconds}))


if __name__ == "__main__":
    main()
