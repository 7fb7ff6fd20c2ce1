"""A spec planned on a GGUF: the metadata llama.cpp reads, checked with llama.cpp's RoPE math before anything is
written (per-method keys come from the method's `GgufRules`).

What llama.cpp reads, checked in the source vendored in ``llama-cpp-python`` 0.3.36 (``vendor/llama.cpp``):

- ``src/llama-model.cpp`` (``load_hparams``, every architecture): ``<arch>.context_length`` (n_ctx_train),
  ``<arch>.rope.freq_base`` (default 10000), ``<arch>.rope.scaling.type`` (default "linear"),
  ``<arch>.rope.scaling.factor`` (freq_scale = 1/factor), ``<arch>.rope.scaling.original_context_length``
  (n_ctx_orig_yarn, default n_ctx_train), ``<arch>.rope.scaling.attn_factor`` (rope_attn_factor, default 1),
  ``<arch>.rope.dimension_count``. The YaRN ``yarn_beta_fast``/``yarn_beta_slow``/``yarn_attn_factor`` keys are
  read only by a few architectures (grok, mistral3...), not by ``llama`` (``src/models/llama.cpp``), which instead
  loads the optional per-dimension ``rope_freqs.weight`` tensor (n_rot/2 floats, shared by all layers).
- ``src/llama-context.cpp``: with YaRN (ext_factor != 0) the context sets
  ``yarn_attn_factor = get_mscale(s) / (1 + 0.1 ln s)`` (= 1) and multiplies it by ``rope.scaling.attn_factor``.
- ``ggml/src/ggml-cpu/ops.cpp`` (``rope_yarn``, ``ggml_rope_cache_init``): theta_extrap = θ_i / freq_factors[i];
  theta = freq_scale·theta_extrap·(1 - ramp·ext) + theta_extrap·ramp·ext, ramp over floor/ceil'ed correction dims
  (``ggml.c: ggml_rope_yarn_corr_dims``, β_fast 32, β_slow 1); cos/sin × attn_factor × (1 + 0.1 ln s) when ext != 0.

So the served attention factor is ``attn_factor_key × (1 + 0.1 ln s)`` for yarn, and ``attn_factor_key`` otherwise.
llama.cpp's room ports that math once (`rope_extend.engines.llama_cpp.port`, float32 as ggml computes it: the port
the parity report runs); `plan_gguf` checks the keys it plans reproduce the spec's inverse frequencies and attention
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AlreadyScaledError, CheckpointError, SpecError, UnsupportedModelError, VerificationError
from ..spec import RopeSpec
from .binary import Header, read_header, require_gguf
from .info import LLAMACPP_SOURCE, VERIFIED_ARCHITECTURES, GGUFInfo, info_of


@dataclass
class GGUFPlan:
    """What `write_gguf` writes: key -> value (None deletes the key), an optional rope_freqs tensor, warnings; with
    `plan_gguf_file`, the SOURCE file they are written over (its path and parsed header)."""

    spec: RopeSpec
    keys: dict[str, Any]
    rope_freqs: np.ndarray | None
    inv_freq: np.ndarray
    attention_factor: float
    warnings: list[str] = field(default_factory=list)
    source: Path | None = None
    header: Header | None = field(default=None, repr=False)


def plan_gguf_file(source: str | os.PathLike, spec: RopeSpec) -> GGUFPlan:
    """SOURCE's header read (never its tensors) and the one plan of `spec` on it, ready for `write_gguf`."""
    require_gguf()  # the type tables, before anything is read
    source = Path(source)
    header = read_header(source)
    return replace(plan_gguf(info_of(header, source), spec), source=source, header=header)


