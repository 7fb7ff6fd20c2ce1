"""How to serve a patched checkpoint at its new length in transformers, vLLM, SGLang and llama.cpp, exactly.

Each engine module in `rope_extend.engines` owns its per-method rule (`serving_rule`), checked against that
engine's source at a pinned version; this module only assembles them. `rope-extend engines` verifies every command
printed here by running it through the engine ports (see `rope_extend.engines.parity`).
"""

from __future__ import annotations

from .engines import llama_cpp, sglang, transformers_engine, vllm
from .engines.served import EngineHint
from .plan import PatchPlan

RULES = (transformers_engine.serving_rule, vllm.serving_rule, sglang.serving_rule, llama_cpp.serving_rule)
CHECKED_AGAINST = f"{vllm.VERSION}, {sglang.VERSION}, {llama_cpp.VERSION}"


def engine_hints(plan: PatchPlan, out: str) -> list[EngineHint]:
    """One `EngineHint` per engine (transformers, vLLM, SGLang, llama.cpp) for serving `out`."""
    return [rule(plan, out) for rule in RULES]


def serve_command(plan: PatchPlan, out: str) -> str:
    """The one way to serve `out` a newcomer should try first: the first of vLLM and SGLang that reproduces the
    method exactly (its hint has no warning), else stock transformers, else in-process with `patch_model` (which
    restores a method stock loaders read differently, e.g. dynamic-yarn). Every engine's command is in the model
    card and `rope-extend engines`."""
    hints = {hint.engine: hint for hint in engine_hints(plan, out)}
    for engine in ("vLLM", "SGLang"):
        if hints[engine].command and not hints[engine].warnings:
            return f"{hints[engine].command}   ({engine})"
    load = f"model = AutoModelForCausalLM.from_pretrained({out!r})"
    if not hints["transformers"].warnings:
        return f"{load}   (transformers: vLLM and SGLang do not reproduce {plan.spec.method} exactly; see the warnings)"
    return (f"{load}; rope_extend.patch_model(model)   (in-process: restores {plan.spec.method}, which stock "
            "loaders and serving engines do not reproduce exactly; see the warnings)")


def serving_hints(plan: PatchPlan, out: str) -> tuple[str, list[str]]:
    """(markdown with commands, warnings) for serving `out` at the plan's target length."""
    hints = {hint.engine: hint for hint in engine_hints(plan, out)}
    v, g, c = hints["vLLM"], hints["SGLang"], hints["llama.cpp"]
    lines = [
        f"- vLLM: `{v.command}`",
        f"  - same scaling on the original model: `{v.original}`",
        f"- SGLang: `{g.command}`",
        f"  - same scaling on the original model: `{g.original}`",
    ]
    if c.original is not None:
        lines.append(f"- llama.cpp, original GGUF: `{c.original}`")
    if c.command is not None:
        lines.append(f"- llama.cpp, GGUF converted from this checkpoint (convert_hf_to_gguf.py): `{c.command}`")
    warnings = [w for hint in hints.values() for w in hint.warnings]
    notes = [n for hint in hints.values() for n in hint.notes]
    text = "\n".join(lines)
    text += f"\n\nChecked against {CHECKED_AGAINST}."
    if notes:
        text += "\n\n" + "\n".join(f"> Note: {n}" for n in notes)
    if warnings:
        text += "\n\n" + "\n".join(f"> Warning: {w}" for w in warnings)
    return text, warnings
