"""MLX's rules: what mlx-lm 0.32.2 (what Mac users serve with) does with a written checkpoint, by the rope type its
`initialize_rope` dispatches on (`rope_scaling["type"]`, else `["rope_type"]`) and the keys its RoPE classes read
(`port.py`), and the card's two routes: this checkpoint (`mlx_lm.generate --model OUT`, or Python with a
`model_config` where the file alone is served otherwise) and the original model with `mlx_lm.load(...,
model_config=...)`, whose keys replace the config's (utils.py:446-447).

What mlx-lm reads and what it does not (each rule below names it): `rope_theta` and `rope_scaling` only, never
transformers 5's `rope_parameters` (a config.json with only `rope_parameters` loads as plain RoPE at base 10000);
YaRN's magnitude is get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), never `attention_factor`, and
its correction range is always rounded (`truncate` not read); LongRoPE's long factors at every position; `dynamic`
scaled at every forward call by the call's last position while the KV cache keeps earlier prefill chunks' keys.
"""

from __future__ import annotations

import functools
import math
import shlex

from ... import compat
from ..hint import COMMAND, MODEL, ORIGINAL, EngineHint, Route, fmt_float
from ..ported import longrope_magnitude
from ..registry import AuditedModel, AuditRoute, Rule, ServingEngine
from ..served import Unchecked
from ..written import Written
from . import port
from .port import MlxServing

NOTES = (
    f"{port.VERSION} reads `rope_theta` and `rope_scaling`, never transformers 5's `rope_parameters`: this "
    "checkpoint's config.json carries both, but a config.json with only `rope_parameters` loads as plain RoPE at base "
    "10000, silently (mlx_lm/models/llama.py ModelArgs; base.py from_dict drops unknown keys)",
    f"`mlx_lm.server --model` serves the same RoPE as `mlx_lm.generate --model`: both prefill {port.PREFILL_STEP} "
    "prompt tokens at a time (--prefill-step-size); so does `mlx_lm.generate(model, tokenizer, prompt)` in Python",
    "leave out `mlx_lm.generate --max-kv-size`: its rotating cache keeps the first 4 tokens and the last N, so a "
    "prompt longer than N is not attended whole (models/cache.py make_prompt_cache)",
)


def _none(engine: MlxEngine, w: Written) -> Rule:
    return Rule()


def _yarn(engine: MlxEngine, w: Written) -> Rule:
    rule = Rule()
    if w.slot.get("truncate") is False:
        rule.warnings.append(f"{engine.version} ignores truncate: false (YarnRoPE always floors and ceils the "
                             "correction range): the frequencies in the ramp differ")
    return rule


def _dynamic(engine: MlxEngine, w: Written) -> Rule:
    L = w.max_position_embeddings
    return Rule(warnings=[
        f"{engine.version} scales 'dynamic' at every forward call by the call's last position (offset + tokens), and "
        "the KV cache keeps the keys of earlier prefill chunks as they were rotated: `mlx_lm.generate` and "
        f"`mlx_lm.server` prefill {port.PREFILL_STEP} tokens at a time (--prefill-step-size), so a prompt longer than "
        f"{L} tokens is served with a scale per chunk, never its own length's: identical up to {L} tokens only "
        "(rope_utils.py DynamicNTKScalingRoPE; generate.py generate_step)"
    ])


def _longrope(engine: MlxEngine, w: Written) -> Rule:
    rule, L = Rule(), w.original_length
    if list(w.slot.get("short_factor", [])) != list(w.slot.get("long_factor", [])):
        rule.warnings.append(f"{engine.version} applies longrope's long factors at every position (SuScaledRoPE has "
                             f"no short/long switch): requests of up to {L} tokens differ from rope-extend's short "
                             "factors")
    default = longrope_magnitude(w.max_position_embeddings, L)
    if not math.isclose(default, w.attention_factor, rel_tol=1e-9):
        rule.warnings.append(f"{engine.version} ignores longrope's attention_factor {fmt_float(w.attention_factor)}: "
                             "its magnitude is sqrt(1 + ln(max_position_embeddings / original) / ln(original)) = "
                             f"{fmt_float(default)}")
    return rule


# What mlx-lm's initialize_rope does with each rope type it dispatches on (port.py's `served`; "yarn" stands for its
# YaRN family, deepseek_yarn and telechat3-yarn included).
BY_ROPE_TYPE = {"default": _none, "linear": _none, "llama3": _none, "yarn": _yarn, "dynamic": _dynamic,
                "longrope": _longrope, "proportional": _none}


