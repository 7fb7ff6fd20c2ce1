"""The scaling spec: what to do to a model's RoPE, parsed and validated once, at the edge, before any model is touched.

A spec comes from YAML (`configs/*.yaml`), keyword arguments, or CLI flags layered over YAML (`load_spec`,
`RopeSpec.from_sources`). It is a union discriminated on `method` (pydantic's discriminated unions): each method's
spec class (`spec_class(name)`, e.g. `YarnSpec`) holds the method-independent fields of `RopeSpec` plus exactly the
parameters that method declares in its own file (`RopeMethod.params`: the one declaration of a parameter, whose
`Param` types and checks each value; the class is built from them with pydantic's `create_model`), so a parameter of
another method is a validation error by construction. `--set key=value` and eval's inline `--spec` read their values
with one parser (`parse_value`). `RopeSpec(**data)` builds the method's class. Invalid input of any shape raises
`SpecError` (a `ValueError`) naming the field, the bad value and the fix; nothing else escapes.

`factor` or `target_length` may be given (one derives the other from the original length). The original length
defaults to the model's, so a spec is *resolved* against a model (`RopeSpec.resolve`) before use.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from .errors import SpecError, yaml_error_detail
from .methods import RopeMethod, all_methods, all_params, canonical_name, get_method

FiniteFloat = Field(default=None, allow_inf_nan=False)

# Sane ranges, checked before any work (a value outside is a typo or an attack, never a real model).
MAX_FACTOR = 1024.0  # published long-context models use up to x64 (LongRoPE 2M tokens from 4k is x512)
MAX_TOKENS = 2**31 - 1  # llama.cpp positions are int32; no model serves more
MAX_SPEC_BYTES = 1024 * 1024  # a spec is a few hundred bytes; LongRoPE lists a few KB
MAX_SPEC_DEPTH = 4  # spec -> list of factors is depth 2
# The key under which an OUT's rope_extend.yaml also holds rope-extend's record of that folder (rope_extend.record):
# not a spec key, so a spec read from an OUT (`--config OUT/rope_extend.yaml`) drops it.
OUTPUT_RECORD_KEY = "output_record"


class RopeSpec(BaseModel):
    """A RoPE scaling spec: the method-independent fields, shared by every method's spec class.

    Build one with keywords (`RopeSpec(method="yarn", factor=4)`: an instance of the method's own class,
    `spec_class("yarn")`), `load_spec(path)`, or `RopeSpec.from_sources`. The method's parameters are fields of
    that class only."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    method: str
    factor: float | None = FiniteFloat
    target_length: int | None = None
    original_max_position_embeddings: int | None = None
    rope_theta: float | None = FiniteFloat

    # Which layer types to scale; sliding-window layers keep their local RoPE by default.
    layer_types: list[str] = Field(default_factory=lambda: ["full_attention"])
    # A model that already carries a scheme (llama3, yarn...) is refused unless this is true, in which case the
    # new scheme is derived from that scheme's original length and base and replaces it.
    replace_existing: bool = False
    # A patch never writes a window shorter than the source's unless this is true (None: not asked, left out of the
    # spec's dict and of eval fingerprints).
    shorten_window: bool | None = None

    def __new__(cls, *args: Any, **data: Any):
        if cls is RopeSpec:  # the union: the method's own spec class, validated (see `parse_spec`)
            return parse_spec(data)
        return super().__new__(cls)

    def __init__(self, /, **data: Any):
        if hasattr(self, "__pydantic_fields_set__"):  # built and validated by `__new__` already
            return
        super().__init__(**data)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> RopeSpec:
        if cls is RopeSpec and isinstance(obj, Mapping):
            return parse_spec(obj)
        return super().model_validate(obj, **kwargs)

    # -- field rules -------------------------------------------------------------------------------------------
    @field_validator("factor", "target_length", "original_max_position_embeddings", "rope_theta", mode="before")
    @classmethod
    def _core_numbers(cls, value: Any, info) -> Any:  # (`_numbers` is the method parameters' own, below)
        if isinstance(value, bool):  # `factor: true` is an error, not 1
            raise ValueError(f"must be a number, got {str(value).lower()} (a boolean)")
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _method(cls, value: Any) -> str:
        return canonical_name(value)

    @field_validator("factor")
    @classmethod
    def _factor(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError(
                f"factor must be >= 1 (it multiplies the context length), got {value}; "
                "to shorten a model's window, do not use RoPE scaling"
            )
        if value is not None and value > MAX_FACTOR:
            raise ValueError(
                f"factor must lie in [1, {MAX_FACTOR:g}] (no model extends its window more than that), got {value:g}"
            )
        return value

    @field_validator("target_length", "original_max_position_embeddings")
    @classmethod
    def _positive_int(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"must be a positive number of tokens, got {value}")
        if value is not None and value > MAX_TOKENS:
            raise ValueError(f"must lie in [1, {MAX_TOKENS}] tokens (positions are 32-bit in serving engines)")
        return value

    @field_validator("rope_theta")
    @classmethod
    def _base(cls, value: float | None) -> float | None:
        if value is not None and value <= 1:
            raise ValueError(
                f"the RoPE base must be > 1 (not only > 0: θ_i = base^(-2i/d), so a base <= 1 makes no frequency "
                f"ladder), got {value}"
            )
        return value

    @field_validator("layer_types")
    @classmethod
    def _layer_types(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one layer type, e.g. ['full_attention']")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _param_numbers(cls, value: Any, info) -> Any:
        """A number parameter given true/false (`--set shifted_offset=true`) is an error, not 1 or 0."""
        param = _params_of(cls).get(info.field_name)
        if param is not None and param.kind in (int, float) and isinstance(value, bool):
            raise ValueError(f"must be a number, got {str(value).lower()} (a boolean)")
        return value

    @field_validator("*")
    @classmethod
    def _param_rules(cls, value: Any, info) -> Any:
        """A method parameter's own rule (`Param.check`), declared with the method."""
        param = _params_of(cls).get(info.field_name)
        if param is not None and value is not None:
            param.check(value)
        return value

    # -- cross-field rules -------------------------------------------------------------------------------------
    @model_validator(mode="after")
    def _cross_field(self) -> RopeSpec:
        method = self.rope_method
        if self.factor is None and self.target_length is None and method.needs_factor:
            raise ValueError(f"method {self.method!r} needs 'factor' or 'target_length'; set one of them")
        method.validate(self)
        if self.original_max_position_embeddings is not None:
            self._check_lengths(self.original_max_position_embeddings)
        return self

    def _check_lengths(self, original: int) -> None:
        if self.target_length is not None and self.target_length < original:
            raise ValueError(
                f"target_length {self.target_length} is shorter than the original length {original}; "
                f"choose a target above {original}"
            )
        if self.factor is not None and self.target_length is not None:
            if abs(self.factor * original - self.target_length) >= 1:
                raise ValueError(
                    f"factor {self.factor} and target_length {self.target_length} disagree for original length "
                    f"{original} ({self.factor} x {original} = {self.factor * original:g}); give only one of them"
                )

    # -- resolution --------------------------------------------------------------------------------------------
    def resolve(self, original_max_position_embeddings: int) -> RopeSpec:
        """Fill in original length, factor and target length. Raises SpecError when they are inconsistent."""
        original = self.original_max_position_embeddings or original_max_position_embeddings
        if original is not None and (isinstance(original, bool) or not isinstance(original, (int, float))
                                     or not 1 <= original <= MAX_TOKENS or original != int(original)):
            raise SpecError(
                f"the original context length {original!r} is not a number of tokens in [1, {MAX_TOKENS}]; give the "
                "length the model was trained with (original_max_position_embeddings; CLI: --original-length)",
                field="original_max_position_embeddings",
                value=original,
            )
        if original is None:
            raise SpecError(
                "the original context length is unknown: the model config has no max_position_embeddings; "
                "set original_max_position_embeddings in the spec",
                field="original_max_position_embeddings",
                value=original,
            )
        try:
            self._check_lengths(original)
        except ValueError as exc:
            raise SpecError(str(exc), field="target_length", value=self.target_length) from None
        factor = self.factor if self.factor is not None else (self.target_length or original) / original
        target = self.target_length if self.target_length is not None else int(round(factor * original))
        if factor > MAX_FACTOR:  # only a target length can make it (a factor is checked when given)
            raise SpecError(
                f"target_length {target} over the original length {original} is x{factor:g}, outside the factor "
                f"range [1, {MAX_FACTOR:g}] (no model extends its window more than that); choose a target of at most "
                f"{int(MAX_FACTOR * original)} tokens",
                field="target_length",
                value=target,
            )
        if target > MAX_TOKENS:  # only a factor can make it (a target length is checked when given)
            raise SpecError(
                f"factor {factor:g} x the original length {original} = {target} tokens, beyond {MAX_TOKENS} "
                "(positions are 32-bit in serving engines); choose a factor of at most "
                f"{math.floor(MAX_TOKENS / original * 1000) / 1000:g}",
                field="factor",
                value=factor,
            )
        return self.model_copy(
            update={"original_max_position_embeddings": int(original), "factor": float(factor), "target_length": target}
        )

    def method_params(self) -> dict[str, Any]:
        """The method parameters that were set explicitly (defaults live with the method: `get_method(m).params`)."""
        return {name: getattr(self, name) for name in type(self).model_fields
                if name not in CORE_FIELDS and getattr(self, name) is not None}

    @property
    def rope_method(self) -> RopeMethod:
        """The `RopeMethod` object of this spec's method."""
        return get_method(self.method)

    # -- (de)serialisation -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(exclude_none=True)
        if data.get("layer_types") == ["full_attention"]:
            data.pop("layer_types")
        for flag in ("replace_existing", "shorten_window"):
            if not data.get(flag):
                data.pop(flag, None)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_sources(
        cls, config: str | Path | dict | None = None, overrides: dict[str, Any] | None = None
    ) -> RopeSpec:
        """A spec from a YAML file (or dict) with keys overridden by CLI flags / keyword arguments."""
        data: dict[str, Any] = {}
        if config is not None:
            data = dict(config) if isinstance(config, dict) else _read_yaml(config)
            data.pop(OUTPUT_RECORD_KEY, None)
        for key, value in (overrides or {}).items():
            if value is not None:
                data[key] = value
        if "method" not in data:
            raise SpecError(
                "the spec has no 'method'; set one of: " + ", ".join(_method_names()), field="method", value=None
            )
        # A factor given as an override replaces the YAML's target_length (and vice versa) instead of conflicting.
        overrides = overrides or {}
        if overrides.get("factor") is not None and overrides.get("target_length") is None:
            data.pop("target_length", None)
        if overrides.get("target_length") is not None and overrides.get("factor") is None:
            data.pop("factor", None)
        return parse_spec(data)


CORE_FIELDS = tuple(RopeSpec.model_fields)


@functools.cache
def _params_of(cls: type[RopeSpec]) -> dict[str, Any]:
    """The `Param`s of the method whose spec class is `cls` (none for `RopeSpec` itself)."""
    names = get_args(cls.model_fields["method"].annotation)
    return get_method(names[0]).params if names else {}


def spec_keys() -> list[str]:
    """Every key a spec may hold: the core fields, then every registered method parameter (in the order specs
    write them)."""
    return [*CORE_FIELDS, *all_params()]


# --- one spec class per method, derived from the method's parameters ------------------------------------------------
# A method declares its parameters once, in its own file (`RopeMethod.params`: type, default, doc, rule); its spec
# class is built from them here: `RopeSpec`'s core fields, then the method's parameters as typed, optional fields in
# the order every spec writes its keys (`all_params`), each checked by its `Param` (`RopeSpec._param_rules`).
_FIELD_TYPES: dict[type, Any] = {float: float | None, int: int | None, bool: bool | None, list: list[float] | None}


def spec_class(name: str) -> type[RopeSpec]:
    """The spec class of method `name` (an alias or any spelling `canonical_name` accepts), e.g. `YarnSpec`."""
    return _spec_class_of(get_method(name))


@functools.cache
def _spec_class_of(method: RopeMethod) -> type[RopeSpec]:
    order = list(all_params())
    fields: dict[str, Any] = {"method": (Literal[method.name], ...)}
    for key in sorted(method.params, key=order.index):
        kind = method.params[key].kind
        fields[key] = (_FIELD_TYPES[kind], FiniteFloat if kind is float else None)
    return create_model(
        f"{type(method).__name__}Spec",
        __base__=RopeSpec,
        __module__=__name__,
        __doc__=f"A {method.name} spec: the core fields of `RopeSpec` and {method.name}'s parameters.",
        **fields,
    )


def __getattr__(name: str) -> type[RopeSpec]:
    """A method's spec class by its name (`rope_extend.spec.YarnSpec`): how pickle finds one."""
    for method in all_methods():
        if f"{type(method).__name__}Spec" == name:
            return _spec_class_of(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tag(value: Any) -> str | None:
    """The discriminator: a spec's (canonical) method name."""
    return value.get("method") if isinstance(value, Mapping) else getattr(value, "method", None)


@functools.cache
def _union(names: tuple[str, ...]) -> TypeAdapter:
    members = tuple(Annotated[spec_class(name), Tag(name)] for name in names)
    return TypeAdapter(Annotated[Union[members], Discriminator(_tag)])  # noqa: UP007 (a tuple of members)


def parse_spec(data: Mapping[str, Any]) -> RopeSpec:
    """Validate a spec given as a mapping: the one parser behind `RopeSpec(**data)`, `load_spec` and the CLI.

    The method is read first (a missing, unknown or misspelt one is a SpecError naming the choices), then the union
    picks its class, which rejects a parameter of another method by construction."""
    data = dict(data)
    if "method" not in data:
        raise SpecError("the spec is missing 'method'; add it (e.g. method: yarn)", field="method", value=None)
    try:
        data["method"] = canonical_name(data["method"])
    except SpecError as exc:  # in the words of every other field's bad value
        value = data["method"]
        raise SpecError(f"spec field 'method' has bad value {value!r}: {exc}", field="method", value=value) from None
    try:
        return _union(tuple(m.name for m in all_methods())).validate_python(data)
    except ValidationError as exc:
        raise _spec_error(exc, data["method"]) from None


def load_spec(source: str | Path | dict | RopeSpec | None = None, **overrides: Any) -> RopeSpec:
    """A spec from a YAML path, a dict, an existing spec, or keywords only."""
    if isinstance(source, RopeSpec):
        return source.model_copy(update=overrides) if overrides else source
    if source is None and not overrides:
        raise SpecError("no spec given: pass a YAML path, a dict, or method=... and factor=...", field=None)
    return RopeSpec.from_sources(source, overrides)


def parse_set_option(item: str) -> tuple[str, Any]:
    """`key=value` from `--set`; the value is parsed as (strict) YAML: numbers, lists, booleans."""
    key, raw = _split_assignment(item)
    if key is None:
        raise SpecError(f"--set expects key=value, got {item!r}; e.g. --set beta_fast=64", field=item)
    if not key:
        raise SpecError(f"--set {item!r} has no key; e.g. --set beta_fast=64", field=item)
    if not raw.strip():
        raise SpecError(f"--set {key}= has an empty value; give one (--set {key}=VALUE) or drop the option",
                        field=key)
    return key, parse_value(key, raw, "--set")


def parse_inline_spec(text: str) -> dict[str, Any] | str:
    """A `--spec` argument (eval): an inline spec `method=yarn,factor=2` becomes a dict, each value read as `--set`
    reads one (`parse_value`); anything else (a YAML/JSON path) is returned as is."""
    if "=" not in text or text.endswith((".yaml", ".yml", ".json")):
        method = _method_named(text)
        if method is not None and not Path(text).exists():
            raise SpecError(f"--spec {text!r} names a method but no spec: write it inline with its factor, e.g. "
                            f"--spec method={method},factor=2, or give a spec YAML file", field="method", value=text)
        return text
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, raw = _split_assignment(item)
        if not key:
            raise SpecError(f"inline spec {text!r}: {item!r} is not key=value; write e.g. 'method=yarn,factor=2'",
                            field=item)
        out[key] = parse_value(key, raw.strip(), "--spec") if raw.strip() else None
    return out


def _method_named(text: str) -> str | None:
    """The method `text` names (an alias or spelling `canonical_name` accepts), or None."""
    try:
        return canonical_name(text.strip())
    except SpecError:
        return None


def _split_assignment(item: str) -> tuple[str | None, str]:
    """`key=value` split at the first `=`, the key stripped and its `-` read as `_`; (None, item) without `=`."""
    key, sep, raw = item.partition("=")
    return (key.strip().replace("-", "_"), raw) if sep else (None, item)


# YAML 1.1 numbers that YAML 1.2 (the spec loader) reads as strings: 0x10 (16), 0o10 and 010 (8), 0b10 (2), 1:30 (90).
_YAML11_NUMBER = re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[oObB]?[0-7_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+)$")


def parse_value(key: str, raw: str, flag: str) -> Any:
    """The value of one `key=value` (`--set`, eval's `--spec`): strict YAML (numbers, lists, booleans), else the
    text. A number written the YAML 1.1 way (`0x10`, `010`, `1:30`), which other YAML readers take as 16, 8 and 90,
    is refused rather than read either way."""
    text = raw.strip()
    if _YAML11_NUMBER.match(text) and text.lstrip("+-") != "0":
        read = yaml.safe_load(text)  # YAML 1.1's reading, named in the refusal
        raise SpecError(f"{flag} {key}={text}: {text!r} is not a plain decimal number (YAML 1.1 reads it as {read}, "
                        f"YAML 1.2 as text); write it in decimal, e.g. {key}={read}", field=key, value=text)
    try:
        return load_yaml_text(raw, f"{flag} {key}")
    except SpecError:
        return raw


# --- bounded, strict YAML --------------------------------------------------------------------------------------------
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader with bounds: no anchors or aliases (no "billion laughs"), limited nesting, duplicate keys refused,
    and YAML 1.2 numbers (`0x10`, `010`, `1_000` and `1:30` stay strings instead of YAML 1.1's 16, 8, 1000, 90)."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"aliases (*{event.anchor}) are not allowed in a spec; write the value out")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise yaml.YAMLError(f"anchors (&{event.anchor}) are not allowed in a spec; write the value out")
        self.depth += 1
        try:
            if self.depth > MAX_SPEC_DEPTH:
                raise yaml.YAMLError(f"the spec nests deeper than {MAX_SPEC_DEPTH} levels; a spec is flat key: value")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.YAMLError(f"spec keys must be names such as 'factor', got {key!r}")
            if key in seen:
                raise yaml.YAMLError(f"key {key!r} appears twice; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_SpecLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def load_yaml_text(text: str, what: str) -> Any:
    """*text* read by the strict spec loader (YAML 1.2 scalars, bounded; spec files, `--set` values and OUT\'s
    record); a SpecError naming *what* otherwise."""
    try:
        return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        kind = "a valid spec" if type(exc) is yaml.YAMLError else "valid YAML"  # our bounds vs PyYAML's syntax
        raise SpecError(f"{what} is not {kind}{yaml_error_detail(exc)}", field="config") from None
    except RecursionError:
        raise SpecError(f"{what} nests too deeply; a spec is flat key: value", field="config") from None


def _read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                f"spec file {str(path)!r} is {size} bytes, above the {MAX_SPEC_BYTES} byte limit (a spec is a few "
                "lines); check the path",
                field="config",
                value=str(path),
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        method = _method_named(str(path))
        fix = (f"{str(path)!r} is a method, not a spec file: give it with its factor (patch: --method {method} "
               f"--factor 2; eval: --spec method={method},factor=2)" if method else "check the path")
        raise SpecError(f"spec file {str(path)!r} does not exist; {fix}", field="config", value=str(path)) from None
    except IsADirectoryError:
        raise SpecError(f"spec file {str(path)!r} is a folder; give a YAML file", field="config", value=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise SpecError(f"cannot read spec file {str(path)!r}: {reason}", field="config", value=str(path)) from None
    try:
        data = load_yaml_text(text, f"spec file {str(path)!r}")
    except SpecError as exc:
        raise SpecError(f"{exc}; fix it (key: value per line)", field="config", value=str(path)) from None
    if data is None:
        raise SpecError(f"spec file {str(path)!r} is empty (or only comments); write the spec in it, one key: value "
                        "per line, e.g. 'method: yarn' and 'factor: 2'", field="config", value=str(path))
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single value", int: "a number", float: "a number", bool: "a boolean"}
        raise SpecError(
            f"spec file {str(path)!r} holds {kind.get(type(data), type(data).__name__)} ({str(data)[:40]!r}), not a "
            "YAML mapping: write one key: value per line, e.g. 'method: yarn' and 'factor: 2'",
            field="config",
            value=str(path),
        )
    return data


def _method_names() -> list[str]:
    from .methods import method_names

    return method_names()


def _spec_error(exc: ValidationError, method: str) -> SpecError:
    """Turn pydantic's report into one line that names the field, the value and the fix.

    A parameter of another method is reported only when nothing else is wrong (it is the last thing to fix), in the
    words of a cross-field rule."""
    errors = exc.errors(include_url=False)
    foreign = [e for e in errors if e.get("type") == "extra_forbidden" and _key(e, method) in all_params()]
    err = next((e for e in errors if e not in foreign), None) or foreign[0]
    loc = _key(err, method)
    value = err.get("input")
    kind = err.get("type", "")
    msg = err.get("msg", "invalid value")
    if err in foreign:
        reads = get_method(method).params
        return SpecError(
            f"invalid spec: parameter {loc!r} does not apply to method {method!r} (it reads: "
            f"{', '.join(reads) or 'no extra parameters'}); remove it or change the method",
            field=None,
            value=value,
        )
    if kind == "extra_forbidden":
        fields = spec_keys()
        close = difflib.get_close_matches(str(loc), fields, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return SpecError(f"unknown spec key {loc!r}: {hint}valid keys are {', '.join(fields)}", field=loc, value=value)
    if kind == "missing":
        return SpecError(f"the spec is missing {loc!r}; add it (e.g. method: yarn)", field=loc, value=value)
    msg = msg.removeprefix("Value error, ")
    if kind in ("finite_number",):
        msg = "must be a finite number (NaN and infinity are not allowed)"
    elif kind.startswith(("float_", "int_", "bool_", "list_")):
        msg = f"{msg}; give a plain number" if not kind.startswith(("bool_", "list_")) else msg
    if loc is None:  # a cross-field rule: its message already names the fields and values
        return SpecError(f"invalid spec: {msg}", field=None, value=value)
    return SpecError(f"spec field {loc!r} has bad value {value!r}: {msg}", field=loc, value=value)


def _key(error: dict, method: str) -> str | None:
    """The spec key an error of the union is about (its location without the union's tag), None for a rule across
    fields."""
    loc = tuple(error.get("loc", ()))
    if loc[:1] == (method,):
        loc = loc[1:]
    return ".".join(str(part) for part in loc) or None
