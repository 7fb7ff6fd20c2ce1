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
- sglang/srt/utils/hf_transformers/config.py `get_config`: `--json-model-override-args` keys `rope_scaling` /
  `rope_parameters` are merged into the current dict (then transformers' setter re-standardizes); other keys are
  set as attributes, so a top-level `rope_theta` override is ignored once rope_parameters holds one.
"""

from __future__ import annotations

import copy
import math

import torch

from .. import compat
from ..methods import engine_rules
from . import hf_config
from .served import MODEL, EngineHint, NotServed, Served, default_inv_freq, fmt_float
from .vllm import compact_json, full_slot, longrope_magnitude, rotary_dim, yarn_inv_freq

VERSION = "SGLang 0.5.23"
NAME = "sglang"
LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"  # SGLang's permission to serve beyond the model's window
# Positions SGLang keeps back from a prompt: with --context-length N it accepts prompts of at most N - 7 tokens
# (measured in 0.5.15; its managers/tp_worker.py `get_worker_info`: max_req_input_len = min(context_len - 1,
# pool - 1) - 5, and a prompt must be shorter than that). A request of n tokens (n - 1 prompt tokens, one generated)
# that --context-length n serves in every other engine needs n + RESERVED here; the RoPE does not depend on it.
RESERVED = 6


def load_config(config: dict, override_args: dict | None = None) -> tuple[dict, dict]:
    """(config fields, rope_parameters) as SGLang 0.5.23 sees them, `--json-model-override-args` applied."""
    fields, rope = hf_config.load(config)
    for key, value in (override_args or {}).items():
        if key in ("rope_scaling", "rope_parameters") and isinstance(value, dict):
            merged = {**rope, **copy.deepcopy(value)}
            rope = hf_config.standardize(fields, merged, fields.get("rope_theta")) if key == "rope_scaling" else merged
        else:
            fields[key] = copy.deepcopy(value)
    return fields, rope


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def served(fields: dict, rope: dict, n: int) -> Served | NotServed:
    """cos/sin SGLang 0.5.23 applies to a request of n tokens prefilled in one batch."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    base = rope.get("rope_theta", 10000)
    dim = rotary_dim(fields, rope)
    max_position = int(fields.get("max_position_embeddings", 8192))
    magnitude, note = 1.0, ""
    if rope_type == "default":
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
        if rope.get("mscale") is not None and rope.get("mscale_all_dim") is not None:
            magnitude = _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
        else:
            magnitude = _mscale(factor)
        magnitude *= rope.get("attn_factor", 1)
        inv_freq = yarn_inv_freq(
            dim, base, factor, original, rope.get("beta_fast", 32), rope.get("beta_slow", 1), rope.get("truncate", True)
        )
        if rope.get("extrapolation_factor", 1) != 1:
            return NotServed("extrapolation_factor != 1 is not modelled here")
    elif rope_type == "longrope":
        original = int(rope.get("original_max_position_embeddings", max_position))
        use_long = n - 1 > original
        scale = max_position / original
        default_m = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
        magnitude = rope.get("long_mscale" if use_long else "short_mscale") or default_m
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


def serving_rule(plan) -> EngineHint:
    """The SGLang command for OUT and `--json-model-override-args` for the original model; the method's rules
    (`methods.engine_rules`) add what SGLang does differently."""
    full = full_slot(plan)
    rule = engine_rules(plan.method).rule("sglang", plan, VERSION)
    L, target = plan.spec.original_max_position_embeddings, rule.max_len or plan.spec.target_length
    rope_parameters = dict(full)
    fix: dict = {}
    if full.get("rope_type") == "yarn":
        # SGLang ignores attention_factor; its magnitude is (mscale ratio or 0.1 ln s + 1) × attn_factor
        factor = float(full["factor"])
        if full.get("mscale") is not None and full.get("mscale_all_dim") is not None:
            own = _mscale(factor, full["mscale"]) / _mscale(factor, full["mscale_all_dim"])
        else:
            own = _mscale(factor)
        if not math.isclose(plan.attention_factor, own, rel_tol=1e-9):
            fix["attn_factor"] = plan.attention_factor / own
    if full.get("rope_type") == "longrope":
        default = longrope_magnitude(plan.max_position_embeddings, L)
        if not math.isclose(plan.attention_factor, default, rel_tol=1e-9):
            fix.update({"short_mscale": plan.attention_factor, "long_mscale": plan.attention_factor})
    rope_parameters.update(fix)
    original_overrides = {"rope_theta": full["rope_theta"]}
    scaling = compat.scaling_dict(full)
    if scaling is not None:
        original_overrides["rope_scaling"] = scaling
    original_overrides["rope_parameters"] = rope_parameters
    original_overrides["max_position_embeddings"] = plan.max_position_embeddings
    # the whole rope_parameters, fix included: SGLang 0.5.15 (transformers 5.12 inside) replaces the checkpoint's
    # rope_parameters with an override's, where 0.5.23 merges them ({"attn_factor": x} alone: "Unknown RoPE scaling
    # type", measured by make sglang-check on ntk-by-parts); the whole dict is read the same by both
    out_overrides = {"rope_parameters": rope_parameters} if fix else {}
    derived = context_length(plan.max_position_embeddings, full)
    env = {LONGER: "1"} if target > derived else {}
    extra = f" --json-model-override-args '{compact_json(out_overrides)}'" if out_overrides else ""
    notes = list(rule.notes)
    notes.append(
        f"SGLang accepts prompts of at most N − {RESERVED + 1} tokens at --context-length N (measured in 0.5.15: it "
        f"keeps {RESERVED} positions back); for a prompt of all {target} tokens, give --context-length "
        f"{target + RESERVED + 1} with {LONGER}=1"
    )
    if "attn_factor" in fix:
        notes.append(
            f"{VERSION} ignores attention_factor; attn_factor {fmt_float(fix['attn_factor'])} in the overrides "
            "gives it the same magnitude"
        )
    return EngineHint(
        engine="SGLang",
        version=VERSION,
        command=f"{''.join(f'{k}={v} ' for k, v in env.items())}python -m sglang.launch_server --model-path {MODEL} --context-length {target}{extra}",
        original=f"--json-model-override-args '{compact_json(original_overrides)}'",
        args={"out_overrides": out_overrides, "original_overrides": original_overrides, "context_length": target,
              "env": env},
        warnings=rule.warnings,
        notes=notes,
    )


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
        factor = float(rope.get("factor", 1.0))
        if rope.get("mscale") is not None and rope.get("mscale_all_dim") is not None:
            own = _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
        else:
            own = _mscale(factor)
        return {} if math.isclose(float(attention), own, rel_tol=1e-9) else {"attn_factor": float(attention) / own}
    if rope.get("rope_type") == "longrope" and rope.get("short_mscale") is None and rope.get("long_mscale") is None:
        return {"short_mscale": attention, "long_mscale": attention}
    return {}
