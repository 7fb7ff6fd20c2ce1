"""Write a patched checkpoint: the config-only fast path, the full path, atomic output, verification.

RoPE scaling changes no weight, so the default (`mode="auto"` without a dtype change) writes a new config.json
(portable across transformers 4.x/5.x), updates the length caps in generation_config.json / tokenizer_config.json,
and hard-links every other file (copying only where linking is impossible). Nothing is loaded but JSON and the
safetensors headers, so time and memory do not grow with the model. `mode="full"` loads, patches and
`save_pretrained`s the model with the same output layout.

Output is built in a temporary folder beside OUT and renamed into place at the end: after an error, Ctrl-C or
SIGKILL, OUT is absent (or its previous content, with --overwrite) and SOURCE is never written (files are linked,
never written through: every file we change is written fresh).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import compat
from .engines.parity import card_section
from .errors import CheckpointError, SpecError, VerificationError
from .hub import build_model_card, resolve_source
from .patch import PatchPlan, check_rope_model, expected_rope, plan_patch, verify_stock_config
from .serving import serving_hints
from .spec import RopeSpec, load_spec

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SKIP_NAMES = {".git", ".gitattributes", ".cache", ".huggingface"}
WRITTEN = {"config.json", "generation_config.json", "tokenizer_config.json", "rope_extend.yaml", "README.md"}
TMP_TAG = ".rope-extend-tmp-"
DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass
class PatchResult:
    out: Path
    source: Path
    mode: str
    plan: PatchPlan
    linked: int = 0
    copied: int = 0
    written: list[str] = field(default_factory=list)
    verified: bool = False
    seconds: float = 0.0
    serving: str = ""
    warnings: list[str] = field(default_factory=list)


# --- safety checks -------------------------------------------------------------------------------------------------
def check_output_path(source: Path, out: Path, overwrite: bool) -> Path:
    out = Path(out).expanduser().absolute()
    resolved_out, resolved_src = out.resolve(), source.resolve()
    if resolved_out == resolved_src:
        raise CheckpointError(f"OUT {str(out)!r} is SOURCE itself; choose a new folder with -o")
    if resolved_src in resolved_out.parents:
        raise CheckpointError(f"OUT {str(out)!r} is inside SOURCE {str(source)!r}; write it elsewhere")
    if resolved_out in resolved_src.parents:
        raise CheckpointError(f"SOURCE {str(source)!r} is inside OUT {str(out)!r}; OUT would replace it")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"OUT {str(out)!r} is an existing file; choose a folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"OUT {str(out)!r} exists and is not empty; pass --overwrite to replace it")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the parent of OUT {str(out)!r}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write to {str(parent)!r} (permission denied); choose another -o")
    return out


def check_safetensors(path: Path) -> None:
    """Header-only integrity check: the file must be exactly as long as its header says."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(size, 100_000_000):
                raise ValueError(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(handle.read(header_len))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"weights file {path.name!r} is corrupt ({exc}); re-download the checkpoint") from None
    expected = 8 + header_len + end
    if size != expected:
        raise CheckpointError(
            f"weights file {path.name!r} is truncated or padded: {size} bytes, its header describes {expected}; "
            "re-download the checkpoint"
        )


def scan_source(source: Path, allow_pickle: bool) -> list[Path]:
    """Files to carry over (relative paths), after checking weights are present, complete and safe."""
    files = sorted(
        p.relative_to(source)
        for p in source.rglob("*")
        if (p.is_file() or p.is_symlink()) and not (set(p.relative_to(source).parts) & SKIP_NAMES)
    )
    safetensors = [f for f in files if f.suffix == ".safetensors"]
    pickles = [f for f in files if f.suffix in PICKLE_SUFFIXES]
    if not safetensors and not pickles:
        raise CheckpointError(f"SOURCE {str(source)!r} holds no weights (*.safetensors); is it a model checkpoint?")
    if pickles and not safetensors and not allow_pickle:
        raise CheckpointError(
            f"SOURCE has only pickle weights ({pickles[0].name}); pickles can run code when loaded. Convert to "
            "safetensors, or pass --allow-pickle if you trust the source"
        )
    for name in ("model.safetensors.index.json",):
        index = source / name
        if index.exists():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"{name} is corrupt ({exc}); re-download the checkpoint") from None
            missing = sorted(s for s in shards if not (source / s).exists())
            if missing:
                raise CheckpointError(f"shard {missing[0]!r} listed in {name} is missing from SOURCE; re-download it")
    for shard in safetensors:
        if not (source / shard).exists():
            raise CheckpointError(f"weights file {shard.name!r} is a broken link in SOURCE; re-download it")
        check_safetensors(source / shard)
    if safetensors and not allow_pickle:  # never propagate pickles next to safetensors by default
        files = [f for f in files if f.suffix not in PICKLE_SUFFIXES and not f.name.endswith(".bin.index.json")]
    return files


