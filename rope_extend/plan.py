"""Planning: what a spec does to a config, computed without touching any model (pure).

`plan_patch(config, spec)` reads the config once (`facts.read_rope`), resolves the spec against the model's original
length, asks the method object for each target slot's new parameters and the new `max_position_embeddings`, and
checks that stock transformers rebuilds exactly the planned frequencies from the rewritten config (refusing before
anything is written otherwise). The result is a frozen `PatchPlan`, built once and complete (every slot as written,
with the attention factor stock loaders build) and returned as built, shared by `patch_model` and the checkpoint
writer; nothing writes into it afterwards (tests/test_patch.py::test_a_plan_is_built_complete_then_frozen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import compat
from .errors import (
    AlreadyScaledError,
    NoExtensionError,
    ShorterWindowError,
    SpecError,
    UnsupportedModelError,
    VerificationError,
)
from .facts import encode_slots, read_rope
from .methods import RopeContext, RopeMethod, default_inv_freq, get_method
from .spec import RopeSpec, load_spec
from .variants import Proportional, variant_of
from .version import __version__

# Models without RoPE, with what would work instead.
NO_ROPE_MODELS = {
    "gpt2": "it uses learned absolute position embeddings (wpe) limited to n_positions; RoPE scaling cannot extend "
    "them. Fine-tune with a longer wpe, or use a RoPE model (llama, mistral, qwen2...)",
    "bloom": "it uses ALiBi attention biases, which need no rescaling: ALiBi extrapolates by itself; just raise the "
    "length you serve",
    "mpt": "it uses ALiBi attention biases, which need no rescaling",
    "opt": "it uses learned absolute position embeddings; RoPE scaling does not apply",
    "bert": "it uses learned absolute position embeddings; RoPE scaling does not apply",
    "gpt_bigcode": "it uses learned absolute position embeddings; RoPE scaling does not apply",
    "inkling2_text": "its text layers use a relative position bias; only its vision tower rotates (2-D axial RoPE "
    "over image patches), which does not bound the context length; RoPE scaling does not apply",
    "xlnet": "it uses Transformer-XL relative sinusoidal position encodings, not RoPE; RoPE scaling does not apply",
}
# Models that rotate queries and keys without transformers' RoPE modules or config fields, with why and what works.
FIXED_ROTARY_MODELS = {
    "codegen": "rotates queries and keys with a fixed sin/cos table (embed_positions, n_positions rows) computed at "
    "load from rotary_dim, not with a RoPE module or rope fields transformers can rescale; no config.json field "
    "changes it, so rope-extend cannot extend it (a model with a RoPE config, e.g. qwen2 or llama, can be)",
    "gptj": "rotates queries and keys with a fixed sin/cos table (embed_positions, n_positions rows) computed at "
    "load from rotary_dim, not with a RoPE module or rope fields transformers can rescale; no config.json field "
    "changes it, so rope-extend cannot extend it (a model with a RoPE config, e.g. qwen2 or llama, can be)",
}
# Models whose RoPE lives in several sub-models' configs with lengths of their own, with why and what works.
SUB_MODEL_ROPE_MODELS = {
    "blt": "is a byte latent transformer: its RoPE lives in four sub-models (patcher_config, encoder_config, "
    "decoder_config, global_config), each with its own rope_parameters and max_position_embeddings (bytes for the "
    "local ones, patches for the global one), and its top-level config has none, so no one context length or RoPE "
    "config extends it; rope-extend rescales models with one text RoPE config (llama, qwen2/3, gemma, mistral...)",
}
# Configs that can select RoPE or none: position_embedding_type values meaning RoPE (Granite 4.0-H defaults to NoPE).
ROPE_POSITION_EMBEDDING_TYPES = ("rope", "rotary")


@dataclass(frozen=True)
class PatchPlan:
    """What a resolved spec does to a config: new slot parameters, new max length, the marker, and whether it
    changes anything."""

    spec: RopeSpec  # resolved
    slots: dict[str | None, dict]  # all slots after the patch
    targets: tuple[str | None, ...]  # slots the spec rescales
    old_slots: dict[str | None, dict]
    old_max_position_embeddings: int
    max_position_embeddings: int
    marker: dict
    changed: bool
    base_theta: float
    rotary_dims: dict[str | None, int]
    attention_factor: float
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # Methods that keep the model's scheme (the attention-level ones): its own (inv_freq, attention factor) per target
    # slot, and what that scheme is in words.
    own_rope: dict = field(default_factory=dict)
    kept_scheme: str | None = None
    # Target slots of a RoPE variant the model ships (`variants`: proportional), with how many of their frequencies
    # rotate: the method runs over the whole head_dim (`rotary_dims`) and the rest are cut to zero, as stock
    # transformers builds them.
    rotating: dict = field(default_factory=dict)

    @property
    def method(self) -> RopeMethod:
        return self.spec.rope_method

    def context(self, slot: str | None, seq_len: int | None = None, device=None) -> RopeContext:
        """The `RopeContext` of one target slot (at `seq_len` for dynamic methods)."""
        return _slot_context(self.spec, self.slots[slot], self.rotary_dims[slot], self.base_theta, seq_len, device)

    def compute(self, slot: str | None, seq_len: int | None = None, device=None) -> tuple[torch.Tensor, float]:
        """rope-extend's own (inv_freq, attention factor) for a target slot (the model's own where it is kept)."""
        if self.own_rope:
            inv_freq, attention = self.own_rope[slot]
            return inv_freq.to(device), attention
        return self._cut(slot, *self.method.compute(self.context(slot, seq_len, device)))

    def _cut(self, slot: str | None, inv_freq: torch.Tensor, attention: float) -> tuple[torch.Tensor, float]:
        """A variant slot's frequencies as the model's own RoPE variant rotates them (`variants`)."""
        if slot in self.rotating:
            inv_freq = variant_of(self.slots[slot]).cut(inv_freq, self.rotating[slot])
        return inv_freq, attention

    def stock_rope_type(self, slot: str | None) -> str:
        """The rope_type stock rotary modules dispatch on for a target slot (dynamic methods: our hook owns them)."""
        if self.method.dynamic:
            return "default"
        return self.slots[slot]["rope_type"] if slot in self.rotating else self.method.hf_rope_type

    def is_identity(self) -> bool:
        """True when patching would change nothing: the planned RoPE equals the unscaled one at every length up to
        the target (e.g. a factor of 1 for a method without per-dimension lists) and the method does not act on
        attention (STRING changes it at x1)."""
        if self.method.acts_on_attention:
            return False
        for slot in self.targets:
            for seq_len in (None, self.spec.target_length):
                inv_freq, attention = self.compute(slot, seq_len=seq_len)
                plain, _ = self._cut(slot, default_inv_freq(self.rotary_dims[slot], self.base_theta), 1.0)
                if attention != 1.0 or not torch.allclose(inv_freq, plain, rtol=1e-7, atol=0):
                    return False
        return True

    def rebased(self, config) -> PatchPlan:
        """This plan with what it changes counted from `config` (a patched model's original config, when it is
        patched again): the old slots and length are that config's."""
        facts = read_rope(config)
        return replace(self, old_slots=facts.slots, old_max_position_embeddings=facts.max_position_embeddings,
                       changed=_changes(facts, self.slots, self.max_position_embeddings, self.marker, self.method))

    def for_config(self, config) -> PatchPlan:
        """This plan's spec planned on another config (the same model with a field removed, say)."""
        return plan_patch(config, self.spec)

    def expected_stock(self, slot: str | None) -> tuple[torch.Tensor, float]:
        """What stock loaders build at construction from the written config (dynamic-yarn: static YaRN)."""
        if self.own_rope:
            return self.own_rope[slot]
        return self._cut(slot, *self.method.stock_method.compute(self.context(slot)))


