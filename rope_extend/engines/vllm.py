"""vLLM's RoPE, ported from vLLM 0.33.0 (wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl).

Sources read:
- vllm/model_executor/layers/rotary_embedding/__init__.py `get_rope`: dispatch on `rope_parameters["rope_type"]`;
  `max_position` is the model's `max_position_embeddings` (vllm/model_executor/models/llama.py).
- base.py (cache of `max_position` rows), linear_scaling_rope.py (t / s, max_position·s rows), llama3_rope.py,
  yarn_scaling_rope.py (attention_factor > mscale/mscale_all_dim > 0.1 ln s + 1; truncate honoured; cache of
  original·s rows), dynamic_ntk_scaling_rope.py (base scaled by (s·max_position/max_trained_positions − (s−1)), and
  max_trained_positions defaults to max_position: the unscaled base, cache of max_position rows),
  phi3_long_rope_scaled_rope.py (long factors at every position once max_model_len > original; magnitude
  sqrt(1 + ln(max_position/original)/ln(original)) unless short_mscale/long_mscale; `attention_factor` not read).
- vllm/transformers_utils/config.py `get_config`: flat `--hf-overrides` keys go through `config.update` before
  `patch_rope_parameters` (whose `standardize_rope_params` only setdefaults `rope_theta`, so a flat rope_theta
  override is lost when the config already has rope_parameters); vllm/config/model.py applies dict-valued
  overrides afterwards with setattr (`rope_scaling` through transformers' setter, which replaces rope_parameters
  and re-standardizes; `rope_parameters` replaced as is).
- vllm/config/model.py `_get_and_verify_max_len`: derived max length = max_position_embeddings × factor except for
  yarn/llama3/longrope; beyond it VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is required.
vLLM 0.33 requires transformers >= 5.16, so configs are read the transformers-5 way (`hf_config.load`).
"""

from __future__ import annotations

import copy
import json
import math

import torch

from .. import compat
from ..methods import engine_rules
from . import hf_config
from .served import MODEL, EngineHint, NotServed, Served, default_inv_freq

VERSION = "vLLM 0.33.0"
NAME = "vllm"
NO_DERIVED_FACTOR = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def load_config(config: dict, hf_overrides: dict | None = None) -> tuple[dict, dict]:
    """(config fields, rope_parameters) as vLLM 0.33 sees them, `--hf-overrides` applied as vLLM applies them."""
    fields, rope = hf_config.load(config)
    overrides = dict(hf_overrides or {})
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in overrides.items() if isinstance(v, dict)}
    fields.update(flat)
    # patch_rope_parameters -> standardize_rope_params: setdefault only
    rope = hf_config.standardize(fields, rope, flat.get("rope_theta"))
    for key, value in nested.items():
        if key == "rope_scaling":  # transformers' setter: replace, then standardize with the config's rope_theta
            rope = hf_config.standardize(fields, copy.deepcopy(value), flat.get("rope_theta"))
        elif key == "rope_parameters":
            rope = copy.deepcopy(value)
        else:
            fields[key] = copy.deepcopy(value)
    return fields, rope


def derived_max_model_len(fields: dict, rope: dict) -> float:
    """The longest --max-model-len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    derived = float(fields.get("max_position_embeddings", 2048))
    if rope.get("rope_type", "default") not in NO_DERIVED_FACTOR:
        derived *= float(rope.get("factor") or 1.0)
    return derived


def rotary_dim(fields: dict, rope: dict) -> int:
    head_size = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    return int(head_size * rope.get("partial_rotary_factor", 1.0))


def _yarn_correction_range(beta_fast, beta_slow, dim, base, original, truncate):
    def corr(rot):
        return (dim * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, truncate):
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = _yarn_correction_range(beta_fast, beta_slow, dim, base, original, truncate)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    return interpolation * (1 - mask) + extrapolation * mask


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


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
    if rope_type == "default":
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
        elif rope.get("mscale") and rope.get("mscale_all_dim"):
            magnitude = _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
        else:
            magnitude = _mscale(factor)
        inv_freq = yarn_inv_freq(
            dim, base, factor, original, rope.get("beta_fast", 32), rope.get("beta_slow", 1), rope.get("truncate", True)
        )
        rows = int(original * factor)
    elif rope_type == "longrope":
        original = int(rope["original_max_position_embeddings"])
        use_long = max_model_len > original
        scale = max_position / original
        default_m = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
        magnitude = rope.get("long_mscale" if use_long else "short_mscale") or default_m
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


def serving_rule(plan) -> EngineHint:
    """The vLLM command for OUT and `--hf-overrides` for the original model; the method's rules
    (`methods.engine_rules`) add what vLLM does differently."""
    full = full_slot(plan)
    rule = engine_rules(plan.method).rule("vllm", plan, VERSION)
    L = plan.spec.original_max_position_embeddings
    max_model_len = rule.max_len or plan.spec.target_length
    rope_parameters = dict(full)
    out_overrides: dict = {}
    if full.get("rope_type") == "longrope":
        default = longrope_magnitude(plan.max_position_embeddings, L)
        if not math.isclose(plan.attention_factor, default, rel_tol=1e-9):
            # vLLM ignores attention_factor for longrope; it reads short_mscale / long_mscale
            rope_parameters.update({"short_mscale": plan.attention_factor, "long_mscale": plan.attention_factor})
            out_overrides = {"rope_parameters": rope_parameters}
    original_overrides = {"rope_theta": full["rope_theta"]}
    scaling = compat.scaling_dict(full)
    if scaling is not None:
        original_overrides["rope_scaling"] = scaling
    original_overrides["rope_parameters"] = rope_parameters  # what vLLM 0.33 reads (transformers 5 configs)
    original_overrides["max_position_embeddings"] = plan.max_position_embeddings
    fields = {"max_position_embeddings": plan.max_position_embeddings}
    env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"} if max_model_len > derived_max_model_len(fields, full) else {}
    prefix = "".join(f"{key}={value} " for key, value in env.items())
    extra = f" --hf-overrides '{compact_json(out_overrides)}'" if out_overrides else ""
    return EngineHint(
        engine="vLLM",
        version=VERSION,
        command=f"{prefix}vllm serve {MODEL} --max-model-len {max_model_len}{extra}",
        original=f"--hf-overrides '{compact_json(original_overrides)}'",
        args={"max_model_len": max_model_len, "out_overrides": out_overrides, "original_overrides": original_overrides,
              "env": env},
        warnings=rule.warnings,
        notes=rule.notes,
    )


def longrope_magnitude(max_position: int, original: int) -> float:
    scale = max_position / original
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))


def full_slot(plan) -> dict:
    return plan.slots.get("full_attention", plan.slots.get(None))


def compact_json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def own_fix(rope: dict) -> dict:
    """What vLLM 0.33 needs added to a model's own rope_parameters to give the magnitude transformers gives it:
    longrope's explicit attention_factor, which vLLM does not read (it reads short_mscale / long_mscale)."""
    if rope.get("rope_type") == "longrope" and rope.get("attention_factor") is not None:
        if rope.get("short_mscale") is None and rope.get("long_mscale") is None:
            return {"short_mscale": rope["attention_factor"], "long_mscale": rope["attention_factor"]}
    return {}