def _text_part(raw: dict) -> dict:
    """The text model's part of a config.json (multimodal configs nest it under text_config)."""
    return raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON ({exc}); fix or re-download it") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r} must hold a JSON object")
    return data


def load_config(source: Path, trust_remote_code: bool = False):
    """A stock transformers config from a checkpoint folder; unreadable configs become one-line CheckpointErrors."""
    from transformers import AutoConfig

    read_json(source / "config.json", "config.json")
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"transformers cannot read {str(source / 'config.json')!r}: {reason}") from None


# --- writing -------------------------------------------------------------------------------------------------------
def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link (True) or copy (False). A link shares the inode: we never open it for writing."""
    real = Path(os.path.realpath(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(real, dst)
        return True
    except OSError:
        shutil.copy2(real, dst)
        return False


def _write_json(path: Path, data: dict) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()  # a hard link to SOURCE: replace, never write through
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _update_caps(out: Path, old_max: int, target: int) -> list[str]:
    """Raise length caps users forget: tokenizer model_max_length, generation max_length (when it was the window)."""
    changed = []
    tok = out / "tokenizer_config.json"
    if tok.exists():
        data = read_json(tok, "tokenizer_config.json")
        cap = data.get("model_max_length")
        if isinstance(cap, (int, float)) and cap < 1e12 and cap < target:
            data["model_max_length"] = target
            _write_json(tok, data)
            changed.append("tokenizer_config.json")
    gen = out / "generation_config.json"
    if gen.exists():
        data = read_json(gen, "generation_config.json")
        if data.get("max_length") == old_max:
            data["max_length"] = target
            _write_json(gen, data)
            changed.append("generation_config.json")
    return changed


def config_diff(before: dict, after: dict) -> list[tuple[str, Any, Any]]:
    keys = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
            "original_max_position_embeddings", "partial_rotary_factor", compat.MARKER_KEY)
    return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]


def _clean_stale_tmp(out: Path) -> None:
    """Remove temporary folders left beside OUT by runs that were killed (their pid is gone)."""
    for stale in out.parent.glob(f".{out.name}{TMP_TAG}*"):
        try:
            pid = int(stale.name.rsplit(TMP_TAG, 1)[1].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


@contextlib.contextmanager
def _atomic_dir(out: Path, overwrite: bool):
    """Yield a temp folder beside OUT; on success it replaces OUT, on any failure it disappears."""
    _clean_stale_tmp(out)
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(f"cannot write beside OUT in {str(out.parent)!r} ({exc.strerror}); choose another -o") from None
    previous = signal.getsignal(signal.SIGTERM)

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    in_main = _in_main_thread()
    if in_main:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        yield tmp
        if out.exists():
            if not overwrite:
                raise CheckpointError(f"OUT {str(out)!r} appeared while writing; pass --overwrite")
            old = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise CheckpointError(f"no space left on the device while writing {str(out)!r}; free space or use another -o") from None
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _config_only(source: Path, tmp: Path, files: list[Path], plan: PatchPlan, raw: dict, result: PatchResult) -> dict:
    new = compat.portable_config_dict(raw, plan.slots, plan.max_position_embeddings, plan.marker)
    for rel in files:
        if rel.as_posix() in WRITTEN - {"generation_config.json", "tokenizer_config.json"}:
            continue
        if _link_or_copy(source / rel, tmp / rel):
            result.linked += 1
        else:
            result.copied += 1
    _write_json(tmp / "config.json", new)
    return new


def _full(source, tmp, files, plan, raw, result, dtype, allow_pickle, trust_remote_code) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from .patch import patch_model

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "low_cpu_mem_usage": True}
    kwargs["use_safetensors"] = None if allow_pickle else True
    torch_dtype = DTYPES.get((dtype or "auto").lower())
    if torch_dtype is None:
        raise CheckpointError(f"--dtype {dtype!r} is not one of {', '.join(sorted(set(DTYPES)))}")
    kwargs.update(compat.dtype_kwargs(torch_dtype if torch_dtype == "auto" else getattr(torch, torch_dtype)))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI shows its own status; keep stderr for errors
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"cannot load the model from {str(source)!r}: {reason}") from None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, plan.spec)
    model.save_pretrained(tmp, safe_serialization=True)
    saved = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()}
    for rel in files:
        name = rel.as_posix()
        weight = rel.suffix in (".safetensors",) + PICKLE_SUFFIXES or name.endswith(".index.json")
        if name in saved or weight or name in WRITTEN - {"tokenizer_config.json"}:
            continue
        if _link_or_copy(source / rel, tmp / rel):
            result.linked += 1
        else:
            result.copied += 1
    saved_config = read_json(tmp / "config.json", "config.json")
    new = compat.portable_config_dict(saved_config, plan.slots, plan.max_position_embeddings, plan.marker)
    _write_json(tmp / "config.json", new)
    return new


def verify_output(folder: Path, plan: PatchPlan, mode: str) -> None:
    """Load `folder` with stock transformers and check the RoPE it builds against rope-extend's own numbers."""
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(folder)
    verify_stock_config(config, plan)
    if mode != "full":
        return
    from .patch import find_rotary_modules

    model = AutoModelForCausalLM.from_pretrained(folder, low_cpu_mem_usage=True)
    for name, module, _ in find_rotary_modules(model):
        for slot, prefix in compat.module_slots(name, module, plan.slots):
            if slot not in plan.targets:
                continue
            want, attention = expected_rope(plan, slot)
            got = getattr(module, f"{prefix}inv_freq").float()
            if not torch.allclose(got, want.float(), rtol=1e-6, atol=0):
                raise VerificationError(f"{name}: the saved model rebuilds different inv_freq for {slot or 'all layers'}")
            if abs(float(getattr(module, f"{prefix}attention_scaling", 1.0)) - attention) > 1e-6 * attention:
                raise VerificationError(f"{name}: the saved model rebuilds a different attention factor")