def recorded_spec(config) -> RopeSpec | None:
    """The resolved spec a checkpoint rope-extend wrote records in its config's marker (None without a complete
    marker: the spec and the original RoPE)."""
    marker = compat.read_marker(compat.text_config(config))
    if not marker or not isinstance(marker.get("spec"), dict) or "original" not in marker:
        return None
    return RopeSpec(**marker["spec"])


def check_rope_model(config) -> None:
    model_type = getattr(config, "model_type", "?")
    if model_type in NO_ROPE_MODELS:
        raise UnsupportedModelError(
            f"model type {model_type!r} has no rotary position embedding: {NO_ROPE_MODELS[model_type]}"
        )
    if model_type in FIXED_ROTARY_MODELS:
        raise UnsupportedModelError(f"model type {model_type!r} {FIXED_ROTARY_MODELS[model_type]}")
    if model_type in SUB_MODEL_ROPE_MODELS:
        raise UnsupportedModelError(f"model type {model_type!r} {SUB_MODEL_ROPE_MODELS[model_type]}")
    if model_type in compat.NO_SCALING_FIELD:
        raise UnsupportedModelError(f"model type {model_type!r}: {compat.NO_SCALING_FIELD[model_type]}")
    kind = getattr(config, "position_embedding_type", ROPE_POSITION_EMBEDDING_TYPES[0])
    if kind not in ROPE_POSITION_EMBEDDING_TYPES:
        raise UnsupportedModelError(
            f"model type {model_type!r} has position_embedding_type {kind!r}: its layers use no rotary position "
            f"embedding (NoPE), so there is no RoPE to rescale; a checkpoint of it with position_embedding_type "
            f"'rope' can be extended"
        )
    if not (getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None)) and not hasattr(
        config, "rope_scaling"
    ):
        raise UnsupportedModelError(
            f"model type {model_type!r} declares no RoPE (no rope_theta / rope_parameters in its config); "
            "rope-extend only rescales rotary position embeddings (llama, mistral, qwen2/3, gemma, phi3, gpt_neox...)"
        )


