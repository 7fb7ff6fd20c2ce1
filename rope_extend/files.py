"""The boundary: every file rope-extend reads from a checkpoint is untrusted and validated here, in one place.

config.json, safetensors headers, model.safetensors.index.json, tokenizer_config.json and generation_config.json
are checked for size, nesting, shape and the types and ranges of the fields rope-extend uses, before any other code
touches them. Every failure is a `CheckpointError` (a ValueError) naming the file, the field, the bad value and the
fix; nothing else (KeyError, TypeError, RecursionError, ZeroDivisionError...) escapes from a bad file.

Files SOURCE names, whether found in the folder or listed in model.safetensors.index.json, obey one rule
(`source_file`): the name stays inside SOURCE, and a symbolic link is followed only in the Hugging Face Hub cache
layout (`models--org--name/snapshots/<rev>/file -> ../../blobs/<hash>` of the same repo); any other link is refused,
so an outside file is never linked into OUT (what a push sends from OUT is rope_extend.record's rule).
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from .errors import CheckpointError

MAX_JSON_BYTES = 64 * 1024 * 1024  # the largest index.json of a 400B-parameter model is ~2 MB
MAX_JSON_DEPTH = 32  # configs nest 3-4 levels (text_config > rope_parameters > layer type)
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
MAX_TOKENS = 2**31 - 1  # llama.cpp positions are int32; no model serves more
INDEX_NAME = "model.safetensors.index.json"


# --- JSON ------------------------------------------------------------------------------------------------------------
def read_json(path: Path, what: str | None = None) -> dict:
    """A JSON object from a checkpoint file, bounded in size and nesting."""
    what = what or path.name
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise CheckpointError(
                f"{what} {str(path)!r} is {size} bytes, above the {MAX_JSON_BYTES} byte limit for a JSON file of "
                "a checkpoint; is it the right file?"
            )
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except RecursionError:
        raise CheckpointError(f"{what} {str(path)!r} is nested too deeply to be a checkpoint file; re-download it") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON ({exc}); fix or re-download it") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r} must hold a JSON object, got a JSON {_kind(data)}")
    depth = _depth(data)
    if depth > MAX_JSON_DEPTH:
        raise CheckpointError(
            f"{what} {str(path)!r} nests {depth} levels deep (limit {MAX_JSON_DEPTH}); it is not a checkpoint file"
        )
    return data


def _depth(value: Any) -> int:
    """Nesting depth, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_JSON_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


# --- config.json -----------------------------------------------------------------------------------------------------
def _bad(path: Path, field: str, value: Any, why: str, fix: str) -> CheckpointError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return CheckpointError(f"{path.name} field {field!r} is {shown}: {why}; {fix}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(path, field, value, low=1, high=MAX_TOKENS, fix="fix config.json or re-download it"):
    if not (isinstance(value, int) and not isinstance(value, bool)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise _bad(path, field, value, f"it must be a whole number, not a JSON {_kind(value)}", fix)
    if not low <= value <= high:
        raise _bad(path, field, value, f"it must lie in [{low}, {high}]", fix)


def _check_theta(path, field, value):
    if not _is_number(value) or not math.isfinite(value) or value <= 1:
        raise _bad(
            path, field, value,
            "the RoPE base must be a finite number > 1 (θ_i = base^(-2i/d); a base <= 1 makes no frequency ladder)",
            "fix config.json (LLaMA uses 10000 or 500000)",
        )


def _check_slot(path: Path, where: str, params: Any) -> None:
    if not isinstance(params, dict):
        raise _bad(path, where, params, f"it must be an object of RoPE parameters, not a {_kind(params)}",
                   "fix config.json or re-download it")
    for key in ("rope_type", "type"):
        if key in params and not isinstance(params[key], str):
            raise _bad(path, f"{where}.{key}", params[key], "it must be a string such as 'default' or 'yarn'",
                       "fix config.json")
    if params.get("rope_theta") is not None:
        _check_theta(path, f"{where}.rope_theta", params["rope_theta"])
    for key in ("factor", "attention_factor", "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor",
                "mscale", "mscale_all_dim", "partial_rotary_factor"):
        value = params.get(key)
        if value is not None and (not _is_number(value) or not math.isfinite(value) or value <= 0):
            raise _bad(path, f"{where}.{key}", value, "it must be a finite number > 0", "fix config.json")
    if params.get("original_max_position_embeddings") is not None:
        _check_int(path, f"{where}.original_max_position_embeddings", params["original_max_position_embeddings"])
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if value is not None and (
            not isinstance(value, list) or not all(_is_number(v) and math.isfinite(v) and v > 0 for v in value)
        ):
            raise _bad(path, f"{where}.{key}", value, "it must be a list of finite numbers > 0", "fix config.json")


def check_config(raw: dict, path: Path) -> None:
    """Types and ranges of every config.json field rope-extend (and the RoPE code of transformers) reads."""
    part, prefix = raw, ""
    if "text_config" in raw and raw["text_config"] is not None:
        if not isinstance(raw["text_config"], dict):
            raise _bad(path, "text_config", raw["text_config"], "it must be an object", "fix config.json")
        part, prefix = raw["text_config"], "text_config."
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise _bad(path, "model_type", model_type, "it must be a string such as 'llama'", "fix config.json")
    if part.get("max_position_embeddings") is not None:
        _check_int(path, prefix + "max_position_embeddings", part["max_position_embeddings"],
                   fix="set it to the context length the model was trained with")
    for key in ("num_attention_heads", "num_key_value_heads", "hidden_size", "num_hidden_layers", "head_dim"):
        if part.get(key) is not None:
            _check_int(path, prefix + key, part[key], high=2**20,
                       fix="a model needs at least one head, layer and dimension; fix config.json")
    for key in ("partial_rotary_factor", "rotary_pct"):
        value = part.get(key)
        if value is not None and (not _is_number(value) or not 0 < value <= 1):
            raise _bad(path, prefix + key, value, "the rotary fraction of each head must lie in (0, 1]",
                       "fix config.json or remove the key")
    if part.get("rope_theta") is not None:
        _check_theta(path, prefix + "rope_theta", part["rope_theta"])
    if part.get("rope_scaling") is not None:
        _check_slot(path, prefix + "rope_scaling", part["rope_scaling"])
    rope_parameters = part.get("rope_parameters")
    if rope_parameters is not None:
        if not isinstance(rope_parameters, dict):
            raise _bad(path, prefix + "rope_parameters", rope_parameters, "it must be an object", "fix config.json")
        nested = rope_parameters and all(isinstance(v, dict) for v in rope_parameters.values())
        for key, params in (rope_parameters.items() if nested else [(None, rope_parameters)]):
            _check_slot(path, prefix + "rope_parameters" + (f".{key}" if key else ""), params)
    layer_types = part.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types)):
        raise _bad(path, prefix + "layer_types", layer_types, "it must be a list of layer type names", "fix config.json")
    _check_marker(path, prefix, part.get("rope_extend"))