def patch_checkpoint(
    source: str | os.PathLike,
    spec: RopeSpec | dict | str | os.PathLike,
    out: str | os.PathLike,
    *,
    mode: str = "auto",
    dtype: str | None = None,
    overwrite: bool = False,
    revision: str | None = None,
    verify: bool = True,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    eval_summary: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> PatchResult:
    """Write SOURCE with rescaled RoPE to OUT (see the module docstring). Returns a `PatchResult`."""
    started = time.perf_counter()
    step = on_step or (lambda message: None)
    if mode not in ("auto", "config-only", "full"):
        raise CheckpointError(f"--mode {mode!r} is not one of auto, config-only, full")
    if mode == "config-only" and dtype not in (None, "auto"):
        raise CheckpointError("--dtype changes the weights; it needs --mode full (or auto)")
    mode = ("full" if dtype not in (None, "auto") else "config-only") if mode == "auto" else mode
    spec = spec if isinstance(spec, RopeSpec) else load_spec(spec)

    step(f"resolving {source}")
    src = resolve_source(source, revision=revision)
    out_path = check_output_path(src, Path(out), overwrite)
    raw = read_json(src / "config.json", "config.json")
    config = load_config(src, trust_remote_code)
    check_rope_model(config)
    if "max_position_embeddings" not in _text_part(raw) and spec.original_max_position_embeddings is None:
        raise SpecError(
            "config.json has no max_position_embeddings, so the original context length is unknown (transformers "
            f"would assume its default {getattr(config, 'max_position_embeddings', '?')}); set "
            "original_max_position_embeddings in the spec (--set original_max_position_embeddings=N)",
            field="original_max_position_embeddings",
        )
    plan = plan_patch(config, spec)
    files = scan_source(src, allow_pickle)

    result = PatchResult(out=out_path, source=src, mode=mode, plan=plan, warnings=list(plan.warnings))
    serving, serving_warnings = serving_hints(plan, str(out_path))
    result.serving = serving
    result.warnings += [w for w in serving_warnings if w not in result.warnings]
    with _atomic_dir(out_path, overwrite) as tmp:
        step(f"writing {mode} checkpoint")
        if mode == "config-only":
            new = _config_only(src, tmp, files, plan, raw, result)
        else:
            new = _full(src, tmp, files, plan, raw, result, dtype, allow_pickle, trust_remote_code)
        result.written = ["config.json"] + _update_caps(tmp, plan.old_max_position_embeddings, plan.spec.target_length)
        spec_yaml = plan.spec.to_yaml()
        (tmp / "rope_extend.yaml").write_text(spec_yaml)
        card = build_model_card(
            base_model=str(source),
            spec_yaml=spec_yaml,
            method=plan.spec.method,
            config_diff=config_diff(raw, new),
            serving=serving,
            eval_summary=eval_summary,
            engines=card_section(tmp),  # issue 10: the parity report of what was just written
        )
        if (tmp / "README.md").exists():
            (tmp / "README.md").unlink()
        (tmp / "README.md").write_text(card)
        result.written += ["rope_extend.yaml", "README.md"]
        if verify:
            step("verifying with stock transformers")
            verify_output(tmp, plan, mode)
            result.verified = True
    result.seconds = time.perf_counter() - started
    return result
