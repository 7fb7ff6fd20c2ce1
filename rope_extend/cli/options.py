"""The options several commands share, declared once and turned into flags (as mergekit's `add_merge_options`).

- The spec's flags (`Method`, `Factor`, `TargetLength`, `SpecFile`, `Sets`), shared by `patch`, `train`, `engines`
  and `inspect`, and the one spec they build (`build_spec`); `eval`'s inline `--spec` reads its values with the same
  parser (`spec.parse_inline_spec`).
- `options_flags`: the fields of an options dataclass (`write_options.WriteOptions`, `eval.options.EvalOptions`,
  `tune.options.TuneOptions`) that carry a `help` in their metadata become the command's flags, and the command
  receives the dataclass built from them.
- The flags several commands share without such a dataclass: `rope_extend.flags`' (`flag_option`: `NoMemoryCheck`,
  `Dtype`...) and the Hub's and the unpatched model's (`PushToHub`, `Private`, `Revision`, `UnpatchedModel`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import SpecError
from ..flags import DTYPE, MEMORY_CHECK, OVERWRITE, PLOTS, VERIFY, Flag
from .app import fail

if TYPE_CHECKING:
    from ..spec import RopeSpec

METHOD_HELP = "Scaling method (see `rope-extend methods`)."

Factor = Annotated[float | None, typer.Option("--factor", "-f", help="Scale factor s >= 1.")]
TargetLength = Annotated[int | None, typer.Option("--target-length", "-t", help="New context length (derives the factor).")]
SpecFile = Annotated[Path | None, typer.Option("--config", "-c", help="YAML spec; flags override its keys.")]
Sets = Annotated[list[str] | None, typer.Option("--set", help="Override a spec key: --set beta_fast=64 (repeatable).")]


def flag_option(flag: Flag, annotation: Any) -> Any:
    """A shared flag (`flags.Flag`) as the typer option of a command that has no options dataclass for it (a
    `--no-...` flag: a bool that is false unless given)."""
    return Annotated[annotation, typer.Option(flag.name, help=flag.help)]


Dtype = flag_option(DTYPE, str)
NoMemoryCheck = flag_option(MEMORY_CHECK, bool)
NoPlots = flag_option(PLOTS, bool)
NoVerify = flag_option(VERIFY, bool)
Overwrite = flag_option(OVERWRITE, bool)
PushToHub = Annotated[str | None, typer.Option(
    "--push-to-hub", help="Then upload OUT to this Hub repo id (token: HF_TOKEN or `hf auth login`).")]
Private = Annotated[bool, typer.Option("--private", help="Create the Hub repo as private.")]
Revision = Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit) of SOURCE.")]
UnpatchedModel = Annotated[str, typer.Argument(
    help="Unpatched checkpoint folder, Hub id, or 'smollm2' (the demo model).")]
Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def method_option(help: str) -> Any:
    """`--method` with a command's own words for what it does with the method (`train`: static methods only)."""
    return Annotated[str | None, typer.Option("--method", "-m", help=help)]


Method = method_option(METHOD_HELP)


def build_spec(
    method: str | None, factor: float | None, target_length: int | None, config: Path | None, sets: list[str]
) -> RopeSpec:
    """The spec from --config (YAML) with --method/--factor/--target-length/--set layered on top.

    A key given twice on the command line with different values (e.g. --factor 2 --set factor=8, or --set twice)
    is an error, never a silent choice."""
    from ..spec import load_spec, parse_set_option

    overrides: dict = {}
    for item in sets or []:
        key, value = parse_set_option(item)
        if key in overrides and overrides[key] != value:
            raise SpecError(f"--set {key} is given twice ({overrides[key]!r} and {value!r}); keep one", field=key)
        overrides[key] = value
    for key, value in (("method", method), ("factor", factor), ("target_length", target_length)):
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in overrides and overrides[key] != value:
            raise SpecError(
                f"{flag} {value:g} and --set {key}={overrides[key]} disagree; give {key} once" if isinstance(value, float)
                else f"{flag} {value} and --set {key}={overrides[key]} disagree; give {key} once",
                field=key,
                value=value,
            )
        overrides[key] = value
    if config is None and "method" not in overrides:
        fail("give --method (with --factor or --target-length) or --config spec.yaml")
    return load_spec(config, **overrides)


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of dataclass `cls` that are flags: those whose metadata has a `help`."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def _negated(f: dataclasses.Field) -> bool:
    """A `--no-...` flag of a field that defaults to true: given, it sets the field false."""
    return f.metadata.get("flag", "").startswith("--no-") and f.default is True


def _flag(f: dataclasses.Field, hints: dict[str, Any]) -> tuple[Any, Any]:
    """A field as a typer parameter: (annotation, default). `flag` in its metadata names the flag (default:
    --field-name)."""
    name = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
    option = typer.Option(name, help=f.metadata["help"])
    return (Annotated[bool, option], False) if _negated(f) else (Annotated[hints[f.name], option], f.default)


def options_flags(**groups: type):
    """Turn the flag fields of each options dataclass into the command's flags: the command declares a parameter
    `name: Cls` per group (where the flags go in its help) and receives `Cls(**flags)`."""

    def decorate(func):
        signature = inspect.signature(func, eval_str=True)
        hints = typing.get_type_hints(func, include_extras=True)
        params, annotations = [], {}
        for param in signature.parameters.values():
            if param.name not in groups:
                params.append(param)
                annotations[param.name] = hints[param.name]
                continue
            cls = groups[param.name]
            field_hints = typing.get_type_hints(cls)
            for f in flag_fields(cls):
                annotation, default = _flag(f, field_hints)
                name = f"{param.name}__{f.name}"
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=annotation))
                annotations[name] = annotation

        @functools.wraps(func)
        def command(**kwargs: Any):
            for group, cls in groups.items():
                values = {f.name: kwargs.pop(f"{group}__{f.name}") for f in flag_fields(cls)}
                kwargs[group] = cls(**{f.name: not values[f.name] if _negated(f) else values[f.name]
                                       for f in flag_fields(cls)})
            return func(**kwargs)

        command.__signature__ = signature.replace(
            parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
        command.__annotations__ = annotations
        return command

    return decorate
