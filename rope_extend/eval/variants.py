"""Model variants for before/after evaluation: loading a checkpoint and applying a RoPE spec.

Light to import (torch and transformers load inside the functions that need them): `rope-extend eval` checks its
arguments through this module before anything heavy is imported."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASELINE = "unpatched"


@dataclass
class Variant:
    """A named model variant: ``spec=None`` is the unpatched baseline.

    ``spec`` may be a ``RopeSpec``, a dict, a YAML path (parsed here, once: eval's edge), or a callable
    ``f(model) -> report`` (escape hatch for custom patches and tests). ``plan``: the spec's ``PatchPlan`` on the
    evaluated model's config where the caller made it already (`patch --eval` evaluates the plan it writes);
    otherwise `run_eval` plans the spec once.
    """

    name: str
    spec: Any = None
    plan: Any = None

    def __post_init__(self) -> None:
        if not _is_custom(self.spec):
            from ..spec import load_spec

            self.spec = load_spec(self.spec)

    def spec_dict(self) -> dict | None:
        """The spec as a plain dict (made once per variant: every record carries it and its fingerprint)."""
        return copy.deepcopy(self._spec_dict)

    @functools.cached_property
    def _spec_dict(self) -> dict | None:
        return spec_to_dict(self.spec)

    def rope_spec(self):
        """The variant's spec (a `RopeSpec`; None for the baseline or a callable)."""
        return None if _is_custom(self.spec) else self.spec

    @functools.cached_property
    def fingerprint(self) -> str:
        d = self._spec_dict
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]


def _is_custom(spec) -> bool:
    """The baseline (None) or a callable patch: no spec to parse."""
    return spec is None or (callable(spec) and not isinstance(spec, dict))


def applies(case, variant: Variant) -> bool:
    """Whether *variant* runs *case* (an `eval.suite.Case`): inside-window ceiling cases are for the unpatched model
    only."""
    return not case.ceiling_only or variant.spec is None


def inline_spec(data: dict) -> str | None:
    """The ``--spec`` argument ``spec.parse_inline_spec`` reads back as `data` (``method=yarn,factor=2``); None where a value
    cannot be written inline (a list: its commas would split it)."""
    if any(isinstance(value, (list, tuple, dict)) for value in data.values()):
        return None
    def word(value) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    return ",".join(f"{key}={word(value)}" for key, value in data.items())


def spec_words(spec):
    """How `eval` words a suggestion of spec keys (`errors.Suggests.worded`): the whole ``--spec`` with the keys in
    place (a suggested length replaces the factor and target length given), or the keys alone where the spec cannot
    be written inline."""
    def words(keys: dict) -> str:
        given = {k: v for k, v in spec.to_dict().items() if "target_length" not in keys or k not in ("factor", "target_length")}
        whole = inline_spec({**given, **keys})
        return f"--spec {whole}" if whole else f"the spec keys {inline_spec(keys)}"

    return words


def spec_to_dict(spec) -> dict | None:
    """A variant's spec as the plain dict its records carry (a dict or YAML path is parsed: equivalent specs share a
    fingerprint)."""
    if spec is None:
        return None
    if _is_custom(spec):
        return {"callable": getattr(spec, "__qualname__", repr(spec))}
    from ..spec import load_spec

    return load_spec(spec).model_dump(mode="json", exclude_none=True)


def variant_name(spec, used: set[str]) -> str:
    """A unique name for *spec*: a YAML path's stem, a callable's name, else method-xFACTOR."""
    if isinstance(spec, (str, os.PathLike)):
        base = Path(spec).stem
    else:
        d = spec_to_dict(spec) or {}
        if "callable" in d:
            base = d["callable"].split(".")[-1]
        else:
            method = d.get("method", "spec")
            factor = d.get("factor")
            base = f"{method}-x{factor:g}" if isinstance(factor, (int, float)) else str(method)
    name, k = base, 2
    while name in used or name == BASELINE:
        name, k = f"{base}-{k}", k + 1
    used.add(name)
    return name


