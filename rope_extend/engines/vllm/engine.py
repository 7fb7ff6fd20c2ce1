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


# What vLLM's get_rope does with each rope_type it dispatches on (port.py's `served`).
BY_ROPE_TYPE = {"default": _default, "linear": _none, "llama3": _none, "yarn": _none, "dynamic": _dynamic,
         "longrope": _longrope}


class VllmEngine(ServingEngine):
    name = "vllm"
    title = "vLLM"
    version = port.VERSION
    rope_types = tuple(BY_ROPE_TYPE)
    features = frozenset({"layer_types", "mscale", "text_config"})
    first_choice = 0
    routes = (
        Route("this checkpoint", COMMAND, "- vLLM", False, None, column="vLLM"),
        Route("original model + --hf-overrides", ORIGINAL, "  - same scaling on the original model", True, None,
              column="vLLM, original + `--hf-overrides`"),
    )

    def rule(self, w: Written) -> Rule:
        rule = BY_ROPE_TYPE[w.rope_type](self, w)
        for extra in (self.attention_rule(w) if w.attention else None, self.read_as_rule(w) if w.read_as else None):
            if extra is not None:
                rule.warnings += extra.warnings
                rule.max_len = extra.max_len or rule.max_len
        return rule

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
        original_overrides = {"rope_theta": full["rope_theta"]}
        scaling = compat.scaling_dict(full)
        if scaling is not None:
            original_overrides["rope_scaling"] = scaling
        original_overrides["rope_parameters"] = rope_parameters  # what vLLM reads (transformers 5 configs)
        original_overrides["max_position_embeddings"] = w.max_position_embeddings
        env = port.needs_long({"max_position_embeddings": w.max_position_embeddings}, full, max_model_len)
        extra = f" --hf-overrides '{compact_json(out_overrides)}'" if out_overrides else ""
        this, original = self.routes
        return EngineHint(self.name, self.title, self.version, (
            this.filled(f"{env_prefix(env)}vllm serve {MODEL} --max-model-len {max_model_len}{extra}",
                    VllmServing(max_model_len, out_overrides or None, env)),
            original.filled(f"--hf-overrides '{compact_json(original_overrides)}'",
                    VllmServing(max_model_len, original_overrides, env)),
        ), tuple(rule.warnings), tuple(rule.notes))

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
            command = f"{env_prefix(port.needs_long(fields, r, max_len))}{base} --max-model-len {max_len}{extra}"
            results = {}
            for group in model.groups:
                rope = hf_config.layer_rope(model.loaded, r, group.layer_type)
                results[group] = tuple(
                    Unchecked(reason) if reason else
                    NotServed(f"the command serves --max-model-len {max_len}") if n > max_len
                    else port.served(f, rope, max_len, n) for n in (model.short, model.long))
            return AuditRoute(label, command, results)

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