def magnitude_fix(scaling: dict | None, attention_factor: float) -> dict:
    """The `mscale` / `mscale_all_dim` that give mlx-lm's YarnRoPE `attention_factor` as its magnitude, where it would
    compute another ({} when it already agrees, or for another type)."""
    if scaling is None or port.rope_type(scaling) not in port.YARN_TYPES:
        return {}
    if math.isclose(port.yarn_magnitude(scaling), attention_factor, rel_tol=1e-9):
        return {}
    factor = float(scaling["factor"])
    if factor <= 1:
        return {}  # get_mscale is 1 at any mscale: no key reaches it (the port's check shows it)
    return {"mscale": (attention_factor - 1.0) / (0.1 * math.log(factor)), "mscale_all_dim": 0.0}


class MlxEngine(ServingEngine):
    name = "mlx"
    title = "MLX"
    version = port.VERSION
    rope_types = tuple(BY_ROPE_TYPE)
    features = frozenset({"mscale"})
    routes = (
        Route("this checkpoint", COMMAND, "- MLX", False, None, column="MLX"),
        Route("original model + model_config", ORIGINAL, "  - same scaling on the original model", True, None,
              column="MLX, original + model_config"),
    )

    def unchecked(self, written: Written) -> str | None:
        if written.model_type and written.model_type not in port.LLAMA_TYPES:
            return (f"rope-extend's port of {self.version} covers its models/llama.py ({', '.join(port.LLAMA_TYPES)}), "
                    f"not {written.model_type!r}")
        return super().unchecked(written)

    def rule(self, w: Written) -> Rule:
        rule = BY_ROPE_TYPE[w.rope_type](self, w)
        if w.attention:
            at = w.attention
            rule.warnings.append(f"{self.version} serves {at.served} from this checkpoint ({at.own}): {at.elsewhere}")
            rule.max_len = w.original_length
        elif w.read_as:
            rule.warnings += self.read_as_rule(w).warnings
        return rule

    def serve(self, w: Written) -> EngineHint:
        rule = self.rule(w)
        full = dict(w.slot)
        scaling = compat.scaling_dict(full)
        fix = magnitude_fix(scaling, w.attention_factor)
        mlx_scaling = None if scaling is None else {**scaling, **fix}
        out_model_config = {"rope_scaling": mlx_scaling} if fix else None
        original_model_config = {"rope_theta": full["rope_theta"], "rope_scaling": mlx_scaling,
                                 "max_position_embeddings": w.max_position_embeddings}
        notes = list(NOTES) + rule.notes
        if fix:
            notes.append(
                f"{self.version} ignores attention_factor (YaRN's magnitude is get_mscale(factor, mscale) / "
                f"get_mscale(factor, mscale_all_dim)): mscale {fmt_float(fix['mscale'])} and mscale_all_dim 0 in "
                f"model_config give it {fmt_float(w.attention_factor)}; `mlx_lm.generate --model` on this checkpoint "
                f"alone serves {fmt_float(port.yarn_magnitude(scaling))}, and no CLI flag takes a model_config")
        if out_model_config is None:
            command = f"mlx_lm.generate --model {MODEL} --prompt -"
        else:
            command = f"model, tokenizer = mlx_lm.load({MODEL}, model_config={out_model_config!r})"
        this, original = self.routes
        return EngineHint(self.name, self.title, self.version, (
            this.filled(command, MlxServing(out_model_config)),
            original.filled(f"mlx_lm.load(<the original model>, model_config={original_model_config!r})",
                            MlxServing(original_model_config)),
        ), tuple(rule.warnings), tuple(notes), quote=shlex.quote if out_model_config is None else repr)

    def served(self, route, config, n):
        fields, rope = port.load_config(dict(config), route.settings.model_config)
        return port.served(fields, rope, n, prefill_step=route.settings.prefill_step)

    def audit_routes(self, model: AuditedModel) -> list[AuditRoute]:
        """`mlx_lm.generate --model MODEL` (the config.json as mlx-lm reads it: rope_theta and rope_scaling)."""
        fields, rope = port.load_config(dict(model.raw))
        reason = None
        if model.model_type not in port.LLAMA_TYPES:
            reason = (f"rope-extend's port of {self.version} covers its models/llama.py, not "
                      f"{model.model_type!r}")
        elif len(model.groups) > 1:
            reason = f"rope-extend's port of {self.version} does not model RoPE per layer type"
        settings = port.MlxServing(None)  # the folder's config.json alone, mlx-lm's default prefill chunks
        results = {group: tuple(Unchecked(reason) if reason else
                                port.served(fields, rope, n, prefill_step=settings.prefill_step)
                                for n in model.lengths) for group in model.groups}
        return [AuditRoute("this checkpoint", f"mlx_lm.generate --model {shlex.quote(model.name)} --prompt -", results,
                           settings)]

    @functools.cached_property
    def run(self):
        from .run import MlxRun

        return MlxRun(self)


MLX = MlxEngine()
