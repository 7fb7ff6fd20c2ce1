"""SGLang's RoPE, ported from SGLang 0.5.23 (wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl).

Sources read:
- sglang/srt/models/llama.py: `rope_theta` and the scaling dict both come from `config.rope_parameters`
  (transformers 5.19); `max_position` is `max_position_embeddings`.
- sglang/srt/layers/rotary_embedding/factory.py `get_rope`: yarn reads only extrapolation_factor, attn_factor,
  beta_fast, beta_slow, mscale, mscale_all_dim and truncate -- not `attention_factor`; dynamic and longrope as below.
- yarn.py `YaRNScalingRotaryEmbedding`: magnitude = (mscale/mscale_all_dim ratio if both are set, else
  0.1 ln s + 1) × attn_factor; cache extended on demand (no length limit).
- rope_variant.py `DynamicNTKScalingRotaryEmbedding`: static NTK at max_len = max_position·s, i.e. base ×
  (s² − s + 1)^(d/(d−2)) at every position (transformers' dynamic NTK evaluated at s·L tokens).
  `Phi3LongRoPEScaledRotaryEmbedding`: per forward batch, long factors if any position > original (positions
  are 0-based, so a batch reaching position L switches), magnitude sqrt(1 + ln(max_position/original)/ln(original))
  unless short_mscale/long_mscale; `attention_factor` not read.
- sglang/srt/utils/hf_transformers/config.py `get_config` (336-437, merge at 405-424): for each top-level key of
  `--json-model-override-args`: a dict for a sub-config (`text_config`) is `update`d one level (transformers'
  `PreTrainedConfig.update`: setattr per key, so a nested `rope_parameters` REPLACES the text config's whole dict and
  its siblings -- rope_theta, partial_rotary_factor, mrope_section -- are lost unless given: sgl-project/sglang#33505);
  `rope_scaling` / `rope_parameters` dicts are merged one level into the current dict (a layer type's dict is
  replaced whole; `rope_scaling` then goes through transformers' setter, which re-standardizes); other keys are set
  as attributes, so a top-level `rope_theta` override is ignored once rope_parameters holds one, and on a composite
  config a top-level rope override lands on the parent, which the text model never reads.
- rope_variant.py `Gemma4RotaryEmbedding` (895-955) and factory.py's proportional branch (428-436): base^(-2i/head_size)
  over the first int(p·head_size // 2) frequencies, zeros beyond; gemma4_causal.py (417-425) hands get_rope only
  rope_type and rope_theta, so a proportional slot's `factor` is never read. SGLang 0.5.23 has no LFM3 model.
- model_loader/utils.py (224-239): architectures SGLang does not implement fall back to transformers' own model
  code (models/transformers.py), where transformers' rotary embedding runs (`engines.transformers_backend`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from .. import hf_config
from ..ported import longrope_magnitude, proportional_inv_freq, rotary_dim, yarn_inv_freq, yarn_magnitude
from ..served import NotServed, Served, default_inv_freq

VERSION = "SGLang 0.5.23"
LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"  # SGLang's permission to serve beyond the model's window
# Positions SGLang keeps back from a prompt: with --context-length N it accepts prompts of at most N - 7 tokens
# (measured in 0.5.15; its managers/tp_worker.py `get_worker_info`: max_req_input_len = min(context_len - 1,
# pool - 1) - 5, and a prompt must be shorter than that). A request of n tokens (n - 1 prompt tokens, one generated)
# that --context-length n serves in every other engine needs n + RESERVED here; the RoPE does not depend on it.
RESERVED = 6
# The architectures (of vLLM's Transformers-backend list) SGLang 0.5.23 has no class for: served through its
# transformers fallback (model_loader/utils.py:224-239).
TRANSFORMERS_FALLBACK = frozenset({
    "CwmForCausalLM", "FlexOlmoForCausalLM", "GlmForCausalLM", "GPTNeoXForCausalLM", "Jais2ForCausalLM",
    "Kolibri1ForCausalLM", "Olmo3ForCausalLM", "SeedOssForCausalLM", "SmolLM3ForCausalLM", "VaultGemmaForCausalLM",
})
NOT_LOADABLE = {"lfm3": "SGLang 0.5.23 has no LFM3 model (nor does the transformers 5.19.0 it pins)"}


def through_transformers(config: dict) -> bool:
    """SGLang serves this config.json's architecture with its transformers fallback."""
    return hf_config.architecture(config) in TRANSFORMERS_FALLBACK


