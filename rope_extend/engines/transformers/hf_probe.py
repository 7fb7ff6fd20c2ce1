"""Run stock transformers' rotary embedding on a config.json and print the served cos/sin.

Standalone on purpose (no rope_extend import): `rope_extend.engines.transformers_engine` imports it in-process for
the running transformers, and runs it as a script (`python -I hf_probe.py JOBS.json OUT.pt`) under another Python for
the other transformers line. For each request of N tokens it calls the model's own rotary module forward with
position ids ending at N-1 (so dynamic methods update as the library does) and saves cos and sin with one column
per rotary frequency (`per_frequency`: whatever layout the module returns; attention scaling included).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings


def rotary_module(config):
    """The model's own rotary embedding module, built from `config` as the model builds it."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    model_class = AutoModelForCausalLM._model_mapping[type(config)]  # the class from_pretrained would build
    module = importlib.import_module(model_class.__module__)
    model_type = config.model_type
    candidates = [
        cls
        for name, cls in vars(module).items()
        if name.endswith("RotaryEmbedding") and isinstance(cls, type) and issubclass(cls, nn.Module)
    ]
    if not candidates:
        raise ValueError(f"transformers has no rotary embedding class for model type {model_type!r}")
    cls = min(candidates, key=lambda c: len(c.__name__))  # the plain one (not e.g. ...ScalingRotaryEmbedding)
    with torch.device("cpu"):
        return cls(config=config)


def probe(folder: str, requests: dict, layer_type: str | None = None) -> dict:
    """{n: positions} -> cos/sin at those positions of a request of n tokens (the positions end at n - 1), for the
    layers of `layer_type` (default: full attention) where the rotary module takes one."""
    import torch
    import transformers
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(folder)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        module = rotary_module(config).eval()
        kwargs = {}
        if "layer_type" in inspect.signature(module.forward).parameters and getattr(config, "layer_types", None):
            kwargs["layer_type"] = layer_type or "full_attention"
        elif layer_type == "sliding_attention" and getattr(config, "rope_local_base_freq", None) is not None:
            # transformers 4.x Gemma 3 (Gemma3TextModel.__init__): the sliding layers' `rotary_emb_local` is the
            # same class built from a copy of the config with rope_theta = rope_local_base_freq and default RoPE
            import copy

            config = copy.deepcopy(config)
            config.rope_theta = config.rope_local_base_freq
            config.rope_scaling = {"rope_type": "default"}
            module = rotary_module(config).eval()
    out = {"version": transformers.__version__, "requests": {}}
    for n, at in requests.items():
        x = torch.zeros(1, dtype=torch.float32)
        position_ids = torch.tensor(at, dtype=torch.long)[None, :]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            served = module(x, position_ids, **kwargs)
        if isinstance(served, torch.Tensor) and served.is_complex():  # DeepSeek-V2, Llama 4: freqs_cis = cos + i·sin
            cos, sin = served.real, served.imag
        else:
            cos, sin = served
        cos, sin = per_frequency(cos[0], sin[0])
        out["requests"][n] = (cos.float().clone(), sin.float().clone())
    return out


def per_frequency(cos, sin):
    """cos and sin with one column per rotary frequency, from the layout the rotary module returns: the two halves
    repeated (rotate_half: Llama and most models), each frequency twice in a row (interleaved: Cohere), or one column
    per frequency already (GPT-OSS, and a complex freqs_cis)."""
    import torch

    d = cos.shape[-1]
    if d % 2 == 0 and torch.equal(cos[..., : d // 2], cos[..., d // 2 :]) and torch.equal(sin[..., : d // 2], sin[..., d // 2 :]):
        return cos[..., : d // 2], sin[..., : d // 2]
    if d % 2 == 0 and torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2]):
        return cos[..., 0::2], sin[..., 0::2]
    return cos, sin


def probe_many(jobs: list[dict]) -> list[dict]:
    """probe() for each {"folder", "requests": [[n, positions], ...], "layer_type" (optional)} job; a config the
    library refuses gives
    {"error": message}."""
    results = []
    for job in jobs:
        try:
            results.append(probe(job["folder"], {int(n): at for n, at in job["requests"]}, job.get("layer_type")))
        except Exception as exc:  # reported per job, like a loader error the user would see
            results.append({"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
    return results


if __name__ == "__main__":
    import json

    import torch

    jobs_file, target = sys.argv[1:]
    with open(jobs_file) as f:
        torch.save(probe_many(json.load(f)), target)
    print("probe-ok")
