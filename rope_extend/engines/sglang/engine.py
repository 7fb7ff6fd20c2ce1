"""SGLang's rules: what `python -m sglang.launch_server` does with a written checkpoint, by the rope_type its
`get_rope` dispatches on and the keys it reads (it reads no `attention_factor`: YaRN's magnitude goes through
`attn_factor`, LongRoPE's through short_mscale / long_mscale), and the card's two routes (this checkpoint; the
original model with `--json-model-override-args`)."""

from __future__ import annotations

import functools
import math
import shlex

from ... import compat
from .. import hf_config
from ..hint import COMMAND, MODEL, ORIGINAL, EngineHint, Route, compact_json, env_prefix, fmt_float
from ..ported import longrope_magnitude, yarn_magnitude
from ..registry import AuditedModel, AuditRoute, Rule, ServingEngine
from ..served import Unchecked
from ..written import Written
from . import port
from .port import LONGER, RESERVED, SglangServing


def _none(engine: SglangEngine, w: Written) -> Rule:
    return Rule()


def _dynamic(engine: SglangEngine, w: Written) -> Rule:
    L, target = w.original_length, w.target_length
    return Rule(warnings=[
        f"{engine.version} serves 'dynamic' as static NTK at {target} tokens for every request (base x "
        f"(s^2 - s + 1)^(d/(d-2))): prompts shorter than {target} tokens differ from rope-extend's dynamic "
        f"NTK, which keeps the original RoPE up to {L} tokens"
    ])


def _longrope(engine: SglangEngine, w: Written) -> Rule:
    L = w.original_length
    return Rule(warnings=[
        f"{engine.version} picks LongRoPE's short or long factors per forward batch (long once a position exceeds "
        f"{L}): a prompt split by chunked prefill keeps the short factors in its first chunks, and a short "
        f"prompt that generates past {L} tokens mixes both in its KV cache; disable chunked prefill "
        "(--chunked-prefill-size -1) for prompts longer than the original length"
    ])


def _proportional(engine: SglangEngine, w: Written) -> Rule:
    factor = float(w.slot.get("factor") or 1.0)
    if factor == 1.0:
        return Rule()
    return Rule(warnings=[
        f"{engine.version} ignores `factor` for proportional RoPE (gemma4_causal.py hands get_rope only rope_type "
        f"and rope_theta; Gemma4RotaryEmbedding takes no factor), so it serves this checkpoint's x{factor:g} as the "
        "original model, silently; write the checkpoint with --method ntk (a rope_theta change, which it reads) instead"
    ])


# What SGLang's get_rope does with each rope_type it dispatches on (port.py's `served`).
BY_ROPE_TYPE = {"default": _none, "linear": _none, "llama3": _none, "yarn": _none, "dynamic": _dynamic,
                "longrope": _longrope, "proportional": _proportional}


def magnitude_fix(rope: dict, attention_factor: float, max_position_embeddings: int, original: int) -> dict:
    """The keys SGLang reads that give it rope-extend's magnitude (it reads no attention_factor): YaRN's attn_factor
    (its magnitude is the mscale ratio or 0.1 ln s + 1, times attn_factor), LongRoPE's short/long_mscale."""
    if rope.get("rope_type") == "yarn":
        own = yarn_magnitude(rope, float(rope["factor"]), set_means_given=True)
        return {} if math.isclose(attention_factor, own, rel_tol=1e-9) else {"attn_factor": attention_factor / own}
    if rope.get("rope_type") == "longrope":
        default = longrope_magnitude(max_position_embeddings, original)
        if not math.isclose(attention_factor, default, rel_tol=1e-9):
            return {"short_mscale": attention_factor, "long_mscale": attention_factor}
    return {}