def load_config(config: dict, override_args: dict | None = None) -> tuple[dict, dict]:
    """(the text model's config fields, its full-attention rope_parameters) as SGLang 0.5.23 sees them,
    `--json-model-override-args` applied as it applies them."""
    composite = isinstance(config.get("text_config"), dict)
    fields, rope = hf_config.load(config)
    whole = fields.get("rope_parameters") if _by_layer(fields.get("rope_parameters")) else rope
    for key, value in (override_args or {}).items():
        if composite and key == "text_config" and isinstance(value, dict):  # one level: each key replaced
            for sub, item in value.items():
                fields[sub] = copy.deepcopy(item)
            if "rope_parameters" in value:
                whole = copy.deepcopy(value["rope_parameters"])
                rope = _full(whole) if _by_layer(whole) else hf_config.standardize(fields, whole, None)
        elif composite:
            continue  # set on the parent config: the text model never reads it
        elif key in ("rope_scaling", "rope_parameters") and isinstance(value, dict):
            whole = {**whole, **copy.deepcopy(value)}  # one level
            if _by_layer(whole):
                rope = _full(whole)
            else:
                rope = hf_config.standardize(fields, whole, fields.get("rope_theta")) if key == "rope_scaling" else whole
        else:
            fields[key] = copy.deepcopy(value)
    if _by_layer(whole):
        fields["rope_parameters"] = whole
    return fields, rope


def _by_layer(rope) -> bool:
    return isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict)


def _full(whole: dict) -> dict:
    return whole["full_attention"]