def _targets(slots: dict, spec: RopeSpec) -> tuple[str | None, ...]:
    if compat.FLAT in slots:
        if "full_attention" not in spec.layer_types:
            raise SpecError(
                f"layer_types {spec.layer_types}: this model uses one RoPE for all its layers, so it can only be "
                "scaled as a whole; remove layer_types (default [full_attention])",
                field="layer_types",
                value=spec.layer_types,
            )
        return (compat.FLAT,)
    targets = tuple(lt for lt in spec.layer_types if lt in slots)
    if not targets:
        raise SpecError(
            f"layer_types {spec.layer_types} match none of the model's RoPE layer types {sorted(slots)}; "
            f"use e.g. layer_types: [{sorted(slots)[0]}]",
            field="layer_types",
            value=spec.layer_types,
        )
    return targets


def plan_patch(config, spec: RopeSpec | dict | str | None = None, **kwargs: Any) -> PatchPlan:
    """Plan a patch from a config (the text part of a multimodal one) and a spec without touching any module.

    The spec is a parsed `RopeSpec`; a dict, a YAML path or keywords are parsed here first (the Python API's edge).
    The plan is built complete, once, and returned as built: a frozen `PatchPlan` nothing writes into afterwards."""
    config = compat.text_config(config)
    check_rope_model(config)
    spec = load_spec(spec, **kwargs)
    facts = _read_facts(config)
    variants = _target_variants(facts, spec)
    targets = tuple(variants)
    resolved = _resolved(facts, spec, targets)
    method = resolved.rope_method
    base_theta = float(resolved.rope_theta or facts.pristine_slots[targets[0]]["rope_theta"])
    rotary_dims, rotating = _rotary_dims(config, facts, variants)
    own_rope, kept = _own_rope(config, facts, resolved, targets)
    slots = _written_slots(facts, resolved, variants, rotary_dims, base_theta, own_rope)
    # a method that keeps the scheme leaves what stock loaders read as shipped (Qwen2.5's 32768 beside its YaRN x4)
    new_max = facts.pristine_max_position_embeddings if method.keeps_scheme else method.max_position_embeddings(resolved)
    marker = _marker(facts, resolved)
    changed = _changes(facts, slots, int(new_max), marker, method)
    if changed:
        _check_replaces(facts, resolved, targets, base_theta)
    first = targets[0]
    attention = _stock_attention(resolved, slots[first], rotary_dims[first], base_theta, own_rope.get(first))
    plan = PatchPlan(
        spec=resolved,
        slots=slots,
        targets=targets,
        old_slots=facts.slots,
        old_max_position_embeddings=facts.max_position_embeddings,
        max_position_embeddings=int(new_max),
        marker=marker,
        changed=changed,
        base_theta=base_theta,
        rotary_dims=rotary_dims,
        attention_factor=attention,
        warnings=tuple(method.loader_notes(resolved)),
        own_rope=own_rope,
        kept_scheme=kept,
        rotating=rotating,
    )
    if changed:
        _check_stock_accepts(config, plan)
    return plan


