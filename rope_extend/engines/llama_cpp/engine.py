"""llama.cpp's rules: which flags make `llama-server` serve a written checkpoint's RoPE on the original GGUF, what a
GGUF converted from it by convert_hf_to_gguf.py carries (and which flags it still needs), by the rope_type
convert_hf_to_gguf.py and llama.cpp's CLI read; and the card's two routes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...methods.registry import fmt, yarn_get_mscale
from ..hint import COMMAND, ORIGINAL, EngineHint, Route
from ..registry import AuditedModel, AuditRoute, Rule, ServingEngine
from ..served import NotServed, Unchecked
from ..written import Written
from . import port


@dataclass(frozen=True)
class LlamaCppServing:
    """`llama-server -m GGUF <flags>` (flags hold `-c N`); `flags` None: no flags reproduce the method this way, and
    `why` says so."""

    flags: str | None
    why: str = ""


@dataclass
class LlamaCppRule(Rule):
    """A `Rule` with llama.cpp's flags: `flags` reproduce the method on the original GGUF ("" = none needed; None =
    impossible), `converted_flags` what a GGUF converted from the checkpoint still needs, `convertible`
    convert_hf_to_gguf.py keeps the method."""

    flags: str | None = ""
    converted_flags: str = ""
    convertible: bool = True


def _default(w: Written) -> LlamaCppRule:
    return LlamaCppRule(flags=f"--rope-freq-base {fmt(w.theta)}" if w.theta_changed else "")


def _linear(w: Written) -> LlamaCppRule:
    return LlamaCppRule(flags=f"--rope-scaling linear --rope-scale {fmt(float(w.slot['factor']))}")


def _llama3(w: Written) -> LlamaCppRule:
    return LlamaCppRule(flags=None, warnings=[
        "llama.cpp cannot serve llama3 on the original GGUF: no flag sets per-dimension factors; convert this "
        "checkpoint with convert_hf_to_gguf.py, which writes the llama3 rope_freqs tensor (served identically), or "
        "write the GGUF directly with `rope-extend patch model.gguf`"
    ])


def _longrope(w: Written) -> LlamaCppRule:
    return LlamaCppRule(flags=None, convertible=False, warnings=[
        "llama.cpp cannot serve longrope for LLaMA-architecture models from this checkpoint: convert_hf_to_gguf.py "
        "writes only rope.scaling.type=longrope and no factor tensors, so the GGUF runs plain RoPE (no flag supplies "
        "the factors); write the GGUF with `rope-extend patch model.gguf` (long factors as rope_freqs, valid beyond "
        "the original length) or serve with vLLM, SGLang or transformers"
    ])


def _dynamic(w: Written) -> LlamaCppRule:
    L, target = w.max_position_embeddings, w.target_length
    return LlamaCppRule(max_len=L, flags="", convertible=False, warnings=[
        f"llama.cpp has no dynamic NTK and convert_hf_to_gguf.py drops 'dynamic': the original GGUF (or GGUF "
        f"converted from this checkpoint) equals it only up to {L} tokens, so the command serves -c {L}; to "
        f"serve {target} tokens in llama.cpp, write the checkpoint with ntk or yarn instead"
    ])


def _yarn(w: Written) -> LlamaCppRule:
    slot = w.slot
    s, L = float(slot["factor"]), int(slot["original_max_position_embeddings"])
    rule = LlamaCppRule()
    betas = (float(slot.get("beta_fast", 32.0)), float(slot.get("beta_slow", 1.0)))
    if betas != (32.0, 1.0):
        # the LLaMA architecture reads no yarn_beta_* GGUF keys: only these flags set them
        rule.converted_flags += f" --yarn-beta-fast {fmt(betas[0])} --yarn-beta-slow {fmt(betas[1])}"
    own = yarn_get_mscale(s)  # llama.cpp always applies 1 + 0.1 ln s
    if not math.isclose(w.attention_factor, own, rel_tol=1e-9):
        key = w.attention_factor / own
        rule.converted_flags += f" --override-kv {port.ARCH}.rope.scaling.attn_factor=float:{fmt(key)}"
        rule.notes.append(
            f"llama.cpp recomputes the YaRN magnitude as 1 + 0.1 ln s and ignores --yarn-attn-factor; the magnitude "
            f"{fmt(w.attention_factor)} is set through the GGUF key {port.ARCH}.rope.scaling.attn_factor = "
            f"{fmt(key)} (served magnitude = key x (1 + 0.1 ln s)); '{port.ARCH}' is the GGUF's "
            "general.architecture"
        )
    rule.flags = f"--rope-scaling yarn --rope-scale {fmt(s)} --yarn-orig-ctx {L}" + rule.converted_flags
    if rule.converted_flags:
        rule.notes.append(
            "convert_hf_to_gguf.py writes rope.scaling.yarn_attn_factor / yarn_beta_* keys that the LLaMA "
            "architecture does not read: run the converted GGUF with the flags shown"
        )
    if slot.get("truncate") is False:
        rule.warnings.append(
            "llama.cpp always floors/ceils the YaRN ramp bounds (ggml_rope_yarn_corr_dims): truncate=false is "
            "not reproduced, so the frequencies next to the ramp differ, with the original GGUF and with GGUF "
            "converted from this checkpoint alike"
        )
    return rule


# What llama.cpp's CLI and convert_hf_to_gguf.py do with each rope_type (port.py's `convert` and `served`).
BY_ROPE_TYPE = {"default": _default, "linear": _linear, "llama3": _llama3, "yarn": _yarn, "dynamic": _dynamic,
         "longrope": _longrope}
GROUPED_ATTENTION = (
    "llama.cpp's own self-extend is `-gan G -gaw W` in llama-completion (`-gan G` in llama-passkey, whose window is "
    "the batch size -b; not in llama-server): a block-wise approximation that divides the cached KV positions by G "
    "batch by batch, not the paper's two-map merge, so its numbers differ from rope-extend's"
)


class LlamaCppEngine(ServingEngine):
    name = "llama.cpp"
    title = "llama.cpp"
    version = port.VERSION
    rope_types = tuple(BY_ROPE_TYPE)
    features = frozenset({"mscale", "text_config"})
    native_format = "gguf"
    routes = (
        Route("original GGUF + flags", ORIGINAL, "- llama.cpp, original GGUF", True, None,
              column="llama.cpp, original GGUF + flags", listed=False),
        Route("GGUF converted from this checkpoint", COMMAND,
              "- llama.cpp, GGUF converted from this checkpoint (convert_hf_to_gguf.py)", False, None,
              column="llama.cpp, converted GGUF", listed=False),
    )

    @property
    def row_name(self) -> str:
        return "llama.cpp (llama-cpp-python 0.3.36)"

    def unchecked(self, written: Written) -> str | None:
        if written.model_type and written.model_type not in port.LLAMA_ARCH_MODEL_TYPES:
            return (f"rope-extend's port of {self.version} covers the LLaMA architecture (convert_hf_to_gguf.py's "
                    f"{', '.join(port.LLAMA_ARCH_MODEL_TYPES)}), not {written.model_type!r}")
        return super().unchecked(written)

    def rule(self, w: Written) -> LlamaCppRule:
        rule = BY_ROPE_TYPE[w.rope_type](w)
        if w.attention:
            rule = self.attention_rule(w)
        elif w.read_as:
            rule.warnings += self.read_as_rule(w).warnings
        return rule

    def attention_rule(self, w: Written) -> LlamaCppRule:
        at, L = w.attention, w.original_length
        rule = LlamaCppRule(max_len=L, flags=None, convertible=False, warnings=[
            f"llama.cpp serves {at.served} from this checkpoint ({at.own}, up to {L} tokens): llama.cpp has no "
            f"{w.method} ({at.elsewhere}); its nearest training-free option is self-extend (`-gan G -gaw W` in "
            "llama-completion, `-gan G` in llama-passkey)"
        ])
        from ...attention.maps import SelfExtendMap

        if isinstance(at.mapping, SelfExtendMap):  # llama.cpp's grouped attention is self-extend's map
            G, W = at.mapping.group_size, at.mapping.neighbor_window
            rule.warnings = [f"llama.cpp serves {at.served} from this checkpoint ({at.own}, up to {L} tokens): "
                             f"{GROUPED_ATTENTION}"]
            rule.notes.append(
                f"llama.cpp's nearest equivalent: `llama-completion -m model.gguf -c {w.target_length} -gan {G} "
                f"-gaw {W}` (llama-passkey: `-gan {G} -b {W}`); a block-wise approximation by KV-position division, "
                "not the paper's merge"
            )
        return rule

    def serve(self, w: Written) -> EngineHint:
        rule = self.rule(w)
        ctx = rule.max_len or w.target_length
        why = f"no llama.cpp flags reproduce {w.method} on the original GGUF"
        original, converted = self.routes
        flags = None if rule.flags is None else f"-c {ctx} {rule.flags}".rstrip()
        return EngineHint(self.name, self.title, self.version, (
            original.filled(None if flags is None else f"llama-server -m model.gguf {flags}",
                            LlamaCppServing(flags, why)),
            converted.filled(f"llama-server -m out.gguf -c {ctx}{rule.converted_flags}"
                             if rule.convertible or rule.max_len else None,
                             LlamaCppServing(f"-c {ctx}{rule.converted_flags}")),
        ), tuple(rule.warnings), tuple(rule.notes))

    def served(self, route, config, n):
        settings: LlamaCppServing = route.settings
        if settings.flags is None:
            return NotServed(settings.why)
        return port.served(port.convert(dict(config)), settings.flags, n)

    def gguf_served(self, meta: dict, context: int, n: int):
        """What `llama-server -m model.gguf -c context` applies to a request of n tokens of a GGUF with `meta`."""
        return port.served(meta, f"-c {context}", n)

    def audit_routes(self, model: AuditedModel) -> list[AuditRoute]:
        """The GGUF convert_hf_to_gguf.py writes from this checkpoint, run with `-c W`."""
        flags = f"-c {model.long}"
        command = f"python convert_hf_to_gguf.py MODEL --outfile model.gguf && llama-server -m model.gguf {flags}"
        if model.model_type not in port.LLAMA_ARCH_MODEL_TYPES:
            reason = Unchecked(f"not modelled: the port covers llama.cpp's LLaMA architecture, not "
                               f"{model.model_type!r}")
            return [AuditRoute("GGUF converted from this checkpoint", command,
                               {group: (reason, reason) for group in model.groups})]
        meta = port.convert(dict(model.raw))
        results = {group: tuple(port.served(meta, flags, n) for n in model.lengths)
                   for group in model.groups}
        return [AuditRoute("GGUF converted from this checkpoint", f"{command} (the GGUF's RoPE keys: {gguf_keys(meta)})",
                           results)]


def gguf_keys(meta: dict) -> str:
    """The RoPE metadata convert_hf_to_gguf.py writes (`port.convert`), as llama.cpp names it."""
    keys = [f"{port.ARCH}.{key} {value:g}" if isinstance(value, float) else f"{port.ARCH}.{key} {value}"
            for key, value in meta.items() if key != "rope_freqs"]
    if "rope_freqs" in meta:
        keys.append(f"rope_freqs tensor ({len(meta['rope_freqs'])} factors)")
    return ", ".join(keys)


LLAMA_CPP = LlamaCppEngine()