def plan_gguf(info: GGUFInfo, spec: RopeSpec) -> GGUFPlan:
    """Resolve *spec* against the GGUF's RoPE and compute the metadata to write, checked with llama.cpp's math."""
    from ..methods import RopeContext, get_method, gguf_rules

    if info.architecture not in VERIFIED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {info.architecture!r} is not supported: rope-extend verified the RoPE keys of "
            f"{', '.join(VERIFIED_ARCHITECTURES)} only ({LLAMACPP_SOURCE}); patch the Hugging Face checkpoint and "
            "convert it with llama.cpp's convert_hf_to_gguf.py instead"
        )
    if info.is_scaled:
        raise AlreadyScaledError(
            f"{str(info.path)!r} already carries RoPE scaling (rope.scaling.type={info.scaling_type!r}, "
            f"factor={info.scaling.get('factor', '-')}, rope_freqs={'yes' if info.rope_freqs is not None else 'no'}); "
            "stacking a second scheme would be silent double scaling: patch the original, unscaled GGUF"
        )
    if not info.context_length or info.rope_dim <= 0 or info.rope_dim % 2:
        raise CheckpointError(
            f"{str(info.path)!r} has no usable {info.architecture}.context_length / rope.dimension_count "
            f"({info.context_length}, {info.rope_dim}); the file is incomplete"
        )
    if spec.rope_theta is not None:
        raise SpecError(
            f"rope_theta={spec.rope_theta:g} in the spec: a GGUF's base is its rope.freq_base "
            f"({info.freq_base:g}); remove rope_theta",
            field="rope_theta",
            value=spec.rope_theta,
        )
    spec = spec.resolve(int(info.context_length))
    method = get_method(spec.method)
    ctx = RopeContext(
        rotary_dim=info.rope_dim,
        base=info.freq_base,
        original_max_position_embeddings=int(spec.original_max_position_embeddings),
        factor=float(spec.factor),
        params=spec.method_params(),
        seq_len=int(spec.target_length) if method.dynamic else None,  # longrope: the long factors
    )
    inv_freq, attention_factor = _compute(method, ctx)
    rel_keys, factors, warnings = gguf_rules(method).rope(spec, info.freq_base, info.rope_dim, inv_freq,
                                                          attention_factor)
    arch = info.architecture
    keys = {f"{arch}.{k}": v for k, v in rel_keys.items()}
    keys[f"{arch}.context_length"] = int(spec.target_length)
    plan = GGUFPlan(spec, keys, factors, inv_freq, attention_factor, warnings)
    _verify_plan(info, plan)
    return plan


def _compute(method, ctx) -> tuple[np.ndarray, float]:
    inv_freq, attention_factor = method.compute(ctx)
    return inv_freq.detach().cpu().double().numpy(), float(attention_factor)


def _verify_plan(info: GGUFInfo, plan: GGUFPlan) -> None:
    """The planned metadata, read back through llama.cpp's port (`engines.llama_cpp.port`, the one the parity report
    runs), must give the spec's RoPE up to the target length, within the float32 tolerance every engine row uses."""
    import torch

    from ..engines.llama_cpp.port import served as llama_cpp_served
    from ..engines.served import Served, compare

    arch = info.architecture
    meta: dict[str, Any] = {"context_length": info.context_length, "rope.dimension_count": info.rope_dim,
                            "rope.freq_base": info.freq_base}
    meta.update({f"rope.scaling.{key}": value for key, value in info.scaling.items()})
    meta.update({key[len(arch) + 1:]: value for key, value in plan.keys.items()})
    if plan.rope_freqs is not None:
        meta["rope_freqs"] = plan.rope_freqs
    n = int(plan.spec.target_length)
    served = llama_cpp_served(meta, "", n, arch=arch)
    delta = compare(served, Served(torch.from_numpy(np.asarray(plan.inv_freq, dtype=np.float64)),
                                   plan.attention_factor), n)
    if not delta.identical:
        raise VerificationError(
            f"the GGUF keys planned for {plan.spec.method} would make llama.cpp serve different RoPE (max |Δcos| "
            f"{delta.max_cos:.2e}, |Δsin| {delta.max_sin:.2e} over {n} positions, worst at rotary frequency "
            f"{delta.worst_dim}; magnitude {served.magnitude:.6f} vs {plan.attention_factor:.6f}); this is a "
            "rope-extend bug, please report it with the spec"
        )