def _read_facts(config):
    """The config's RoPE, read once (`facts.read_rope`); refused without a max_position_embeddings to count from."""
    facts = read_rope(config)
    if facts.max_position_embeddings is None:
        raise SpecError(
            "the model config has no max_position_embeddings; set original_max_position_embeddings in the spec",
            field="original_max_position_embeddings",
        )
    return facts


def _target_variants(facts, spec: RopeSpec) -> dict[str | None, Proportional | None]:
    """The slots the spec rescales, each with the RoPE variant it ships (None: plain RoPE); refused where the
    variant cannot carry the method."""
    pristine = facts.pristine_slots
    variants = {target: variant_of(pristine[target]) for target in _targets(facts.slots, spec)}
    for target, variant in variants.items():
        if variant is not None:
            where = "its layers" if target is None else f"its {target} layers"
            variant.check(spec.rope_method, facts.model_type, where, pristine[target])
    return variants


def _resolved(facts, spec: RopeSpec, targets: tuple[str | None, ...]) -> RopeSpec:
    """The spec resolved on the model: its original length (the method's choice when the spec names none), factor
    and target length, refused if it reaches no further, with derived parameters written out (self-extend's G and
    W, ...)."""
    resolved = spec.resolve(spec.original_max_position_embeddings or spec.rope_method.original_length(facts, targets[0]))
    _check_reach(facts, resolved, spec)
    return resolved.rope_method.fill_params(resolved)


def _rotary_dims(config, facts, variants: dict) -> tuple[dict[str | None, int], dict[str | None, int]]:
    """Each target's rotary dimension (a variant's: the whole head_dim) and, in a variant, how many of its
    frequencies rotate."""
    rotary_dims, rotating = {}, {}
    for target, variant in variants.items():
        dim = facts.rotary_dims[target] if variant is None else variant.rotary_dim(config, target)
        if dim < 4 or dim % 2:
            raise UnsupportedModelError(f"rotary dimension {dim} (slot {target}) must be even and >= 4")
        rotary_dims[target] = dim
        if variant is not None:
            rotating[target] = variant.rotating(facts.pristine_slots[target], dim)
    return rotary_dims, rotating


def _own_rope(config, facts, spec: RopeSpec, targets) -> tuple[dict, str | None]:
    """A method that keeps the model's scheme: the model's own (inv_freq, attention factor) per target, as stock
    transformers builds it from the pristine config, and that scheme in words; ({}, None) for any other method."""
    if not spec.rope_method.keeps_scheme:
        return {}, None
    pristine = facts.pristine_slots
    shipped = compat.stock_config(config, pristine, facts.pristine_max_position_embeddings, None)
    return {target: compat.stock_rope(shipped, target) for target in targets}, _describe(pristine, targets, None)


