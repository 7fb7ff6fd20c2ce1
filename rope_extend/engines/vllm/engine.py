"""vLLM's rules: what `vllm serve` does with a written checkpoint, by the rope_type its `get_rope` dispatches on, and
the card's two routes (this checkpoint; the original model with `--hf-overrides`). The port (`port.py`) says what
vLLM computes; these rules say what to print and every way it differs from rope-extend."""

from __future__ import annotations

import functools
import math
import shlex

from ... import compat
from .. import hf_config
from ..hint import COMMAND, MODEL, ORIGINAL, EngineHint, Route, compact_json, env_prefix
from ..registry import AuditedModel, AuditRoute, Rule, ServingEngine
from ..served import NotServed, Unchecked
from ..written import Written
from . import port
from .port import VllmServing


def _none(engine: VllmEngine, w: Written) -> Rule:
    return Rule()


def _default(engine: VllmEngine, w: Written) -> Rule:
    if not w.theta_changed:
        return Rule()
    return Rule(notes=[f"a top-level rope_theta override alone is ignored by {engine.version} (it reads "
                       "rope_parameters), so the overrides carry both forms"])


def _dynamic(engine: VllmEngine, w: Written) -> Rule:
    L, target = w.max_position_embeddings, w.target_length
    return Rule(max_len=L, warnings=[
        f"{engine.version}: 'dynamic' builds its cos/sin cache once with the unscaled base and only "
        f"max_position_embeddings = {L} rows (max_trained_positions defaults to it), so vLLM serves the "
        f"original model and cannot serve past {L} tokens although it accepts --max-model-len up to {target}; "
        f"the command serves {L}. To serve {target} tokens in vLLM, write the checkpoint with ntk or yarn instead"
    ])


def _longrope(engine: VllmEngine, w: Written) -> Rule:
    L, target = w.original_length, w.target_length
    return Rule(warnings=[
        f"{engine.version}: with --max-model-len {target} > {L}, LongRoPE uses the long factors at every position, "
        f"so prompts shorter than {L} tokens are not protected (they run with the long factors); serve with "
        f"--max-model-len {L} to keep the short factors"
    ])


def _proportional(engine: VllmEngine, w: Written) -> Rule:
    factor = float(w.slot.get("factor") or 1.0)
    if factor == 1.0:
        return Rule()
    return Rule(warnings=[
        f"{engine.version} ignores `factor` for proportional RoPE (gemma4_rope.py: Gemma4RotaryEmbedding takes no "
        f"factor and get_rope passes it only rope_theta), so it serves this checkpoint's x{factor:g} as the original "
        "model, silently; write the checkpoint with --method ntk (a rope_theta change, which it reads) instead"
    ])


# What vLLM's get_rope does with each rope_type it dispatches on (port.py's `served`).
BY_ROPE_TYPE = {"default": _default, "linear": _none, "llama3": _none, "yarn": _none, "dynamic": _dynamic,
                "longrope": _longrope, "proportional": _proportional}


TOKENIZER_CAP = (f"vLLM also caps --max-model-len at the tokenizer's model_max_length (vLLM 0.34 config/model.py "
                 f"_get_and_verify_max_len): serving the original model with --hf-overrides beyond its tokenizer's "
                 f"cap needs {port.ALLOW_LONG}=1 (this checkpoint's tokenizer_config.json was raised to the target)")