def _check_marker(path: Path, prefix: str, marker: Any) -> None:
    """rope-extend's provenance marker (it restores the original RoPE from it, so it must be whole)."""
    if marker is None:
        return
    fix = "restore config.json from the checkpoint rope-extend wrote, or remove the rope_extend key"
    if not isinstance(marker, dict):
        raise _bad(path, prefix + "rope_extend", marker, "rope-extend's provenance marker must be an object", fix)
    if marker.get("spec") is not None and not isinstance(marker["spec"], dict):
        raise _bad(path, prefix + "rope_extend.spec", marker["spec"], "it must be an object (the resolved spec)", fix)
    original = marker.get("original")
    if original is None:
        return
    slots = original.get("rope_parameters") if isinstance(original, dict) else None
    if not isinstance(slots, dict) or not slots or not all(isinstance(v, dict) for v in slots.values()):
        raise _bad(path, prefix + "rope_extend.original", original,
                   "rope-extend's record of the original RoPE is damaged", fix)
    _check_int(path, prefix + "rope_extend.original.max_position_embeddings", original.get("max_position_embeddings"),
               fix=fix)
    for key, params in slots.items():
        _check_slot(path, f"{prefix}rope_extend.original.rope_parameters.{key}", params)
        if params.get("rope_theta") is None:
            raise _bad(path, f"{prefix}rope_extend.original.rope_parameters.{key}.rope_theta", None,
                       "the original base is missing", fix)


def read_config(source: Path) -> dict:
    """config.json of a checkpoint folder, read and checked."""
    path = source / "config.json"
    raw = read_json(path, "config.json")
    check_config(raw, path)
    return raw


