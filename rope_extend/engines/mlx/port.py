"""mlx-lm's config reading and RoPE, ported from mlx-lm 0.32.2 (wheel mlx_lm-0.32.2-py3-none-any.whl on mlx 0.32.4 /
mlx-cpu 0.32.4, the versions `env.py` installs; line numbers of the installed files).

Sources read:
- mlx_lm/utils.py `load` (648-) -> `load_model` (409-): config.json through `load_config` (363-378), then
  `config.update(model_config)` (446-447): `mlx_lm.load(path, model_config={...})` replaces top-level keys whole (a
  `rope_scaling` given there replaces the file's dict). No CLI flag takes a model_config: `mlx_lm.generate` and
  `mlx_lm.server` load the folder's config.json as it is. `_get_classes` (200-227) picks models/<model_type>.py after
  `MODEL_REMAPPING` (48-61: mistral, iquestcoder and xverse are served by llama.py).
- mlx_lm/models/base.py `BaseModelArgs.from_dict` (14-21): keys the model's ModelArgs does not declare are dropped,
  silently.
- mlx_lm/models/llama.py `ModelArgs` (17-42): `rope_theta` (default 10000), `rope_traditional`, `rope_scaling`
  (default None), `max_position_embeddings`, `head_dim` (default hidden_size // num_attention_heads); no
  `rope_parameters`: a transformers-5 config.json with only `rope_parameters` loads as plain RoPE at base 10000.
  `Attention` (66-72) builds `initialize_rope(head_dim, rope_theta, rope_traditional, rope_scaling,
  max_position_embeddings)` and (89-95) rotates q and k with `offset=cache.offset` at every forward call.
- mlx_lm/models/rope_utils.py `initialize_rope` (291-373): the type is `rope_scaling["type"]`, else
  `["rope_type"]` (298-301); `default`/`linear`: `nn.RoPE` with scale 1/factor on the positions (305-307);
  `dynamic`: `DynamicNTKScalingRoPE` (309-316; 234-271): at every call, base x (factor·s/mpe − (factor − 1))^(d/(d−2))
  with s = max(offset + the call's tokens, max_position_embeddings); `llama3` (318-325; 72-123); `yarn`,
  `deepseek_yarn`, `telechat3-yarn` (326-346; `YarnRoPE` 126-195): reads original_max_position_embeddings (default
  4096), beta_fast, beta_slow, mscale (default 1) and mscale_all_dim (default 0) only -- not `attention_factor`
  (its magnitude is get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)), not `truncate` (the
  correction range is always floored and ceiled, 150-153); `longrope` (347-357; `SuScaledRoPE` 10-69): the long
  factors at every position, magnitude sqrt(1 + ln(max_position_embeddings/original)/ln(original)) (short_mscale,
  long_mscale and attention_factor are not passed); `proportional` (358-365; 198-231); `mrope` (366-371: plain
  RoPE); any other type raises `ValueError: Unsupported RoPE type <type>` (372-373).
- mlx_lm/generate.py `generate_step` (313-468, behind `mlx_lm.generate` and `stream_generate`): the prompt but its
  last token is prefilled into the KV cache in chunks of `prefill_step_size` tokens (437-461; default 2048,
  `DEFAULT_PREFILL_STEP_SIZE` 50, CLI `--prefill-step-size` 180-186), then the last prompt token (465), then one
  token per step. The server's `BatchGenerator` prefills the same chunks (1192-1247; `--prefill-step-size`, default
  2048: server.py 2037-2040). With the cache, the keys of an earlier chunk stay as that chunk rotated them: for
  `dynamic` each chunk has its own scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..ported import longrope_magnitude
from ..served import NotServed, Served, default_inv_freq, positions

VERSION = "mlx-lm 0.32.2"
PREFILL_STEP = 2048  # generate.py DEFAULT_PREFILL_STEP_SIZE; server.py --prefill-step-size's default
LLAMA_TYPES = ("llama", "mistral", "iquestcoder", "xverse")  # served by models/llama.py (utils.py MODEL_REMAPPING)
YARN_TYPES = ("yarn", "deepseek_yarn", "telechat3-yarn")
REFUSED = "Unsupported RoPE type"  # rope_utils.py:373, mlx-lm's words


@dataclass(frozen=True)
class MlxServing:
    """`mlx_lm.load(FOLDER, model_config=...)` (None: the folder's config.json alone, as `mlx_lm.generate --model
    FOLDER` loads it), requests prefilled `prefill_step` tokens at a time (`--prefill-step-size`)."""

    model_config: dict | None
    prefill_step: int = PREFILL_STEP


def load_config(config: dict, model_config: dict | None = None) -> tuple[dict, dict | None]:
    """(fields, rope_scaling) as mlx-lm 0.32.2's llama model reads `config` (a config.json dict) loaded with
    `mlx_lm.load(path, model_config=model_config)`: the overrides replace top-level keys, then only ModelArgs'
    fields are kept. `fields["dropped"]` says what transformers 5's `rope_parameters` holds that mlx-lm, which
    never reads it, serves otherwise ("" when they agree)."""
    merged = dict(config)
    merged.update(model_config or {})
    model_type = str(merged.get("model_type", ""))
    heads = merged.get("num_attention_heads")
    head_dim = merged.get("head_dim") or (merged["hidden_size"] // heads if heads and "hidden_size" in merged else None)
    fields = {
        "model_type": "llama" if model_type in LLAMA_TYPES else model_type,
        "rope_theta": merged.get("rope_theta", 10000),
        "rope_traditional": bool(merged.get("rope_traditional", False)),
        "max_position_embeddings": merged.get("max_position_embeddings"),
        "head_dim": head_dim,
    }
    scaling = merged.get("rope_scaling")
    rope = dict(scaling) if isinstance(scaling, dict) else None
    fields["dropped"] = _dropped(merged.get("rope_parameters"), fields["rope_theta"], rope)
    return fields, rope


def _dropped(parameters, theta, rope: dict | None) -> str:
    """What transformers 5's `rope_parameters` says and mlx-lm, which never reads it, serves otherwise ("" if it
    agrees or is absent)."""
    if not isinstance(parameters, dict) or not isinstance(parameters.get("rope_theta", theta), (int, float)):
        return ""  # absent, or nested per layer type (not a llama config)
    said, served = parameters.get("rope_theta", theta), theta
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if float(said) == float(served) and kind == rope_type(rope):
        return ""
    return (f"rope_parameters (rope_theta {said}, rope_type {kind}) not read: mlx-lm reads rope_theta {served} and "
            f"rope_scaling {rope_type(rope) if rope else None}")


def rope_type(rope: dict | None) -> str:
    """rope_utils.py:298-301: `type` first, then `rope_type`, else default."""
    return (rope.get("type") or rope.get("rope_type", "default")) if rope is not None else "default"


def calls(n: int, prefill_step: int | None = PREFILL_STEP) -> list[tuple[int, int]]:
    """(offset, tokens) of every forward call `generate_step` makes for a request of n tokens (its n - 1 prompt
    tokens, then the generated one): the prefill chunks, the last prompt token, the generated token. prefill_step None:
    one forward call over all n positions (what `model(ids)` does, as mlx_lm.perplexity runs it)."""
    if prefill_step is None:
        return [(0, n)]
    prompt, done, out = n - 1, 0, []
    while prompt - done > 1:  # generate.py:437-461
        take = min(prefill_step, prompt - done - 1)
        out.append((done, take))
        done += take
    out.append((done, prompt - done))  # the last prompt token (generate.py:465)
    out.append((prompt, 1))  # the generated token, fed at the next step
    return out


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_magnitude(rope: dict) -> float:
    """YarnRoPE's magnitude (rope_utils.py:169-171): get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)."""
    factor = float(rope["factor"])
    return _get_mscale(factor, rope.get("mscale", 1)) / _get_mscale(factor, rope.get("mscale_all_dim", 0))


def _yarn_inv_freq(dims: int, base: float, rope: dict) -> torch.Tensor:
    """1 / YarnRoPE._freqs (rope_utils.py:142-178), in float32 as mlx computes it."""
    factor = float(rope["factor"])
    original = rope.get("original_max_position_embeddings", 4096)
    beta_fast, beta_slow = rope.get("beta_fast", 32), rope.get("beta_slow", 1)

    def correction_dim(rotations):
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dims - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    extra = base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)
    inter = factor * extra
    return 1.0 / ((inter * extra) / (inter * mask + extra * (1 - mask)))


def _llama3_inv_freq(dims: int, base: float, rope: dict) -> torch.Tensor:
    """1 / Llama3RoPE._freqs (rope_utils.py:86-106), in float32."""
    factor = rope["factor"]
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    freqs = base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)
    wavelens = 2 * math.pi * freqs
    freqs = torch.where(wavelens > old / low, freqs * factor, freqs)
    medium = (wavelens > old / high) & (wavelens < old / low)
    smooth = (old / wavelens - low) / (high - low)
    return 1.0 / torch.where(medium, freqs / ((1 - smooth) / factor + smooth), freqs)


def served(fields: dict, rope: dict | None, n: int, *, prefill_step: int | None = PREFILL_STEP) -> Served | NotServed:
    """The cos/sin mlx-lm 0.32.2 applies at positions 0..n-1 of a request of n tokens served through `generate_step`
    with `prefill_step` (None: one forward call). Explicit cos/sin (at `served.positions(n)`) where positions of
    different prefill chunks get different frequencies (dynamic beyond max_position_embeddings)."""
    model_type = fields["model_type"]
    if model_type != "llama":
        return NotServed(f"mlx-lm serves model_type {model_type!r} with its own models/ file, which this port "
                         f"({VERSION}, models/llama.py) does not model")
    if fields["head_dim"] is None:
        return NotServed("the config gives neither head_dim nor hidden_size and num_attention_heads")
    if fields["rope_traditional"]:
        return NotServed("rope_traditional: mlx-lm rotates interleaved pairs, transformers the two halves")
    kind, base, dims = rope_type(rope), float(fields["rope_theta"]), int(fields["head_dim"])
    notes = [fields["dropped"]] if fields["dropped"] else []
    magnitude = 1.0
    try:
        if kind in ("default", "linear", "mrope"):
            inv_freq = default_inv_freq(dims, base)
            if kind == "linear":
                inv_freq = inv_freq.double() * (1 / rope["factor"])  # nn.RoPE(scale=1/factor) scales the positions
            if kind == "mrope":
                notes.append("mrope_section not read: plain RoPE")
        elif kind == "dynamic":
            return _dynamic(fields, rope, n, prefill_step, base, dims)
        elif kind == "llama3":
            inv_freq = _llama3_inv_freq(dims, base, rope)
        elif kind in YARN_TYPES:
            inv_freq = _yarn_inv_freq(dims, base, rope)
            magnitude = yarn_magnitude(rope)
            given = rope.get("attention_factor")
            if given is not None and not math.isclose(float(given), magnitude, rel_tol=1e-9):
                notes.append(f"attention_factor {given:.6g} not read (magnitude {magnitude:.6g})")
            if rope.get("truncate") is False:
                notes.append("truncate: false not read")
        elif kind == "longrope":
            original = rope["original_max_position_embeddings"]
            factors = torch.tensor(rope["long_factor"], dtype=torch.float32)
            inv_freq = 1.0 / (factors * base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims))
            magnitude = longrope_magnitude(fields["max_position_embeddings"], original)
            notes.append("long factors at every position")
        elif kind == "proportional":
            rotated = int(dims * rope.get("partial_rotary_factor", 1.0))
            freqs = rope.get("factor", 1.0) * base ** (torch.arange(0, rotated, 2, dtype=torch.float32) / dims)
            inv_freq = torch.cat([1.0 / freqs, torch.zeros((dims - rotated) // 2)])
        else:
            return NotServed(f"mlx-lm refuses to load it: ValueError: {REFUSED} {kind}")
    except (KeyError, TypeError) as exc:  # what initialize_rope would raise on this dict
        return NotServed(f"mlx-lm fails to load it: {type(exc).__name__}: {exc}")
    return Served(inv_freq=inv_freq, magnitude=float(magnitude), note="; ".join(notes))


def dynamic_base(base: float, factor: float, dims: int, seq_len: int, max_position: int) -> float:
    """DynamicNTKScalingRoPE.__call__ (rope_utils.py:258-263) for a call ending at seq_len."""
    seq_len = max(seq_len, max_position)
    return base * ((factor * seq_len / max_position) - (factor - 1)) ** (dims / (dims - 2))


def _dynamic(fields, rope, n, prefill_step, base, dims) -> Served | NotServed:
    max_position = fields["max_position_embeddings"]
    if max_position is None:
        return NotServed("mlx-lm's dynamic RoPE needs max_position_embeddings (TypeError at the first call)")
    factor = float(rope["factor"])
    schedule = calls(n, prefill_step)
    bases = [dynamic_base(base, factor, dims, offset + tokens, max_position) for offset, tokens in schedule]
    if len(set(bases)) == 1:
        note = "" if bases[0] == base else f"dynamic NTK at {n} tokens (one forward call)"
        return Served(inv_freq=default_inv_freq(dims, bases[0]), note=note)
    at = positions(n)
    inv = np.zeros((n, dims // 2))
    for (offset, tokens), chunk_base in zip(schedule, bases):
        inv[offset: offset + tokens] = default_inv_freq(dims, chunk_base).double().numpy()
    angles = at.astype(np.float64)[:, None] * inv[at]
    ends = [offset + tokens for offset, tokens in schedule if offset + tokens > max_position]
    note = (f"dynamic NTK scaled per forward call ({_steps(prefill_step)}; the KV cache keeps each call's keys as it "
            f"rotated them): calls ending by {max_position} tokens keep the unscaled base, later ones the scale at "
            f"their end ({', '.join(map(str, ends[:3]))}{', ...' if len(ends) > 3 else ''} tokens), not the "
            f"request's {n}")
    return Served(inv_freq=None, cos=np.cos(angles), sin=np.sin(angles), note=note)


def _steps(prefill_step: int | None) -> str:
    return "one forward" if prefill_step is None else f"prefill {prefill_step} tokens at a time"