def served(fields: dict, rope: dict, n: int) -> Served | NotServed:
    """cos/sin SGLang 0.5.23 applies to a request of n tokens prefilled in one batch."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    base = rope.get("rope_theta", 10000)
    dim = rotary_dim(fields, rope)
    max_position = int(fields.get("max_position_embeddings", 8192))
    magnitude, note = 1.0, ""
    if rope_type == "proportional":  # Gemma4RotaryEmbedding: over the whole head; the factor never reaches it
        inv_freq, note = proportional_inv_freq(fields, rope), "proportional RoPE: its factor is not read"
    elif rope_type == "default":
        inv_freq = default_inv_freq(dim, base)
    elif rope_type == "linear":
        inv_freq = default_inv_freq(dim, base).double() / float(rope.get("factor", 1.0))
    elif rope_type == "llama3":
        factor = rope.get("factor", 1.0)
        low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        original = rope.get("original_max_position_embeddings", 8192)
        inv = default_inv_freq(dim, base)
        wave_len = 2 * math.pi / inv
        smooth = (original / wave_len - low) / (high - low) if low != high else 0
        inv_freq = torch.where(
            wave_len < original / high,
            inv,
            torch.where(wave_len > original / low, inv / factor, (1 - smooth) * inv / factor + smooth * inv),
        )
    elif rope_type == "dynamic":
        factor = rope.get("factor", 1.0)
        max_len = max_position * factor
        scaled_base = base * ((factor * max_len / max_position) - (factor - 1)) ** (dim / (dim - 2))
        inv_freq = default_inv_freq(dim, scaled_base)
        note = f"static NTK at {int(max_len)} tokens for every request"
        if n > max_len:
            return NotServed(f"SGLang's dynamic cache has {int(max_len)} rows; position {n - 1} is outside it")
    elif rope_type == "yarn":
        factor = float(rope.get("factor", 1.0))
        original = int(rope.get("original_max_position_embeddings", max_position))
        magnitude = yarn_magnitude(rope, factor, set_means_given=True) * rope.get("attn_factor", 1)
        inv_freq = yarn_inv_freq(
            dim, base, factor, original, rope.get("beta_fast", 32), rope.get("beta_slow", 1), rope.get("truncate", True)
        )
        if rope.get("extrapolation_factor", 1) != 1:
            return NotServed("extrapolation_factor != 1 is not modelled here")
    elif rope_type == "longrope":
        original = int(rope.get("original_max_position_embeddings", max_position))
        use_long = n - 1 > original
        magnitude = rope.get("long_mscale" if use_long else "short_mscale") or longrope_magnitude(max_position, original)
        factors = torch.tensor(rope["long_factor" if use_long else "short_factor"], dtype=torch.float32)
        inv_freq = 1.0 / (factors * (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)))
        if n - 1 == original:
            return NotServed(
                f"a batch whose last position is exactly {original} uses the short factors, whose cache ends at "
                f"{original - 1} (off by one against transformers, which switches at {original + 1} tokens)"
            )
        note = f"{'long' if use_long else 'short'} factors (batch positions {'>' if use_long else '<='} {original})"
    else:
        return NotServed(f"rope_type {rope_type!r} is not modelled here")
    return Served(inv_freq=inv_freq, magnitude=float(magnitude), note=note)


def context_length(max_position: int, rope: dict) -> int:
    """sglang/srt/utils/hf_transformers/common.py `get_context_length` (rope_scaling is rope_parameters in 5.x)."""
    factor = rope.get("factor", 1) or 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    return int(factor * max_position)


def own_fix(rope: dict) -> dict:
    """What SGLang 0.5.23 needs added to a model's own rope_parameters to give the magnitude transformers gives it.
    YaRN: SGLang reads no `attention_factor`; its magnitude is (mscale / mscale_all_dim ratio, else 0.1 ln s + 1) x
    attn_factor, so an explicit attention_factor becomes attn_factor = attention_factor / that (copying
    attention_factor into attn_factor squares the scale: sgl-project/sglang#33558). longrope: short_mscale /
    long_mscale."""
    attention = rope.get("attention_factor")
    if attention is None:
        return {}
    if rope.get("rope_type") == "yarn":
        own = yarn_magnitude(rope, float(rope.get("factor", 1.0)), set_means_given=True)
        return {} if math.isclose(float(attention), own, rel_tol=1e-9) else {"attn_factor": float(attention) / own}
    if rope.get("rope_type") == "longrope" and rope.get("short_mscale") is None and rope.get("long_mscale") is None:
        return {"short_mscale": attention, "long_mscale": attention}
    return {}


@dataclass(frozen=True)
class SglangServing:
    """`python -m sglang.launch_server --model-path FOLDER --context-length N [--json-model-override-args JSON]
    [--chunked-prefill-size C]` with `env` (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN): the settings of one route,
    read back by the port (`served_by`) and the run adapter. chunked_prefill_size None: SGLang's default."""

    context_length: int
    override_args: dict | None
    env: dict
    chunked_prefill_size: int | None = None


# server_args.py (0.5.15 and 0.5.23) `_handle_gpu_memory_settings`: --chunked-prefill-size defaults by the device's
# memory, 2048 below 35 GB to 16384 from 160 GB, 4096 where it is unknown; the CPU engine took 2048 (0.5.15, measured).
CHUNK_DEFAULTS = "2048 to 16384 tokens by the device's memory; 2048 on a CPU"


def chunked_longrope(rope: dict, n: int, chunked_prefill_size: int | None) -> NotServed | None:
    """Why a LongRoPE request of n tokens is not served as one batch (None where it is): SGLang prefills a prompt
    in chunks of --chunked-prefill-size tokens and picks the factors per chunk, so a prompt longer than the original
    length keeps the short factors in every chunk below it, unless its first chunk reaches past it."""
    original = int(rope.get("original_max_position_embeddings") or 0)
    if rope.get("rope_type") != "longrope" or n - 1 <= original or chunked_prefill_size == -1:
        return None
    if chunked_prefill_size is not None and chunked_prefill_size >= n - 1:
        return None
    size = f"--chunked-prefill-size {chunked_prefill_size}" if chunked_prefill_size else (
        f"its default --chunked-prefill-size ({CHUNK_DEFAULTS})")
    return NotServed(f"prefilled in chunks of {size}, and SGLang picks LongRoPE's factors per chunk: the chunks "
                     f"below position {original} keep the short factors (transformers: the long ones for the whole "
                     f"prompt); served as one batch with --chunked-prefill-size -1")


def window(fields: dict, rope: dict) -> int:
    """The context length SGLang derives from the config (beyond it, it needs LONGER=1)."""
    return context_length(int(fields.get("max_position_embeddings", 8192)), rope)


def served_by(settings: SglangServing, config: dict, n: int) -> Served | NotServed:
    """What the SGLang server with `settings` applies to a request of n tokens of the checkpoint whose config.json is
    `config` (its architecture through SGLang's own model code or its transformers fallback)."""
    fields, rope = load_config(config, settings.override_args)
    if through_transformers(config):
        from .. import transformers_backend

        return transformers_backend.served(fields, rope, n, VERSION)
    return served(fields, rope, n)


def needs_longer(fields: dict, rope: dict, length: int) -> dict:
    """The environment SGLang needs to serve `length` tokens ({} within its derived window)."""
    return {LONGER: "1"} if length > window(fields, rope) else {}