def _written_slots(facts, spec: RopeSpec, variants: dict, rotary_dims: dict, base_theta: float, own_rope: dict) -> dict:
    """Every slot after the patch: each target as the method writes it (in its variant's form), with the attention
    factor stock loaders will build where the method writes one explicitly; the other slots as shipped."""
    method = spec.rope_method
    slots = {key: dict(value) for key, value in facts.pristine_slots.items()}
    for target, variant in variants.items():
        pristine, dim = facts.pristine_slots[target], rotary_dims[target]
        slot = method.config_slot(spec, pristine, dim, base_theta)
        if variant is not None:
            slot = variant.slot(slot, pristine)
        if method.writes_attention_factor:
            slot["attention_factor"] = _stock_attention(spec, slot, dim, base_theta, own_rope.get(target))
        slots[target] = slot
    return slots


def _slot_context(spec: RopeSpec, slot: dict, rotary_dim: int, base_theta: float, seq_len: int | None = None,
                 device=None) -> RopeContext:
    """The `RopeContext` the method computes a written slot's RoPE from (at `seq_len` for dynamic methods)."""
    return RopeContext(
        rotary_dim=rotary_dim,
        base=base_theta,
        original_max_position_embeddings=spec.original_max_position_embeddings,
        factor=spec.factor,
        params=spec.rope_method.context_params(spec, slot),
        seq_len=seq_len,
        device=device,
    )


def _stock_attention(spec: RopeSpec, slot: dict, rotary_dim: int, base_theta: float, own: tuple | None) -> float:
    """The attention factor stock loaders build from a written slot (dynamic-yarn: static YaRN's; a kept scheme:
    the model's own, `own`)."""
    if own is not None:
        return float(own[1])
    return float(spec.rope_method.stock_method.compute(_slot_context(spec, slot, rotary_dim, base_theta))[1])


def _marker(facts, spec: RopeSpec) -> dict:
    """What the written config records of the patch: rope-extend's version, the resolved spec and the original RoPE
    (and what stock loaders build, where that is not the method)."""
    marker = {
        "version": __version__,
        "method": spec.method,
        "spec": spec.to_dict(),
        "original": {
            "rope_parameters": encode_slots(facts.pristine_slots),
            "max_position_embeddings": facts.pristine_max_position_embeddings,
        },
    }
    note = spec.rope_method.marker_note(spec)
    if note:
        marker["stock_loaders"] = note
    return marker


def _check_replaces(facts, spec: RopeSpec, targets, base_theta: float) -> None:
    """Refuse a patch that changes the model where what it replaces says no: a method that keeps the model's scheme
    and window, over rope-extend's own patch (it would drop it); any other, where `_check_window` refuses."""
    if not spec.rope_method.keeps_scheme:
        _check_window(facts, spec, targets, base_theta)
        return
    marker = facts.marker
    if marker is not None and not _marker_keeps_scheme(marker):
        def keeps(words) -> str:
            return (f"the model carries rope-extend's own patch ({_describe(facts.slots, targets, marker)}); "
                    f"{spec.method} keeps the RoPE a model ships and remaps attention on top, which would "
                    f"drop that patch: {_undo(words)}, with {spec.method}")

        raise AlreadyScaledError(keeps(_flags), compose=keeps)


def _changes(facts, slots: dict, max_position_embeddings: int, marker: dict, method: RopeMethod) -> bool:
    """Whether writing `slots`, the length and `marker` changes the config `facts` were read from."""
    old = facts.marker
    return not (
        facts.max_position_embeddings == max_position_embeddings
        and all(compat.params_close(facts.slots[key], slots[key]) for key in facts.slots)
        and (old is None or old.get("spec") == marker["spec"])  # e.g. dynamic-yarn vs yarn
        and (old is not None or not method.acts_on_attention)  # the config alone does not show these
    )


