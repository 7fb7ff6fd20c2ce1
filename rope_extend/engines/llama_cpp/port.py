"""llama.cpp's RoPE for LLaMA-architecture GGUFs, ported from llama.cpp as vendored in llama-cpp-python 0.3.36
(sdist llama_cpp_python-0.3.36.tar.gz, vendor/llama.cpp).

Sources read:
- conversion/base.py `TextModel.__init__` / `set_gguf_parameters` and conversion/llama.py (what
  convert_hf_to_gguf.py writes): `rope_parameters` (else `rope_scaling`) of the full-attention slot; linear: type +
  factor; yarn: type, factor, original_context_length, yarn_attn_factor (from attention_factor), yarn_beta_fast/slow;
  longrope: the type only (no factor tensors for LLaMA); dynamic: nothing; llama3: a `rope_freqs` tensor;
  freq_base from rope_theta; context_length from max_position_embeddings; dimension_count = head_dim.
- src/llama-model.cpp `load_hparams` (generic part, all architectures): reads context_length, freq_base,
  scaling.type (default "linear"), scaling.factor, original_context_length and scaling.attn_factor (default 1). The
  LLaMA architecture does not read yarn_attn_factor, yarn_beta_fast/slow or yarn_log_multiplier (only grok,
  mistral3 and deepseek2 do). `get_rope_factors`: rope_freqs, else long/short factors by n_ctx_seq (LLaMA GGUFs have
  none).
- src/llama-context.cpp (cparams): CLI values win over GGUF values; yarn_ext_factor = 1 for yarn; when
  ext_factor != 0, yarn_attn_factor is *recomputed* as get_mscale(s) (so --yarn-attn-factor has no effect), then
  divided by (1 + 0.1 ln s) and multiplied by the GGUF key `<arch>.rope.scaling.attn_factor`.
- ggml/src/ggml-cpu/ops.cpp `rope_yarn` / `ggml_rope_cache_init` and ggml/src/ggml.c `ggml_rope_yarn_corr_dims`:
  θ_i = p·theta_scale^i (iterated in float32), divided by the rope_freqs factor; interpolated θ = freq_scale·θ;
  ramp bounds always floorf/ceilf (no truncate=false); cos/sin × attn_factor × (1 + 0.1 ln(1/freq_scale)) when
  ext_factor != 0.
- common/arg.cpp: --rope-scaling {none,linear,yarn}, --rope-scale N (freq_scale = 1/N), --rope-freq-base,
  --rope-freq-scale, --yarn-orig-ctx, --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast/-slow, --override-kv
  KEY=TYPE:VALUE (applied to the GGUF metadata at load).
"""

from __future__ import annotations

import math
import shlex

import numpy as np
import torch

from ..served import NotServed, Served

VERSION = "llama.cpp as vendored in llama-cpp-python 0.3.36"
# HF model types convert_hf_to_gguf.py maps to the LLaMA architecture (conversion/llama.py registrations we model).
LLAMA_ARCH_MODEL_TYPES = ("llama", "mistral")
ARCH = "llama"