def make_variants(specs: list | dict | None, include_baseline: bool = True) -> list[Variant]:
    """``[spec, ...]`` or ``{name: spec}`` -> variants, baseline first."""
    out = [Variant(BASELINE, None)] if include_baseline else []
    used: set[str] = set()
    if specs is None:
        return out
    if isinstance(specs, dict):
        for name, spec in specs.items():
            if name == BASELINE:
                raise ValueError(f"variant name {BASELINE!r} is reserved for the unpatched model")
            used.add(name)
            out.append(Variant(name, spec))
        return out
    for spec in specs:
        if isinstance(spec, Variant):
            used.add(spec.name)
            out.append(spec)
        elif isinstance(spec, tuple) and len(spec) == 2:
            used.add(spec[0])
            out.append(Variant(spec[0], spec[1]))
        else:  # parsed once (`Variant`), named by its path or its parsed spec
            variant = Variant("", spec)
            variant.name = variant_name(spec if isinstance(spec, (str, os.PathLike)) else variant.spec, used)
            out.append(variant)
    return out


def load_model(model_path, dtype: str = "float32", device_map: str | None = None, device: str | None = None):
    """Load an HF causal LM + tokenizer (fp32 by default; ``device_map`` needs accelerate)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..compat import dtype_kwargs

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    kwargs: dict = {}
    if device_map:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(str(model_path), **dtype_kwargs(torch_dtype), **kwargs)
    if device and not device_map:
        model.to(device)
    model.eval()
    return model, load_tokenizer(model_path)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_path):
    """The model's tokenizer, or one line naming the folder, the tokenizer files it lacks and transformers' reason."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_path))
    except Exception as exc:  # whatever transformers raises for a missing or broken tokenizer
        from ..errors import CheckpointError

        folder = Path(model_path)
        present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) <= 200 else reason[:200].rsplit(" ", 1)[0] + " ..."
        files = (f"it holds {', '.join(present)}; transformers: {reason}" if present else
                 f"it has none of {', '.join(TOKENIZER_FILES)}")
        raise CheckpointError(
            f"{model_path}: no tokenizer transformers can load ({files}); eval reads "
            "its texts and prompts through the model's own tokenizer: copy the tokenizer files of the model it came "
            f"from into {model_path}"
        ) from None


@dataclass(frozen=True)
class Window:
    """The window an evaluation counts from: `length`, what the model serves as shipped (`RopeFacts.shipped_window`:
    Llama 3.1's 131072, not llama3's 8192; a rope-extend checkpoint's source model's); `pre_scaling`, the length its
    shipped scheme counts from where that is shorter (8192), and `scheme` in words ("llama3 x8"). Suite lengths
    ("2x"), the "beyond original" labels, the retrieval ceiling and the report all count from `length`."""

    length: int
    pre_scaling: int | None = None
    scheme: str | None = None

    def describe(self) -> str:
        """The report's words: "131072 tokens (the window the model serves: llama3 x8 over a pre-scaling 8192)"."""
        if self.pre_scaling is None:
            return f"{self.length} tokens"
        return (f"{self.length} tokens (the window the model serves: {self.scheme} over a pre-scaling "
                f"{self.pre_scaling}; suite lengths and labels count from {self.length})")


def model_window(config) -> Window:
    """The `Window` of a (text) config."""
    from ..facts import read_rope

    facts = read_rope(config)
    pre, window = facts.original_length(), facts.shipped_window
    if window is None or pre is None or window <= pre:
        return Window(int(window or pre))
    params = facts.pristine_slots.get(facts.main_slot) or next(iter(facts.pristine_slots.values()))
    factor = params.get("factor")
    scheme = str(params.get("rope_type", "scaled")) + (f" x{float(factor):g}" if factor else "")
    return Window(int(window), int(pre), scheme)


def original_length(model) -> int:
    """The window the unpatched model serves as shipped (`model_window`: a shipped scheme's reach, not the length it
    scales from)."""
    return model_window(model.config).length


def apply_spec(model, spec) -> Any:
    """Patch *model* in place with ``rope_extend.patch_model`` (a callable spec is called instead)."""
    if spec is None:
        return None
    if callable(spec) and not isinstance(spec, dict):
        return spec(model)
    from ..patch import patch_model

    return patch_model(model, spec)