# --- weights ---------------------------------------------------------------------------------------------------------
def load_config(source: Path, trust_remote_code: bool = False):
    """A stock transformers config from a checkpoint folder; config.json passes the boundary checks first, and
    whatever transformers' config classes raise becomes one CheckpointError naming the file."""
    import warnings

    from transformers import AutoConfig

    read_config(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as exc:  # 5.x strict config classes raise their own exception types
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise CheckpointError(f"transformers cannot read {str(source / 'config.json')!r}: {reason}") from None


def _corrupt(name: str, why: str) -> CheckpointError:
    return CheckpointError(f"weights file {name!r} is corrupt ({why}); re-download the checkpoint")


def read_safetensors_header(path: Path) -> tuple[dict, int, int]:
    """(header, header length, file size) of a safetensors file, reading only its header (never the tensors)."""
    name = path.name
    corrupt = functools.partial(_corrupt, name)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise corrupt("shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(size - 8, MAX_HEADER_BYTES):
                raise corrupt(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(handle.read(header_len))
    except RecursionError:
        raise corrupt("its header is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt(f"its header is not JSON: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read weights file {name!r}: {exc.strerror or exc}") from None
    if not isinstance(header, dict):
        raise corrupt(f"its header is a JSON {_kind(header)}, not an object")
    return header, header_len, size


def check_safetensors(path: Path) -> None:
    """Header-only integrity check: a well-formed header whose tensors end exactly at the end of the file."""
    name = path.name
    corrupt = functools.partial(_corrupt, name)
    header, header_len, size = read_safetensors_header(path)
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict):
                raise corrupt("__metadata__ is not an object")
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise corrupt(f"tensor {key!r} has no valid data_offsets [begin, end]")
        if not isinstance(entry.get("dtype"), str) or not isinstance(entry.get("shape"), list):
            raise corrupt(f"tensor {key!r} lacks a dtype string or a shape list")
        end = max(end, offsets[1])
    expected = 8 + header_len + end
    if size != expected:
        raise CheckpointError(
            f"weights file {name!r} is truncated or padded: {size} bytes, its header describes {expected}; "
            "re-download the checkpoint"
        )


def index_shards(source: Path) -> list[Path]:
    """The shard files model.safetensors.index.json lists, each held to the rule of `source_file` (inside SOURCE,
    or the Hub cache's snapshot -> blobs link of the same repo)."""
    path = source / INDEX_NAME
    if not path.exists() and not path.is_symlink():
        return []
    source_file(source, Path(INDEX_NAME))
    data = read_json(path, INDEX_NAME)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _bad(path, "weight_map", weight_map, "it must be an object mapping tensor names to shard files",
                   "re-download the checkpoint")
    shards: dict[str, str] = {}  # shard -> the first tensor naming it (one check per shard, not per tensor)
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise _bad(path, f"weight_map[{tensor!r}]", shard, "it must name a .safetensors shard file",
                       "re-download the checkpoint")
        shards.setdefault(shard, tensor)
    unique = []
    for shard, tensor in shards.items():
        rel = Path(shard)
        if not names_inside(rel):
            raise _bad(path, f"weight_map[{tensor!r}]", shard,
                       "shards must be files inside SOURCE; an index pointing elsewhere is refused",
                       "re-download the checkpoint")
        if not (source / rel).exists() and not (source / rel).is_symlink():
            raise CheckpointError(
                f"shard {rel.as_posix()!r} listed in {INDEX_NAME} is missing from SOURCE; re-download it"
            )
        source_file(source, rel, what=f"shard {rel.as_posix()!r} listed in {INDEX_NAME}")
        unique.append(rel)
    return sorted(set(unique))


# --- links -----------------------------------------------------------------------------------------------------------
def hub_repo_root(folder: Path) -> Path | None:
    """`.../models--org--name` when `folder` is a snapshot of the Hub cache layout, else None."""
    folder = Path(os.path.abspath(folder))
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return None


def names_inside(rel: Path) -> bool:
    """A relative name that stays inside its folder by its spelling alone (no root, no `..`, not empty)."""
    return bool(rel.parts) and not rel.is_absolute() and ".." not in rel.parts and rel.parts != (".",)


def source_file(source: Path, rel: Path, what: str | None = None) -> Path:
    """The one rule for every file SOURCE names (listed in the folder or in model.safetensors.index.json): its name
    stays inside SOURCE, and if any part of its path is a symbolic link, the link resolves to a regular file in
    the `blobs/` of the same Hub cache repo (`models--org--name/snapshots/<rev>/file -> ../../blobs/<hash>`).
    Anything else (absolute names, `..`, links out of SOURCE, into another repo's blobs, broken or looping links)
    is a CheckpointError. Returns the real file the name stands for."""
    what = what or f"SOURCE file {rel.as_posix()!r}"
    if not names_inside(rel):
        raise CheckpointError(f"{what} is not a name inside SOURCE; an entry pointing elsewhere is refused")
    path = source / rel
    chain = [source / Path(*rel.parts[: i + 1]) for i in range(len(rel.parts))]
    if not any(p.is_symlink() for p in chain):
        return path
    target = Path(os.path.realpath(path))
    repo = hub_repo_root(source)
    blobs = Path(os.path.realpath(repo)) / "blobs" if repo is not None else None
    if blobs is not None and target.parent == blobs:  # huggingface_hub's blobs/ is flat
        if not target.is_file():
            raise CheckpointError(
                f"{what} is a broken (or looping) link into the Hub cache's blobs ({str(target)!r}); re-download it"
            )
        return target
    raise CheckpointError(
        f"{what} is a symbolic link to {str(target)!r}; rope-extend follows links only in "
        "the Hugging Face Hub cache layout (snapshot -> blobs of the same repo), so an outside file is never put "
        "into OUT. Copy the file into SOURCE instead of linking it"
    )