def _check_reach(facts, spec: RopeSpec, given: RopeSpec) -> None:
    """Refuse a spec (`given`, resolved to `spec`) that reaches no further than the length it counts from (factor 1, a
    factor that rounds to it, a target length equal to it): it would extend nothing (an attention-level method would
    still change the model inside its window). A method meant for use inside the window (`works_inside_window`:
    STRING) is exempt. One rule for every method, said in lengths, whatever command planned it."""
    method, original, target = spec.rope_method, spec.original_max_position_embeddings, spec.target_length
    if target > original or method.works_inside_window:
        return
    longer = 2 * max(original, facts.window or 0)
    fix = {"target_length": longer}
    if facts.is_scaled and not method.keeps_scheme and not spec.replace_existing:
        fix["replace_existing"] = True
    if spec.factor != 1:
        asked = f"{spec.factor:.10g} x {original} rounds to {target}"
    else:
        asked = f"target length {target}" if given.factor is None else "factor 1"

    def compose(words) -> str:
        return (f"{spec.method} x{spec.factor:.10g}: {original} -> {target} tokens extends nothing ({asked}): it "
                f"reaches no further than the {original} tokens it counts from; to extend it: {words(fix)} ({spec.method} x{longer / original:g} over {original} -> {longer} tokens)")

    raise NoExtensionError(compose(_flags), fix=fix, value=spec.factor, compose=compose)


def _check_window(facts, spec: RopeSpec, targets, base_theta: float) -> None:
    """Refuse a patch that would stack on a scheme the model already carries, or write a window shorter than the
    source's (unless the spec says `shorten_window: true`), saying in lengths what the model reaches now, what the
    spec would reach, and the spec keys that really extend it (the error's `fix`; each message is composed for
    `patch`'s flags and reworded by front ends with other words for spec keys: `errors.Suggests`)."""
    window, original, target = facts.window or 0, spec.original_max_position_embeddings, spec.target_length
    reach = f"{spec.method} x{spec.factor:g} over the original {original} tokens"
    longer = target if target > window else 2 * window
    extend = {"target_length": longer, "replace_existing": True} if facts.is_scaled else {"target_length": longer}

    def extend_text(words) -> str:
        return f"{words(extend)} ({spec.method} x{longer / original:g} over {original} -> {longer} tokens)"

    if facts.is_scaled and not spec.replace_existing:
        scheme = _describe(facts.slots, targets, facts.marker)
        now = f"the model already carries RoPE scaling ({scheme}), {window} tokens now"
        if target >= window:
            def on_top(words) -> str:
                return (f"{now}; {reach} reaches {target}, but applying it on top would double-scale: add "
                        f"{words({'replace_existing': True})}"
                        + (" (spec: replace_existing: true)" if words is _flags else "")
                        + f" to re-derive {spec.method} from the original length {original} and base {base_theta:g} "
                        "instead" + (f", or {_undo(words)}" if facts.marker else ""))

            raise AlreadyScaledError(on_top(_flags), fix={"replace_existing": True}, compose=on_top)

        def shorter_than_now(words) -> str:
            return (f"{now}; {reach} would reach only {target}, shorter than now. To extend it: {extend_text(words)}; "
                    f"to replace the scheme at {window} tokens: "
                    f"{words({'target_length': window, 'replace_existing': True})} ({spec.method} "
                    f"x{window / original:g})" + (f"; or {_undo(words)}" if facts.marker else ""))

        raise AlreadyScaledError(shorter_than_now(_flags), fix=extend, compose=shorter_than_now)
    if target < window and not spec.shorten_window:
        def shorter(words) -> str:
            return (f"{reach} reaches {target} tokens, shorter than the source's window of {window}; to extend it: "
                    f"{extend_text(words)}; to write the shorter window on purpose: "
                    f"{words({'shorten_window': True})}")

        raise ShorterWindowError(shorter(_flags), fix=extend, value=target, compose=shorter)


def _flags(keys: dict) -> str:
    """`patch`'s flags setting spec `keys` (--target-length N, --factor S, --set key=true): how the plan's messages
    word a suggestion (`errors.Suggests.worded` rewords them for other front ends)."""
    words = {"target_length": "--target-length {}", "factor": "--factor {:g}"}
    return " ".join(words[key].format(value) if key in words else f"--set {key}={str(value).lower()}"
                    for key, value in keys.items())


_flags.undo = "patch the model this one was written from, its SOURCE"


def _undo(words) -> str:
    """How a front end says "start from the unpatched model": `words.undo` (patch's: its SOURCE), else in words every
    front end can act on (a command line has no `unpatch_model()`)."""
    return getattr(words, "undo", "start from the original model, the one this was written from")