class VllmEngine(ServingEngine):
    name = "vllm"
    title = "vLLM"
    version = port.VERSION
    rope_types = tuple(BY_ROPE_TYPE)
    features = frozenset({"layer_types", "mscale", "text_config", "proportional"})
    gguf_through_transformers = True  # a .gguf model's config comes from transformers' GGUF reader
    first_choice = 0
    routes = (
        Route("this checkpoint", COMMAND, "- vLLM", False, None, column="vLLM"),
        Route("original model + --hf-overrides", ORIGINAL, "  - same scaling on the original model", True, None,
              column="vLLM, original + `--hf-overrides`"),
    )

    def unchecked(self, written: Written) -> str | None:
        if port.through_transformers({"architectures": list(written.architectures)[:1]}):
            return None  # transformers' own rotary embedding runs: every rope type it has
        return super().unchecked(written)

    def rule(self, w: Written) -> Rule:
        if port.through_transformers({"architectures": list(w.architectures)}):
            from ..transformers_backend import backend_rule

            rule = backend_rule(self.version, w.rope_type,
                                f"{self.version} serves {w.architectures[0]} through its Transformers backend "
                                "(registry.py's _TRANSFORMERS_SUPPORTED_MODELS): transformers' own rotary embedding "
                                "runs, not vLLM's get_rope")
        else:
            rule = BY_ROPE_TYPE[w.rope_type](self, w)
        return self.with_method_rules(rule, w)

    def serve(self, w: Written) -> EngineHint:
        rule = self.rule(w)
        full = dict(w.slot)
        max_model_len = rule.max_len or w.target_length
        rope_parameters = dict(full)
        out_overrides: dict = {}
        if full.get("rope_type") == "longrope":
            default = port.longrope_magnitude(w.max_position_embeddings, w.original_length)
            if not math.isclose(w.attention_factor, default, rel_tol=1e-9):
                # vLLM ignores attention_factor for longrope; it reads short_mscale / long_mscale
                rope_parameters.update({"short_mscale": w.attention_factor, "long_mscale": w.attention_factor})
                out_overrides = {"rope_parameters": rope_parameters}
        original_overrides = original_model_overrides(w, rope_parameters)
        env = port.needs_long({"max_position_embeddings": w.max_position_embeddings}, full, max_model_len)
        extra = f" --hf-overrides '{compact_json(out_overrides)}'" if out_overrides else ""
        this, original = self.routes
        return EngineHint(self.name, self.title, self.version, (
            this.filled(f"{env_prefix(env)}vllm serve {MODEL} --max-model-len {max_model_len}{extra}",
                    VllmServing(max_model_len, out_overrides or None, env)),
            original.filled(f"--hf-overrides '{compact_json(original_overrides)}'",
                    VllmServing(max_model_len, original_overrides, env)),
        ), tuple(rule.warnings), (*rule.notes, TOKENIZER_CAP))

    def served(self, route, config, n):
        return port.served_by(route.settings, config, n)

    def audit_routes(self, model: AuditedModel) -> list[AuditRoute]:
        """`vllm serve MODEL --max-model-len W` (the window); where it differs, `--max-model-len L` (vLLM picks
        longrope's factors from max_model_len) and the overrides `port.own_fix` names."""
        fields, full = port.load_config(dict(model.loaded))
        reason = self.audit_unchecked(model, full)
        base = f"vllm serve {shlex.quote(model.name)}"

        def route(label, max_len, overrides) -> AuditRoute:
            extra = f" --hf-overrides '{compact_json(overrides)}'" if overrides else ""
            f, r = port.load_config(dict(model.loaded), overrides)
            env = port.needs_long(fields, r, max_len)
            command = f"{env_prefix(env)}{base} --max-model-len {max_len}{extra}"
            results = {}
            for group in model.groups:
                rope = hf_config.layer_rope(model.loaded, r, group.layer_type)
                results[group] = tuple(
                    Unchecked(reason) if reason else
                    NotServed(f"the command serves --max-model-len {max_len}") if n > max_len
                    else port.served(f, rope, max_len, n) for n in model.lengths)
            return AuditRoute(label, command, results, VllmServing(max_len, overrides, env))

        routes = [route("this checkpoint", model.long, None)]
        fix = port.own_fix(full)
        if fix:
            routes.append(route("+ --hf-overrides", model.long, {"rope_parameters": {**full, **fix}}))
        if full.get("rope_type") == "longrope" and model.short < model.long:
            routes.append(route(f"--max-model-len {model.short}", model.short, None))
        return routes

    @functools.cached_property
    def run(self):
        from .run import VllmRun

        return VllmRun(self)


VLLM = VllmEngine()


def original_model_overrides(w: Written, full: dict) -> dict:
    """`--hf-overrides` that give the original model this checkpoint's RoPE and length in vLLM: rope_parameters whole
    (per layer type where the model has several: a top-level `rope_parameters` replaces the dict), with the top-level
    rope_theta and 4.x rope_scaling forms for a flat config, and under `text_config` for a composite config (vLLM
    merges a sub-config's override recursively; a top-level key would land on the parent)."""
    whole = {**w.rope_parameters, "full_attention": full} if "layer_types" in w.features else full
    if w.nested:
        return {"text_config": {"rope_parameters": whole, "max_position_embeddings": w.max_position_embeddings}}
    overrides = {"rope_theta": full["rope_theta"]}
    scaling = compat.scaling_dict(full) if "layer_types" not in w.features else None
    if scaling is not None:
        overrides["rope_scaling"] = scaling
    overrides["rope_parameters"] = whole  # what vLLM reads (transformers 5 configs)
    overrides["max_position_embeddings"] = w.max_position_embeddings
    return overrides
