"""Apply a plan to an already-loaded model in place, and undo it.

Editing a loaded model's config changes nothing: rotary modules compute `inv_freq` once at construction. So
`patch_model` (1) plans the new RoPE from the config and the spec (`plan.plan_patch`, pure), (2) recomputes every
rotary module's frequencies and attention scaling with the method object on the module's device and dtype,
(3) rewrites the config so that the model's own `save_pretrained` / `push_to_hub` write the portable config
(`portable_saves.enable_portable_saves`), loaded identically by stock transformers 4.x and 5.x. Dynamic methods get a
forward pre-hook (`dynamic.DynamicRopeHook`) that recomputes the frequencies from the current length.

Everything `patch_model` changes is recorded in a `PatchState` on the model, which knows how to restore it.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import compat, dynamic
from .errors import ModelConfigError, ModelRunError, SpecError, Suggests
from .plan import PatchPlan, check_rope_model, plan_patch, recorded_spec
from .portable_saves import enable_portable_saves
from .rotary import ModuleChange, apply_plan, find_rotary_modules, no_rotary_modules_error
from .spec import RopeSpec, load_spec
from .verify import run_unpatched, verify_plan

_STATE_ATTR = "_rope_extend_state"


@dataclass
class PatchReport:
    """What `patch_model` did."""

    method: str
    factor: float
    original_max_position_embeddings: int
    old_max_position_embeddings: int
    new_max_position_embeddings: int
    attention_factor: float
    modules: list[str]
    changed: bool
    spec: RopeSpec
    warnings: list[str] = field(default_factory=list)
    kept_scheme: str | None = None  # a method that keeps the model's RoPE (STRING): that scheme, in words

    @classmethod
    def of(cls, plan: PatchPlan, modules: list[str], changed: bool) -> PatchReport:
        report = cls(
            method=plan.spec.method,
            factor=plan.spec.factor,
            original_max_position_embeddings=plan.spec.original_max_position_embeddings,
            old_max_position_embeddings=plan.old_max_position_embeddings,
            new_max_position_embeddings=plan.max_position_embeddings,
            attention_factor=plan.attention_factor,
            modules=modules,
            changed=changed,
            spec=plan.spec,
            warnings=list(plan.warnings),
            kept_scheme=plan.kept_scheme,
        )
        report._plan = plan
        return report

    @property
    def plan(self) -> PatchPlan | None:
        """The plan that was applied. Not a field: what the report records (eval's results, `str()`) stays what the
        patch did."""
        return getattr(self, "_plan", None)

    def __str__(self) -> str:
        what = "patched" if self.changed else "unchanged (already patched with this spec)"
        if self.kept_scheme is not None:
            return (
                f"{self.method}: {what}, on top of the model's own RoPE ({self.kept_scheme}, attention factor "
                f"{self.attention_factor:.4f}, kept); window {self.new_max_position_embeddings}; "
                f"{self.spec.rope_method.describe(self.spec)}; modules: {', '.join(self.modules)}"
            )
        return (
            f"{self.method} x{self.factor:g}: {what}; max length {self.old_max_position_embeddings} -> "
            f"{self.new_max_position_embeddings} (original {self.original_max_position_embeddings}); "
            f"attention factor {self.attention_factor:.4f}; modules: {', '.join(self.modules)}"
        )


@dataclass
class PatchState:
    """Everything `patch_model` changed on a model, and how to put it back."""

    plan: PatchPlan
    config_snapshot: dict  # the RoPE config attributes before the first patch
    modules: dict[str, ModuleChange] = field(default_factory=dict)  # "name|prefix" -> original state
    hooks: list[Any] = field(default_factory=list)  # removable handles of dynamic hooks
    touched: list[str] = field(default_factory=list)

    def restore_modules(self, model: nn.Module) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        dynamic.unwrap_generate(model)
        named = dict(model.named_modules())
        for change in self.modules.values():
            change.restore(named[change.name])
        self.modules = {}

    def restore(self, model: nn.Module) -> None:
        self.restore_modules(model)
        compat.restore_rope_config(compat.text_config(model.config), self.config_snapshot)

    def original_config(self, config):
        """A copy of the (text) config as it was before the first patch; the model is not touched."""
        original = copy.deepcopy(config)
        compat.restore_rope_config(original, self.config_snapshot)
        return original


def _state(model: nn.Module) -> PatchState | None:
    state = getattr(model, _STATE_ATTR, None)
    return state if isinstance(state, PatchState) else None


# --- patch / unpatch -------------------------------------------------------------------------------------------------
def _keywords(keys: dict) -> str:
    """`patch_model`'s keywords setting spec `keys` (target_length=N, replace_existing=True): how its errors word a
    suggestion (`errors.Suggests.worded`)."""
    return ", ".join(f"{key}={value!r}" for key, value in keys.items())


_keywords.undo = "call rope_extend.unpatch_model(model) first and patch the original"


def patch_model(
    model: nn.Module,
    spec: RopeSpec | dict | str | None = None,
    *,
    dynamic_mode: str = "consistent",
    verify: bool = True,
    **kwargs: Any,
) -> PatchReport:
    """Rescale an already-loaded model's RoPE in place and rewrite its config. Returns a `PatchReport`.

    `spec` is a `RopeSpec`, a dict, a YAML path, or keywords (`method="yarn", factor=4`). With no spec at all,
    the rope-extend marker of a checkpoint written by rope-extend is re-applied (restores dynamic methods that
    stock loaders load as static). Applying the same spec twice changes nothing; `unpatch_model` undoes it.
    After patching, `model.save_pretrained` / `push_to_hub` write a config.json that stock transformers 4.x and
    5.x both load to the patched RoPE; for a method they load as something else (dynamic-yarn as static YaRN,
    self-extend, dual-chunk and STRING as the model without them) saving warns, saying what they load and how to restore it.

    `dynamic_mode` (dynamic, dynamic-yarn, longrope): "consistent" fixes the scale per `generate` request so the
    KV cache stays valid; "stock" reproduces transformers' behaviour exactly (see `rope_extend.dynamic`).

    `verify` (default): before touching the model, check the plan with `rope_extend.verify.verify_plan` (stock
    transformers rebuilds the same RoPE from the rewritten config, and a forward beyond the original length runs and
    agrees on a small model of the same config); a plan that fails raises VerificationError and changes nothing.

    This is the Python API's edge: the spec is parsed and planned once here, then `apply_patch` executes the plan.
    """
    if dynamic_mode not in dynamic.MODES:
        raise SpecError(f"dynamic_mode {dynamic_mode!r} is not one of {', '.join(dynamic.MODES)}", field="dynamic_mode")
    config = compat.text_config(model.config)
    check_rope_model(config)
    if spec is None and not kwargs:
        spec = recorded_spec(config)
        if spec is None:
            raise SpecError("no spec given and the model carries no rope-extend marker; pass method=... factor=...")
    else:
        spec = load_spec(spec, **kwargs)
    if not find_rotary_modules(model):
        raise no_rotary_modules_error(model)
    try:
        plan = plan_patch(config, spec)
    except Suggests as exc:  # its way forward in this API's words: keywords, and unpatch_model()
        raise exc.worded(_keywords) from None
    if verify and plan.changed:  # before anything is touched (re-patching plans from the marker's pristine RoPE)
        verify_or_explain(plan, config)
    state = _state(model)
    if state is not None:
        if not plan.changed:  # the same spec again: nothing to do
            return PatchReport.of(plan, state.touched, changed=False)
        # re-patching starts from the true original so that unpatch_model restores it: what the plan changes counts
        # from there
        plan = plan.rebased(state.original_config(config))
    return apply_patch(model, plan, dynamic_mode=dynamic_mode)


def apply_patch(model: nn.Module, plan: PatchPlan, *, dynamic_mode: str = "consistent") -> PatchReport:
    """Execute a plan on a loaded model, in place: every rotary module's frequencies and attention scaling on its
    device and dtype (dynamic methods: a forward pre-hook), the attention of attention-level methods, and the config
    rewritten so that `save_pretrained` writes the portable config. Everything changed is recorded in a
    `PatchState` that `unpatch_model` restores. A model patched before is restored first (`PatchPlan.rebased`
    counts what the plan changes from that original config, as `patch_model` does); the checkpoint writer, `train`
    and `eval` call this with the plan they made."""
    config = compat.text_config(model.config)
    state = _state(model)
    if state is not None:  # re-patching: start from the true original so unpatch restores it
        state.restore(model)
        state = PatchState(plan, state.config_snapshot)
    else:
        state = PatchState(plan, compat.snapshot_rope_config(config))

    applied = apply_plan(model, plan, dynamic_mode)
    state.modules, state.hooks, state.touched = applied.changes, applied.hooks, applied.touched
    try:  # attention-level methods install their attention (the handles undo it); others install nothing
        state.hooks += plan.method.install_attention(model, plan)
    except Exception:
        state.restore_modules(model)
        if _state(model) is not None:  # re-patching: the previous patch is already undone
            delattr(model, _STATE_ATTR)
        raise
    compat.write_slots(config, plan.slots, plan.max_position_embeddings, plan.marker)
    if config is not model.config and hasattr(model.config, "max_position_embeddings"):
        model.config.max_position_embeddings = plan.max_position_embeddings
    enable_portable_saves()
    setattr(model, _STATE_ATTR, state)
    if plan.method.dynamic and dynamic_mode == "consistent" and hasattr(model, "generate"):
        dynamic.wrap_generate(model)
    # what stock loaders make of a saved copy (plan.warnings, in the report) is said when saving, where it applies
    return PatchReport.of(plan, state.touched, applied.changed or plan.changed)


# Config fields that a model type may carry without its modeling code applying them: when a model of the config
# cannot run (unpatched, or patched), the first of these whose removal makes it run is the one to name.
SUSPECT_FIELDS = ("partial_rotary_factor", "rotary_pct", "rotary_dim", "head_dim")


def verify_or_explain(plan: PatchPlan, config) -> None:
    """`verify_plan`, and when the patched model cannot run, whether the config is at fault rather than the patch.

    Asked of the installed transformers by running it, never by a rule about which fields a modeling code applies:
    (1) does a model of the config run as it is (`verify.run_unpatched`)? If not, a ModelConfigError (a ValueError)
    says it cannot run even before patching and names the field whose removal makes it run. (2) If it runs, does
    the same patch run once a suspect field is removed? Then the field is one the model's own RoPE ignores but
    stock transformers' scaled RoPE applies (a stray partial_rotary_factor on Llama: its default RoPE rotates the
    whole head, YaRN's rotates a part, and the attention then fails), so the checkpoint could never run in stock
    transformers: a ModelConfigError names the field. Otherwise the patch itself is what fails (ModelRunError)."""
    try:
        verify_plan(plan, source_config=config)
    except ModelRunError as exc:  # not a mismatch of frequencies or outputs (then the patch is what fails)
        patched_reason = _bare_reason(exc)
        runs, reason = _runs_unpatched(plan, config)
        if runs is None:
            raise  # cannot be told: the patch's own error stands
        text = compat.text_config(config)
        model_type = getattr(text, "model_type", "?")
        for name in SUSPECT_FIELDS:
            value = _field_value(text, name)
            if value is None:
                continue
            trimmed = _without(config, name)
            if not runs and _runs_unpatched(plan, trimmed)[0]:
                raise ModelConfigError(
                    f"the model cannot run a forward pass even before patching: its config sets {name} {value!r}, "
                    f"which {model_type}'s modeling code does not apply ({reason}); remove {name} from config.json "
                    "(or the model's config) if the model does not use it",
                    field=name, value=value,
                ) from None
            if runs and _patch_runs(plan, trimmed):
                raise ModelConfigError(
                    f"the model runs unpatched, but its config sets {name} {value!r}, which {model_type}'s own RoPE "
                    f"{_ignores_or_applies(plan, config, trimmed)} and the RoPE stock transformers builds for "
                    f"{plan.spec.method} applies, so the patched model cannot run a forward pass ({patched_reason}); "
                    f"remove {name} from config.json (or the model's config) if the model does not use it",
                    field=name, value=value,
                ) from None
        if runs:
            raise  # the unpatched model runs and no field explains it: the patch is what fails
        raise ModelConfigError(
            f"the model cannot run a forward pass even before patching ({reason}); its config.json does not "
            "describe a model stock transformers can run: fix or re-download it",
        ) from None


def _runs_unpatched(plan: PatchPlan, config) -> tuple[bool | None, str]:
    """Whether a small model of the config exactly as it is runs the probe inside its original window (None: cannot
    be told), and why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_unpatched(config, plan)
    except ModelRunError as exc:
        return False, _bare_reason(exc)
    except (ValueError, RuntimeError, AttributeError, TypeError):
        return None, ""
    return True, ""


def _patch_runs(plan: PatchPlan, config) -> bool:
    """Whether the same spec, planned on `config`, verifies (its patched model runs and agrees with stock)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            verify_plan(plan.for_config(config), source_config=config)
    except (ValueError, RuntimeError, AttributeError, TypeError):  # VerificationError is a RuntimeError
        return False
    return True


def _ignores_or_applies(plan: PatchPlan, config, trimmed) -> str:
    """'ignores' when the unpatched model's outputs are the same without the field (measured), else 'applies
    differently'."""
    try:
        same = torch.equal(run_unpatched(config, plan), run_unpatched(trimmed, plan))
    except (ValueError, RuntimeError):
        same = False
    return "ignores (its outputs are the same without it)" if same else "applies differently"


def _bare_reason(exc: Exception) -> str:
    """The modeling code's error inside verify's "the ... model cannot run a forward pass (...)" message, without the
    hint about partial_rotary_factor (the caller names the field it found)."""
    reason = str(exc).split("; the config sets")[0]
    for which in ("the patched", "the unpatched"):
        reason = reason.replace(f"{which} model cannot run a forward pass", "")
    return reason.strip(" ()") or str(exc)


def _field_value(text_config, name: str):
    """`name` on the config, or in its rope_parameters (5.x moves partial_rotary_factor there), else None."""
    value = getattr(text_config, name, None)
    rope = getattr(text_config, "rope_parameters", None)
    if value is not None or not isinstance(rope, dict):
        return value
    for params in (rope, *rope.values()):
        if isinstance(params, dict) and params.get(name) is not None:
            return params[name]
    return None


def _without(config, name: str):
    """A copy of the config with `name` removed (top level and every rope_parameters slot)."""
    config = copy.deepcopy(config)
    text = compat.text_config(config)
    if name in text.__dict__:
        delattr(text, name)
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict):
        rope.pop(name, None)
        for params in rope.values():
            if isinstance(params, dict):
                params.pop(name, None)
    return config


def unpatch_model(model: nn.Module) -> bool:
    """Restore the modules and config `patch_model` changed. Returns False if the model was not patched."""
    state = _state(model)
    if state is None:
        return False
    state.restore(model)
    delattr(model, _STATE_ATTR)
    return True