def convert(config: dict) -> dict:
    """The RoPE metadata convert_hf_to_gguf.py writes for a LLaMA-family config.json (keys without the arch prefix;
    `rope_freqs` holds the llama3 factor tensor)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    rope = dict(text.get("rope_parameters", text.get("rope_scaling")) or {})
    if "full_attention" not in rope and "sliding_attention" not in rope:
        if "rope_theta" not in rope and text.get("rope_theta") is not None:
            rope["rope_theta"] = text["rope_theta"]
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        if "original_max_position_embeddings" not in rope and text.get("original_max_position_embeddings"):
            rope["original_max_position_embeddings"] = text["original_max_position_embeddings"]
    rope = rope.get("full_attention", rope)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    meta: dict = {"context_length": int(text["max_position_embeddings"]), "rope.dimension_count": int(head_dim)}
    rope_type, factor = rope.get("rope_type"), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        meta.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(factor)})
    elif rope_type == "yarn" and factor is not None:
        meta.update(
            {
                "rope.scaling.type": "yarn",
                "rope.scaling.factor": float(factor),
                "rope.scaling.original_context_length": int(rope["original_max_position_embeddings"]),
            }
        )
        for src, key in (("attention_factor", "yarn_attn_factor"), ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if rope.get(src) is not None:
                meta[f"rope.scaling.{key}"] = float(rope[src])  # written, but not read by the LLaMA architecture
    elif rope_type in ("su", "longrope"):
        meta["rope.scaling.type"] = "longrope"
    elif rope_type == "llama3":
        meta["rope_freqs"] = _llama3_rope_freqs(rope, head_dim)
    if rope.get("rope_theta") is not None:
        meta["rope.freq_base"] = float(rope["rope_theta"])
    return meta


def _llama3_rope_freqs(rope: dict, dim: int) -> list[float]:
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(float(factor))
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(float(1 / ((1 - smooth) / factor + smooth)))
    return out


def parse_flags(flags: str | list[str]) -> dict:
    """The RoPE-related llama.cpp CLI options (common/arg.cpp), as {param: value}; overrides under 'override_kv'."""
    args = shlex.split(flags) if isinstance(flags, str) else list(flags)
    params: dict = {"override_kv": {}}
    floats = {
        "--rope-freq-base": "rope_freq_base",
        "--rope-freq-scale": "rope_freq_scale",
        "--yarn-ext-factor": "yarn_ext_factor",
        "--yarn-attn-factor": "yarn_attn_factor",
        "--yarn-beta-fast": "yarn_beta_fast",
        "--yarn-beta-slow": "yarn_beta_slow",
    }
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        if flag == "--rope-scaling":
            if value not in ("none", "linear", "yarn"):
                raise ValueError(f"--rope-scaling {value!r}: llama.cpp accepts none, linear, yarn")
            params["rope_scaling_type"] = value
        elif flag == "--rope-scale":
            params["rope_freq_scale"] = float(np.float32(1.0) / np.float32(value))
        elif flag in floats:
            params[floats[flag]] = float(np.float32(value))
        elif flag in ("--yarn-orig-ctx",):
            params["yarn_orig_ctx"] = int(value)
        elif flag in ("-c", "--ctx-size"):
            params["n_ctx"] = int(value)
        elif flag == "--override-kv":
            for item in value.split(","):
                key, typed = item.split("=", 1)
                kind, raw = typed.split(":", 1)
                params["override_kv"][key] = float(raw) if kind == "float" else int(raw) if kind == "int" else raw
        else:
            i += 1
            continue
        i += 2
    return params


def served(meta: dict, flags: str | list[str], n: int, arch: str = ARCH) -> Served | NotServed:
    """cos/sin llama.cpp applies at positions 0..n-1 for a GGUF with `meta` run with `flags`."""
    params = parse_flags(flags)
    meta = dict(meta)
    for key, value in params["override_kv"].items():
        if not key.startswith(f"{arch}."):
            continue
        meta[key[len(arch) + 1 :]] = value
    f32 = np.float32
    # hparams (llama-model.cpp load_hparams, generic part)
    n_ctx_train = int(meta["context_length"])
    n_ctx_orig_yarn = int(meta.get("rope.scaling.original_context_length", n_ctx_train))
    freq_base_train = f32(meta.get("rope.freq_base", 10000.0))
    scaling_train = meta.get("rope.scaling.type", "linear")
    ropescale = f32(meta.get("rope.scaling.factor", 0.0))
    freq_scale_train = f32(1.0) if ropescale == 0 else f32(1.0) / ropescale
    rope_attn_factor = f32(meta.get("rope.scaling.attn_factor", 1.0))
    n_rot = int(meta["rope.dimension_count"])
    # cparams (llama-context.cpp)
    ext_factor = f32(params.get("yarn_ext_factor", -1.0))
    attn_factor = f32(params.get("yarn_attn_factor", 1.0))  # hparams.yarn_attn_factor = 1 for LLaMA
    beta_fast = f32(params.get("yarn_beta_fast", 32.0))
    beta_slow = f32(params.get("yarn_beta_slow", 1.0))
    freq_base = f32(params["rope_freq_base"]) if params.get("rope_freq_base") else freq_base_train
    freq_scale = f32(params["rope_freq_scale"]) if params.get("rope_freq_scale") else freq_scale_train
    n_ctx_orig = int(params.get("yarn_orig_ctx") or n_ctx_orig_yarn or n_ctx_train)
    scaling = params.get("rope_scaling_type", scaling_train)
    if scaling == "none":
        freq_scale = f32(1.0)
    if ext_factor < 0:
        ext_factor = f32(1.0 if scaling == "yarn" else 0.0)
    if ext_factor != 0:
        factor = f32(1.0) / freq_scale
        attn_factor = _get_mscale(factor, f32(1.0))  # recomputed: the --yarn-attn-factor value is dropped
        attn_factor = f32(attn_factor * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor, dtype=np.float32))))
    attn_factor = f32(attn_factor * rope_attn_factor)
    # kernel (ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims)
    theta_scale = f32(np.power(freq_base, f32(-2.0) / f32(n_rot), dtype=np.float32))
    half = n_rot // 2
    theta = np.empty(half, dtype=np.float32)
    value = f32(1.0)
    for i in range(half):
        theta[i] = value
        value = f32(value * theta_scale)
    freq_factors = meta.get("rope_freqs")
    if freq_factors is not None:
        theta = (theta / np.asarray(freq_factors, dtype=np.float32)).astype(np.float32)
    mscale = attn_factor
    if ext_factor != 0:
        low, high = _corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
        i = np.arange(half, dtype=np.float32)
        y = (i - low) / max(f32(0.001), f32(high - low))
        ramp_mix = (1 - np.minimum(1, np.maximum(0, y))) * ext_factor
        inv_freq = theta * freq_scale * (1 - ramp_mix) + theta * ramp_mix
        mscale = f32(mscale * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / freq_scale, dtype=np.float32)))
    else:
        inv_freq = theta * freq_scale
    note = f"magnitude {float(mscale):.6f}"
    if params.get("n_ctx") and n > params["n_ctx"]:
        return NotServed(f"-c {params['n_ctx']} holds {params['n_ctx']} positions; position {n - 1} is outside it")
    return Served(inv_freq=torch.from_numpy(np.asarray(inv_freq, dtype=np.float32)), magnitude=float(mscale), note=note)


def _get_mscale(scale, mscale):
    f32 = np.float32
    return f32(1.0) if scale <= 1 else f32(f32(0.1) * mscale * np.log(scale, dtype=np.float32) + f32(1.0))


def _corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow) -> tuple[float, float]:
    f32 = np.float32

    def corr(rot):
        return f32(n_dims * np.log(f32(n_ctx_orig) / (rot * f32(2) * f32(math.pi)), dtype=np.float32)) / (
            f32(2) * np.log(base, dtype=np.float32)
        )

    start, end = math.floor(corr(beta_fast)), math.ceil(corr(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))