class SglangEngine(ServingEngine):
    name = "sglang"
    title = "SGLang"
    version = port.VERSION
    rope_types = tuple(BY_ROPE_TYPE)
    features = frozenset({"layer_types", "mscale", "text_config", "proportional"})
    gguf_through_transformers = True  # a .gguf model's config comes from transformers' GGUF reader
    first_choice = 1
    routes = (
        Route("this checkpoint", COMMAND, "- SGLang", False, None, column="SGLang"),
        Route("original model + --json-model-override-args", ORIGINAL, "  - same scaling on the original model",
              True, None, column="SGLang, original + overrides"),
    )

    def unchecked(self, written: Written) -> str | None:
        if written.model_type in port.NOT_LOADABLE:
            return port.NOT_LOADABLE[written.model_type]
        if port.through_transformers({"architectures": list(written.architectures)[:1]}):
            return None  # transformers' own rotary embedding runs: every rope type it has
        return super().unchecked(written)

    def rule(self, w: Written) -> Rule:
        if port.through_transformers({"architectures": list(w.architectures)}):
            from ..transformers_backend import backend_rule

            rule = backend_rule(self.version, w.rope_type,
                                f"{self.version} has no model class for {w.architectures[0]}: it serves it through "
                                "transformers' own model code (model_loader/utils.py), whose rotary embedding runs")
        else:
            rule = BY_ROPE_TYPE[w.rope_type](self, w)
        return self.with_method_rules(rule, w)

    def serve(self, w: Written) -> EngineHint:
        rule = self.rule(w)
        full = dict(w.slot)
        target = rule.max_len or w.target_length
        fix = magnitude_fix(full, w.attention_factor, w.max_position_embeddings, w.original_length)
        rope_parameters = {**full, **fix}
        original_overrides = original_model_overrides(w, rope_parameters)
        # the whole rope_parameters, fix included: SGLang 0.5.15 (transformers 5.12 inside) replaces the checkpoint's
        # rope_parameters with an override's, where 0.5.23 merges them ({"attn_factor": x} alone: "Unknown RoPE
        # scaling type", measured by make sglang-check on ntk-by-parts); the whole dict is read the same by both
        out_overrides = _placed(w, {"rope_parameters": _whole(w, rope_parameters)}) if fix else {}
        env = port.needs_longer({"max_position_embeddings": w.max_position_embeddings}, full, target)
        extra = f" --json-model-override-args '{compact_json(out_overrides)}'" if out_overrides else ""
        notes = list(rule.notes)
        notes.append(
            f"SGLang accepts prompts of at most N − {RESERVED + 1} tokens at --context-length N (measured in 0.5.15: "
            f"it keeps {RESERVED} positions back); for a prompt of all {target} tokens, give --context-length "
            f"{target + RESERVED + 1} with {LONGER}=1"
        )
        if "attn_factor" in fix:
            notes.append(f"{self.version} ignores attention_factor; attn_factor {fmt_float(fix['attn_factor'])} in "
                         "the overrides gives it the same magnitude")
        this, original = self.routes
        command = (f"{env_prefix(env)}python -m sglang.launch_server --model-path {MODEL} --context-length "
                   f"{target}{extra}")
        return EngineHint(self.name, self.title, self.version, (
            this.filled(command, SglangServing(target, out_overrides or None, env)),
            original.filled(f"--json-model-override-args '{compact_json(original_overrides)}'",
                            SglangServing(target, original_overrides, env)),
        ), tuple(rule.warnings), tuple(notes))

    def served(self, route, config, n):
        return port.served_by(route.settings, config, n)

    def audit_routes(self, model: AuditedModel) -> list[AuditRoute]:
        """`python -m sglang.launch_server --model-path MODEL --context-length W`; where its port needs one, the
        override `port.own_fix` names, written as rope_parameters with rope_theta (an override written only as
        rope_scaling drops rope_theta in SGLang 0.5.15: issue 56); for LongRoPE, the same with chunked prefill off
        (SGLang picks the factors per prefill chunk: `port.chunked_longrope`)."""
        fields, full = port.load_config(dict(model.loaded))
        reason = self.audit_unchecked(model, full)
        base = f"python -m sglang.launch_server --model-path {shlex.quote(model.name)} --context-length {model.long}"
        env = port.needs_longer(fields, full, model.long)

        def route(label, overrides, chunked=None) -> AuditRoute:
            extra = f" --json-model-override-args '{compact_json(overrides)}'" if overrides else ""
            extra += f" --chunked-prefill-size {chunked}" if chunked is not None else ""
            f, r = port.load_config(dict(model.loaded), overrides)

            def one(group, n):
                rope = hf_config.layer_rope(model.loaded, r, group.layer_type)
                return port.chunked_longrope(rope, n, chunked) or port.served(f, rope, n)

            results = {group: tuple(Unchecked(reason) if reason else one(group, n) for n in model.lengths)
                       for group in model.groups}
            return AuditRoute(label, f"{env_prefix(env)}{base}{extra}", results,
                              SglangServing(model.long, overrides, env, chunked))

        routes = [route("this checkpoint", None)]
        fix = port.own_fix(full)
        overrides = {"rope_parameters": {**full, **fix}} if fix else None
        if fix:
            routes.append(route("+ --json-model-override-args", overrides))
        if full.get("rope_type") == "longrope" and model.short < model.long:  # one batch: the factors per prompt
            label = "+ --json-model-override-args" if fix else "+"
            routes.append(route(f"{label} --chunked-prefill-size -1", overrides, -1))
        return routes

    @functools.cached_property
    def run(self):
        from .run import SglangRun

        return SglangRun(self)


SGLANG = SglangEngine()


def _whole(w: Written, full: dict) -> dict:
    """The whole rope_parameters with `full` as the full-attention slot (per layer type where the model has several:
    SGLang replaces a layer type's dict whole)."""
    return {**w.rope_parameters, "full_attention": full} if "layer_types" in w.features else full


def _placed(w: Written, overrides: dict) -> dict:
    """`overrides` where SGLang applies them to the text model: under `text_config` for a composite config (0.5.23
    updates a sub-config one level, so every key given is replaced whole and complete), else at the top."""
    return {"text_config": overrides} if w.nested else overrides


def original_model_overrides(w: Written, full: dict) -> dict:
    """`--json-model-override-args` that give the original model this checkpoint's RoPE and length in SGLang: the
    whole rope_parameters (with rope_theta inside: a rope_scaling-only override drops it in 0.5.15), with the
    top-level rope_theta and 4.x rope_scaling forms for a flat config."""
    if w.nested or "layer_types" in w.features:
        return _placed(w, {"rope_parameters": _whole(w, full), "max_position_embeddings": w.max_position_embeddings})
    overrides = {"rope_theta": full["rope_theta"]}
    scaling = compat.scaling_dict(full)
    if scaling is not None:
        overrides["rope_scaling"] = scaling
    overrides["rope_parameters"] = full
    overrides["max_position_embeddings"] = w.max_position_embeddings
    return overrides
