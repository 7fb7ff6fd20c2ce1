"""How to serve a patched checkpoint at its new length in vLLM, SGLang and llama.cpp, with honest warnings.

vLLM and SGLang read `rope_scaling` from config.json (the portable config carries it); `--hf-overrides` /
`--json-model-override-args` give the same scaling to the *unpatched* model. llama.cpp takes the scaling as flags.
"""

from __future__ import annotations

import json
import math

from .compat import scaling_dict
from .plan import PatchPlan


def serving_hints(plan: PatchPlan, out: str) -> tuple[str, list[str]]:
    """(markdown with commands, warnings) for serving `out` at the plan's target length."""
    spec = plan.spec
    target = int(spec.target_length)
    full = plan.slots.get("full_attention", plan.slots.get(None))
    warnings: list[str] = []
    env = "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " if target > plan.max_position_embeddings else ""
    overrides = {"rope_scaling": scaling_dict(full), "rope_theta": full["rope_theta"]}
    if overrides["rope_scaling"] is None:
        overrides.pop("rope_scaling")
    overrides["max_position_embeddings"] = plan.max_position_embeddings
    hf_overrides = json.dumps(overrides, separators=(",", ":"))

    if spec.method == "dynamic":
        warnings.append("vLLM and SGLang treat 'dynamic' as static NTK at the full factor; short contexts change there")
    if spec.method == "dynamic-yarn":
        warnings.append(
            "no engine implements dynamic-yarn: vLLM, SGLang and llama.cpp serve this checkpoint as static YaRN "
            f"x{spec.factor:g}; only rope_extend.patch_model reproduces the dynamic behaviour"
        )

    lines = [
        f"vLLM: `{env}vllm serve {out} --max-model-len {target}`",
        f"  (same scaling on the original model: `--hf-overrides '{hf_overrides}'`)",
        f"SGLang: `python -m sglang.launch_server --model-path {out} --context-length {target}`",
    ]
    llama_cpp = _llama_cpp_flags(plan)
    if llama_cpp is None:
        warnings.append(f"llama.cpp has no flags for {spec.method}; convert the patched checkpoint to GGUF instead")
    else:
        lines.append(f"llama.cpp: `llama-server -m model.gguf -c {target} {llama_cpp}`")
    text = "\n".join(f"- {line}" for line in lines)
    if warnings:
        text += "\n\n" + "\n".join(f"> Warning: {w}" for w in warnings)
    return text, warnings


def _llama_cpp_flags(plan: PatchPlan) -> str | None:
    spec = plan.spec
    s, L = spec.factor, spec.original_max_position_embeddings
    if spec.method == "linear":
        return f"--rope-scaling linear --rope-scale {s:g}"
    if spec.method == "ntk":
        full = plan.slots.get("full_attention", plan.slots.get(None))
        return f"--rope-freq-base {full['rope_theta']:.6g}"
    if spec.method in ("yarn", "ntk-by-parts", "dynamic-yarn"):
        flags = f"--rope-scaling yarn --rope-scale {s:g} --yarn-orig-ctx {L}"
        beta_fast, beta_slow = spec.beta_fast or 32.0, spec.beta_slow or 1.0
        if (beta_fast, beta_slow) != (32.0, 1.0):
            flags += f" --yarn-beta-fast {beta_fast:g} --yarn-beta-slow {beta_slow:g}"
        # llama.cpp multiplies its own 0.1 ln s + 1 by --yarn-attn-factor
        default = 0.1 * math.log(s) + 1 if s > 1 else 1.0
        if not math.isclose(plan.attention_factor, default, rel_tol=1e-9):
            flags += f" --yarn-attn-factor {plan.attention_factor / default:.6g}"
        return flags
    if spec.method in ("llama3", "longrope"):
        return "(scaling is baked into the GGUF at conversion: convert_hf_to_gguf.py reads this config.json)"
    return None
