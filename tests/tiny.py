"""Tiny random models of every RoPE architecture we support, built in memory (hidden 64, 4 heads, 2 layers).

`ORIGINAL` is their max_position_embeddings, so a sequence of FACTOR * ORIGINAL tokens runs beyond the original
window. `stock_logits` runs checkpoints through stock transformers in a fresh process that cannot import
rope_extend.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rope_extend.compat import TRANSFORMERS_V5

ORIGINAL = 32
FACTOR = 4
SEQ = FACTOR * ORIGINAL
VOCAB = 128
COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    max_position_embeddings=ORIGINAL,
    head_dim=16,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

ARCHS: dict[str, dict] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {},
    "gemma3_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "rope_theta": 100000.0,
    },
    "phi3": {"original_max_position_embeddings": ORIGINAL},
    "gpt_neox": {"partial_rotary_factor": 0.5, "rotary_pct": 0.5, "use_parallel_residual": True},
    "olmo2": {},
    "granite": {},
    # explicit head_dim (32) != hidden_size / heads (16), as in Mistral-Nemo
    "llama_head_dim": {"model_type": "llama", "head_dim": 32},
}

METHODS = ["linear", "ntk", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope"]

# Phi-3's config class accepts only rope_type longrope (both transformers lines validate it), so rope-extend must
# refuse these methods on it with an UnsupportedModelError instead of writing a checkpoint that does not load.
REFUSED = {("phi3", m) for m in ("linear", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3")}
# 4.x OLMo configs accept only {type: linear|dynamic, factor} in rope_scaling.
REFUSED_4X_ONLY = {("olmo2", m) for m in ("ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope")}
if not TRANSFORMERS_V5:
    REFUSED |= REFUSED_4X_ONLY
# What one of the two lines refuses: a checkpoint for both lines cannot carry these.
REFUSED_ANY_LINE = REFUSED | REFUSED_4X_ONLY


def make_config(arch: str):
    extra = dict(ARCHS[arch])
    model_type = extra.pop("model_type", arch)
    kwargs = {**COMMON, **extra}
    if model_type == "gemma3_text":
        kwargs.pop("rope_theta")
        kwargs["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        kwargs["rope_local_base_freq"] = 10000.0
        kwargs["rope_theta"] = 100000.0
    config = AutoConfig.for_model(model_type, **kwargs)
    return config


def make_model(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(arch), attn_implementation="eager")
    return model.eval().float()


def rotary_dim(arch: str) -> int:
    extra = ARCHS[arch]
    head_dim = extra.get("head_dim", COMMON["head_dim"])
    return int(head_dim * extra.get("partial_rotary_factor", 1.0))


def spec_kwargs(method: str, arch: str, factor: float = FACTOR) -> dict:
    kwargs = {"method": method, "factor": factor}
    if method == "longrope":
        half = rotary_dim(arch) // 2
        kwargs["short_factor"] = [1.0 + 0.1 * i for i in range(half)]
        kwargs["long_factor"] = [1.0 + (factor - 1.0) * (i + 1) / half for i in range(half)]
    return kwargs


def input_ids(seq: int = SEQ, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, seq), generator=generator)


STOCK_SCRIPT = textwrap.dedent(
    """
    import sys, json, importlib.abc
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "rope_extend" or name.startswith("rope_extend."):
                raise ImportError("rope_extend must not be importable in the stock-loader process")
    sys.meta_path.insert(0, _Block())
    import torch, transformers
    from transformers import AutoModelForCausalLM
    jobs = json.load(open(sys.argv[1]))
    for job in jobs:
        model = AutoModelForCausalLM.from_pretrained(job["path"], attn_implementation="eager", dtype=torch.float32).eval()
        ids = torch.tensor(job["ids"])
        with torch.no_grad():
            logits = model(ids).logits
        torch.save(logits, job["out"])
    assert "rope_extend" not in sys.modules
    print("stock-ok", transformers.__version__)
    """
)


def stock_logits(jobs: list[tuple[Path, torch.Tensor]], workdir: Path, python: str | None = None) -> list[torch.Tensor]:
    """Logits of each checkpoint computed by stock transformers in a fresh process without rope_extend."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = [
        {"path": str(path), "ids": ids.tolist(), "out": str(workdir / f"logits_{i}.pt")}
        for i, (path, ids) in enumerate(jobs)
    ]
    jobs_file = workdir / "jobs.json"
    jobs_file.write_text(json.dumps(spec))
    script = workdir / "stock.py"
    script.write_text(STOCK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [python or sys.executable, "-I", str(script), str(jobs_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(workdir),
    )
    assert result.returncode == 0 and "stock-ok" in result.stdout, result.stderr[-4000:]
    return [torch.load(job["out"]) for job in spec]


def checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (to prove SOURCE is byte-identical after a run)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def make_multimodal_model(seed: int = 0):
    """A tiny LLaVA (CLIP vision tower + the tiny llama as its nested text config): a multimodal-style config."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=16)
    config = LlavaConfig(text_config=make_config("llama"), vision_config=vision, image_token_index=5)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config).eval().float()
