"""transformers' rules: what `AutoModelForCausalLM.from_pretrained(OUT)` loads. It is the reference engine: its rows
run the real library (`probes`: the installed line in this process, the other line under ROPE_EXTEND_OTHER_PYTHON),
so its rules only say where stock loading differs from rope-extend by construction (a method no config key carries,
a slot read as another method)."""

from __future__ import annotations

from ..hint import COMMAND, MODEL, EngineHint, Route
from ..registry import Rule, ServingEngine
from ..written import Written

VERSION = "transformers 4.x and 5.x"


class TransformersEngine(ServingEngine):
    name = "transformers"
    title = "transformers"
    version = VERSION
    ported = False  # the reference: run, never ported
    routes = (Route("config.json", COMMAND, "- transformers", False, None, column="transformers"),)

    def unchecked(self, written: Written) -> str | None:
        return None  # the library itself runs: nothing to cover

    def attention_rule(self, w: Written) -> Rule:
        at, L = w.attention, w.original_length
        return Rule(max_len=L, warnings=[
            f"stock transformers loads this checkpoint as {at.served} ({at.own}, {L} tokens): {w.method} acts on "
            f"attention and no config key carries it; call rope_extend.patch_model(model) after loading to re-apply "
            f"it from the rope_extend marker (up to {w.target_length} tokens)"
        ])

    def read_as_rule(self, w: Written) -> Rule:
        return Rule(warnings=[
            f"transformers 4.x and 5.x load {w.method} as static {w.read_as} x{w.factor:g} (equal to it only at "
            f"{w.target_length} tokens): prompts shorter than that differ; call rope_extend.patch_model(model) after "
            f"loading to restore {w.method}"
        ])

    def serve(self, w: Written) -> EngineHint:
        rule = self.attention_rule(w) if w.attention else self.read_as_rule(w) if w.read_as else Rule()
        (route,) = self.routes
        return EngineHint(self.name, self.title, self.version,
                          (route.filled(f"AutoModelForCausalLM.from_pretrained({MODEL})"),),
                          tuple(rule.warnings), tuple(rule.notes), quote=repr)  # a Python string


TRANSFORMERS = TransformersEngine()