def _marker_keeps_scheme(marker: dict) -> bool:
    """Whether a rope-extend marker records a method that kept the model's scheme (its config is the shipped one)."""
    try:
        return get_method(str(marker.get("method"))).keeps_scheme
    except SpecError:
        return False


def _check_stock_accepts(config, plan: PatchPlan) -> None:
    """Stock transformers must load the rewritten config to the planned RoPE, or we refuse before writing."""
    try:
        rebuilt = compat.stock_config(config, plan.slots, plan.max_position_embeddings, plan.marker)
    except Exception as exc:  # the config class's own validation, whatever it raises
        reason = str(exc).strip().splitlines()[-1].strip()
        raise UnsupportedModelError(
            f"{getattr(config, 'model_type', '?')} configs reject method {plan.spec.method!r} in transformers "
            f"{compat.TRANSFORMERS_VERSION}: {reason}; choose a method this model type accepts (e.g. ntk, which "
            "is a plain rope_theta change)"
        ) from None
    forced = compat.FORCED_SCALING_TYPE.get(getattr(config, "model_type", None))
    scaling = getattr(rebuilt, "rope_scaling", None)
    if forced and isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) != forced:
        raise UnsupportedModelError(
            f"{config.model_type} in transformers {compat.TRANSFORMERS_VERSION} applies {forced} scaling whenever "
            f"rope_scaling is set (its rotary module ignores the type), so {plan.spec.method!r} would load as "
            f"{forced}; use --method {forced}, or transformers >= 5 for {plan.spec.method!r}"
        )
    try:
        verify_stock_config(rebuilt, plan)
    except VerificationError as exc:
        raise UnsupportedModelError(
            f"{getattr(config, 'model_type', '?')} cannot carry {plan.spec.method!r} in config.json: {exc}"
        ) from None


def verify_stock_config(stock_config, plan: PatchPlan, rtol: float = 1e-6) -> None:
    """Raise VerificationError unless `stock_config` builds the planned frequencies and attention factor."""
    stock_config = compat.text_config(stock_config)
    for slot in plan.slots:
        got_freq, got_attn = compat.stock_rope(stock_config, slot)
        if slot in plan.targets:
            want_freq, want_attn = plan.expected_stock(slot)
        else:
            want_freq, want_attn = got_freq, got_attn
            old = plan.old_slots.get(slot)
            loaded = None if old is None else compat.read_slots(stock_config)[slot]
            if loaded is not None and not compat.params_close(loaded, old, rel=rtol):
                raise VerificationError(f"layer type {slot!r} was not supposed to change but loads as {loaded} "
                                        f"instead of {old}")
        if got_freq.shape != want_freq.shape or not torch.allclose(got_freq.float(), want_freq.float(), rtol=rtol, atol=0):
            diff = (got_freq.float() - want_freq.float()).abs().max().item() if got_freq.shape == want_freq.shape else None
            raise VerificationError(
                f"stock transformers builds different inv_freq for {slot or 'all layers'} "
                f"(shape {tuple(got_freq.shape)} vs {tuple(want_freq.shape)}, max abs diff {diff})"
            )
        if not math.isclose(float(got_attn), float(want_attn), rel_tol=rtol):
            raise VerificationError(
                f"stock transformers builds attention factor {float(got_attn):.6f} for {slot or 'all layers'}, "
                f"rope-extend computed {float(want_attn):.6f}"
            )


def _describe(slots, targets, marker) -> str:
    if marker:
        spec = marker.get("spec", {})
        return f"rope-extend {spec.get('method')} x{spec.get('factor')} from {spec.get('original_max_position_embeddings')}"
    params = slots[targets[0]]
    parts = [f"{params.get('rope_type')}"]
    if params.get("factor"):
        parts.append(f"x{params['factor']:g}")
    if params.get("original_max_position_embeddings"):
        parts.append(f"from {params['original_max_position_embeddings']}")
    return " ".join(parts)
