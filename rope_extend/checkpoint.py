"""Write a patched checkpoint: the config-only fast path, the full path, atomic output, verification.

RoPE scaling changes no weight, so the default (`mode="auto"` without a dtype change) writes a new config.json
(portable across transformers 4.x/5.x), updates the length caps in generation_config.json / tokenizer_config.json,
shares the weights with SOURCE and copies every other file (`rope_extend.sharing` decides how). Nothing is loaded
but JSON and the safetensors headers, so time and memory do not grow with the model. `mode="full"` loads, patches and
`save_pretrained`s the model in SOURCE's shard layout: shards no larger than SOURCE's largest, and never over
`MAX_SHARD_BYTES` (5 GB, the size the Hub's advice and transformers 4.x use: transformers 5's default of 50 GB wrote
a 16 GB model as one file, which a resumed push sends again whole).

Output is built in a temporary folder beside OUT and renamed into place at the end: after an error, Ctrl-C or
SIGKILL, OUT is absent (or its previous content, with --overwrite) and SOURCE is never written (every file we change
is written fresh, and no write to OUT reaches SOURCE but an in-place edit of hard-linked weights: `sharing`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import compat, files, outputs, record, sharing
from .card import build_model_card
from .engines.parity import card_parity
from .engines.serving import ServeHint, ServingHints
from .errors import CheckpointError, SpecError, UnverifiedCheckpointError, VerificationError
from .files import check_safetensors, read_json, read_safetensors_header
from .hub import resolve_source
from .patch import verify_or_explain
from .plan import PatchPlan, check_rope_model
from .source import Source, plan_source, read_source
from .spec import RopeSpec, load_spec
from .tokenizer import verify_tokenizer
from .verify import model_dtype, probe_outputs, verify_plan
from .write_options import DTYPES, WriteOptions

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SKIP_NAMES = {".git", ".gitattributes", ".cache", ".huggingface"}
WRITTEN = {"config.json", "generation_config.json", "tokenizer_config.json", "rope_extend.yaml", "README.md"}
TMP_TAG = ".rope-extend-tmp-"
MAX_SHARD_BYTES = 5 * 10**9  # the largest shard a full write makes (transformers 4.x's default, the Hub's advice)


@dataclass
class PatchResult:
    out: Path
    source: Path
    mode: str
    plan: PatchPlan
    placed: dict[str, str] = field(default_factory=dict)  # SOURCE's files in OUT -> how (`sharing.place`)
    written: list[str] = field(default_factory=list)
    verified: bool = False
    seconds: float = 0.0
    serving: str = ""  # every engine's commands (markdown, as in the model card)
    serve: ServeHint | None = None  # the one way to serve OUT to try first (`str()`: one line that pastes whole)
    warnings: list[str] = field(default_factory=list)
    patched_outputs: Any = field(default=None, repr=False)  # full path: the patched model's probe outputs
    patched_dtype: Any = field(default=None, repr=False)  # ... and the dtype they were computed in

    @property
    def linked(self) -> int:
        """SOURCE's files whose bytes OUT shares (reflinked or hard-linked)."""
        return sum(how in sharing.SHARED for how in self.placed.values())

    @property
    def copied(self) -> int:
        return sum(how == sharing.COPIED for how in self.placed.values())


# --- safety checks -------------------------------------------------------------------------------------------------
def check_output_path(source: Path, out: Path, overwrite: bool) -> Path:
    """Validate OUT without creating anything (parents are created only when writing starts)."""
    given = str(out)
    out = Path(out).expanduser().absolute()
    if out.is_symlink():  # dangling or not: OUT is renamed into place, never written through a link
        target = os.readlink(out)
        state = "" if out.exists() else ", which points nowhere (a dangling link)"
        raise CheckpointError(
            f"OUT {given!r} is a symbolic link (to {target!r}{state}); rope-extend writes OUT as a folder of its "
            "own: give the real folder path with -o, or remove the link"
        )
    resolved_out, resolved_src = out.resolve(), Path(source).resolve()
    home, cwd = Path.home().resolve(), Path.cwd().resolve()
    if resolved_out in (Path(resolved_out.anchor), home, cwd):
        what = {Path(resolved_out.anchor): "the filesystem root", home: "your home folder", cwd: "the current folder"}
        raise CheckpointError(
            f"OUT {given!r} is {what[resolved_out]}; rope-extend writes a checkpoint into a folder of its own, "
            "e.g. -o out/model-yarn"
        )
    if resolved_out == resolved_src:
        raise CheckpointError(f"OUT {given!r} is SOURCE itself; choose a new folder with -o")
    if resolved_src in resolved_out.parents:
        raise CheckpointError(f"OUT {given!r} is inside SOURCE {str(source)!r}; write it elsewhere")
    if resolved_out in resolved_src.parents:
        raise CheckpointError(f"SOURCE {str(source)!r} is inside OUT {given!r}; OUT would replace it")
    # --overwrite replaces only a checkpoint (outputs.py); anything else is refused even without it, so the
    # message never suggests an --overwrite that would be refused next
    outputs.check_replaceable(out, "checkpoint", given)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"OUT {given!r} exists and is not empty; pass --overwrite to replace it")
    existing = next((p for p in [out, *out.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise CheckpointError(f"cannot create OUT {given!r}: {str(existing)!r} is not a folder; choose another -o")
    if not os.access(existing, os.W_OK | os.X_OK):
        if read_only_filesystem(existing):
            raise CheckpointError(f"cannot write to {str(existing)!r}: it is on a read-only filesystem; choose an -o "
                                  "on a writable one")
        raise CheckpointError(f"cannot write to {str(existing)!r} (permission denied); choose another -o")
    return out


def read_only_filesystem(path: Path) -> bool:
    """Whether `path` lies on a filesystem mounted read-only (no permission would let anyone write there)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): say permission denied as before
        return False


def scan_source(source: Path, allow_pickle: bool) -> list[Path]:
    """Files to carry over (relative paths), after checking weights are present, complete, safe and inside SOURCE."""
    files_ = sorted(
        p.relative_to(source)
        for p in source.rglob("*")
        if (p.is_file() or p.is_symlink())
        and not (set(p.relative_to(source).parts) & SKIP_NAMES)
        and not any(part.startswith(".") for part in p.relative_to(source).parts)  # .complete, .cache, .git...
    )
    for rel in files_:
        files.source_file(source, rel)
    safetensors = [f for f in files_ if f.suffix == ".safetensors"]
    pickles = [f for f in files_ if f.suffix in PICKLE_SUFFIXES]
    if not safetensors and not pickles:
        raise CheckpointError(f"SOURCE {str(source)!r} holds no weights (*.safetensors); is it a model checkpoint?")
    if pickles and not safetensors and not allow_pickle:
        raise CheckpointError(
            f"SOURCE has only pickle weights ({pickles[0].name}); pickles can run code when loaded. Convert to "
            "safetensors, or pass --allow-pickle if you trust the source"
        )
    files.index_shards(source)
    for shard in safetensors:
        if not (source / shard).exists():
            raise CheckpointError(f"weights file {shard.name!r} is a broken link in SOURCE; re-download it")
        check_safetensors(source / shard)
    if safetensors and not allow_pickle:  # never propagate pickles next to safetensors by default
        files_ = [f for f in files_ if f.suffix not in PICKLE_SUFFIXES and not f.name.endswith(".bin.index.json")]
    return files_




# --- writing -------------------------------------------------------------------------------------------------------
def _write_json(path: Path, data: dict) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()  # replace, never write through
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _update_caps(out: Path, old_max: int, target: int) -> list[str]:
    """Raise length caps users forget: tokenizer model_max_length, generation max_length (when it was the window)."""
    changed = []
    tok = out / "tokenizer_config.json"
    if tok.exists():
        data = read_json(tok, "tokenizer_config.json")
        cap = data.get("model_max_length")
        if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap < 1e12 and cap < target:
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


def _make_parents(out: Path, created: list[Path]) -> None:
    """Create OUT's missing parents, each added to `created` (deepest first) as soon as it exists, so that a failed
    or interrupted run removes them."""
    missing = [p for p in out.parents if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir()
        created.insert(0, folder)


@contextlib.contextmanager
def _atomic_dir(out: Path, overwrite: bool):
    """Yield a temp folder beside OUT; on success it replaces OUT, on any failure it disappears (and so do the
    parent folders this run created). OS errors name OUT, never the temporary folder. SIGTERM is turned into
    KeyboardInterrupt before anything is created, so no moment exists when a folder is there and its cleanup is not."""
    created: list[Path] = []
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    done = False
    previous = signal.getsignal(signal.SIGTERM)

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    in_main = _in_main_thread()
    if in_main and previous in (signal.SIG_DFL, signal.SIG_IGN, None):  # keep a caller's handler (the CLI's)
        signal.signal(signal.SIGTERM, _terminate)
    try:  # armed before any folder exists: a signal from their creation on lands in the `finally` that removes them
        try:
            _make_parents(out, created)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create the parent folders of OUT {str(out)!r}: {exc.strerror}; choose another -o") from None
        _clean_stale_tmp(out)
        try:
            tmp.mkdir()
        except OSError as exc:
            raise CheckpointError(
                f"cannot write beside OUT in {str(out.parent)!r} ({exc.strerror}); choose another -o") from None
        _tmp_created(tmp)
        yield tmp
        if out.exists():
            if not overwrite:
                raise CheckpointError(f"OUT {str(out)!r} appeared while writing; pass --overwrite")
            outputs.check_replaceable(out, "checkpoint")  # again: files may have been added during a long run
            old = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
        done = True
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise CheckpointError(f"no space left on the device while writing {str(out)!r}; free space or use another -o") from None
        if exc.errno == errno.EROFS:
            raise CheckpointError(f"writing OUT {str(out)!r} failed: it is on a read-only filesystem; choose an -o on "
                                  "a writable one") from None
        raise CheckpointError(
            f"writing OUT {str(out)!r} failed: {exc.strerror or type(exc).__name__}; nothing was left at OUT"
        ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            _remove_empty(created)
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _tmp_created(tmp: Path) -> None:
    """Called right after the temporary folder is created (a test hook: tests/test_reliability.py sends SIGTERM from
    here to pin down the moment the folder appears)."""


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            break


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# config.json keys that say where a config was loaded from, not what the model is: transformers' `_name_or_path` (a
# local path or a Hub id) and the `_model_name_or_path` its GGUF loader sets from the file's `general.name` (the demo
# model's). SOURCE's values would name SOURCE in OUT's config.json; the card and the record say what OUT is made from.
SOURCE_NAME_KEYS = ("_name_or_path", "_model_name_or_path")


def written_config(config_dict: dict, plan: PatchPlan) -> dict:
    """OUT's config.json: `config_dict` (SOURCE's, or the one `save_pretrained` wrote) in the portable layout of
    `plan` (`compat.portable_checkpoint_config`), without SOURCE's names (`SOURCE_NAME_KEYS`)."""
    new = compat.portable_checkpoint_config(config_dict, plan.slots, plan.max_position_embeddings, plan.marker)
    for part in {id(new): new, id(compat.text_part(new)): compat.text_part(new)}.values():
        for key in SOURCE_NAME_KEYS:
            part.pop(key, None)
    return new


def _config_only(source: Path, tmp: Path, files: list[Path], plan: PatchPlan, raw: dict, result: PatchResult) -> dict:
    new = written_config(raw, plan)
    for rel in files:
        if rel.as_posix() in WRITTEN - {"generation_config.json", "tokenizer_config.json"}:
            continue
        result.placed[rel.as_posix()] = sharing.place(source / rel, tmp / rel)
    _write_json(tmp / "config.json", new)
    return new


def _full(source, tmp, files, plan, raw, result, dtype, allow_pickle, trust_remote_code) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from .patch import apply_patch

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "low_cpu_mem_usage": True}
    kwargs["use_safetensors"] = None if allow_pickle else True
    torch_dtype = DTYPES.get((dtype or "auto").lower())
    if torch_dtype is None:
        raise CheckpointError(f"--dtype {dtype!r} is not one of {', '.join(sorted(set(DTYPES)))}")
    kwargs.update(compat.dtype_kwargs(torch_dtype if torch_dtype == "auto" else getattr(torch, torch_dtype)))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI shows its own progress; keep stderr for it and errors
    with contextlib.suppress(ImportError):
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"cannot load the model from {str(source)!r}: {reason}") from None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_patch(model, plan)  # verified below, against the saved model reloaded stock
    return _save_loaded(model, source, tmp, files, plan, result)


def _save_loaded(model, source: Path, tmp: Path, files: list[Path], plan: PatchPlan, result: PatchResult) -> dict:
    """Save a loaded, patched model into `tmp` with SOURCE's other files (tokenizer...) and the portable config."""
    result.patched_outputs = probe_outputs(model.eval(), plan)
    result.patched_dtype = model_dtype(model)
    import warnings

    with warnings.catch_warnings():  # what stock loaders make of the checkpoint is in result.warnings (printed)
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=shard_size(source, files))
    saved = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()}
    for rel in files:
        name = rel.as_posix()
        weight = rel.suffix in (".safetensors",) + PICKLE_SUFFIXES or name.endswith(".index.json")
        if name in saved or weight or name in WRITTEN - {"tokenizer_config.json"}:
            continue
        result.placed[name] = sharing.place(source / rel, tmp / rel)
    saved_config = read_json(tmp / "config.json", "config.json")
    new = written_config(saved_config, plan)
    _write_json(tmp / "config.json", new)
    return new


def shard_size(source: Path, files: list[Path]) -> int:
    """The largest shard a full write of SOURCE makes, in bytes of tensors: when SOURCE is sharded, the tensors of
    its largest shard (transformers packs tensors in order while they fit, so in the same dtype the output gets
    SOURCE's shards), at most `MAX_SHARD_BYTES`."""
    shards = []
    for rel in files:
        if rel.suffix == ".safetensors" and len(rel.parts) == 1:
            _, header_len, size = read_safetensors_header(source / rel)
            shards.append(size - 8 - header_len)
    return min(max(shards), MAX_SHARD_BYTES) if len(shards) > 1 else MAX_SHARD_BYTES


def verify_output(
    folder: Path, plan: PatchPlan, mode: str, source_config=None, patched_outputs: Any = None, patched_dtype: Any = None
) -> None:
    """Load `folder` with stock transformers and verify it (`rope_extend.verify.verify_plan`): the RoPE it builds
    equals rope-extend's numbers and a forward beyond the original length runs and agrees with rope-extend's
    patched model (the real one on the full path, a small random-weight one of the same config otherwise); and its
    tokenizer loads and its chat templates compile (`rope_extend.tokenizer.verify_tokenizer`)."""
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    verify_tokenizer(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(folder)
        stock_model = None
        if mode == "full":
            stock_model = AutoModelForCausalLM.from_pretrained(
                folder, low_cpu_mem_usage=True, **compat.dtype_kwargs("auto")
            ).eval()
    verify_plan(plan, source_config=source_config if source_config is not None else config, stock_config=config,
                patched_outputs=patched_outputs, stock_model=stock_model, patched_dtype=patched_dtype)


PROBE_TOKENS = 6  # the verification's forward (verify.probe_inputs): six tokens


def check_loading(given: str, folder: Path, config, dtype: str | None, skip: bool = False, ways=None) -> None:
    """Refuse in one line, before loading, a full write (or a verification on real weights, with its own `ways`)
    whose weights do not fit the machine's memory (`rope_extend.memory`); one model is loaded at a time."""
    from . import memory

    ways = ways or memory.WaysOut(device=None, other=(
        "write the config only (--mode config-only: the weights are linked, not loaded)",))
    memory.check_inference(given, folder, compat.text_config(config), dtype, PROBE_TOKENS, ways=ways, skip=skip)


def patch_checkpoint(
    source: str | os.PathLike,
    spec: RopeSpec | dict | str | os.PathLike,
    out: str | os.PathLike,
    options: WriteOptions | None = None,
    *,
    revision: str | None = None,
    **fields: Any,
) -> PatchResult:
    """Write SOURCE with rescaled RoPE to OUT (see the module docstring). Returns a `PatchResult`.

    The Python API's edge: `spec` is parsed, planned on SOURCE once (`plan_checkpoint`), then `write_checkpoint`
    executes the plan. `options` (or `WriteOptions` fields as keywords: `mode=`, `dtype=`, `overwrite=`,
    `verify=`...) say how; `revision` is SOURCE's Hub revision. Everything is validated (spec, SOURCE's files, OUT)
    before any path is created.
    """
    options = replace(options or WriteOptions(), **fields) if fields else options or WriteOptions()
    loaded, plan = plan_checkpoint(source, load_spec(spec), out, options, revision=revision)
    return write_checkpoint(loaded, plan, out, options)


def plan_checkpoint(source: str | os.PathLike, spec: RopeSpec, out: str | os.PathLike, options: WriteOptions,
                    *, revision: str | None = None) -> tuple[Source, PatchPlan]:
    """SOURCE resolved, OUT checked against it, SOURCE's config read, and the one plan of `spec` on it, refused
    where it cannot be written: what `patch` plans before `write_checkpoint` executes it."""
    folder = resolve_source(source, revision=revision)
    check_output_path(folder, Path(out), options.overwrite)
    loaded = read_source(source, folder, options.trust_remote_code)
    check_rope_model(compat.text_config(loaded.config))
    if compat.text_part(loaded.raw).get("max_position_embeddings") is None and spec.original_max_position_embeddings is None:
        raise SpecError(
            "config.json has no max_position_embeddings, so the original context length is unknown (transformers "
            f"would assume its default {getattr(loaded.config, 'max_position_embeddings', '?')}); set "
            "original_max_position_embeddings in the spec (--set original_max_position_embeddings=N)",
            field="original_max_position_embeddings",
        )
    return loaded, plan_source(loaded, spec)  # a spec that extends nothing is refused by the plan


def write_checkpoint(
    source: Source, plan: PatchPlan, out: str | os.PathLike, options: WriteOptions = WriteOptions(), model=None
) -> PatchResult:
    """Execute `plan`: write SOURCE patched to OUT, atomically (see the module docstring), and verify it.

    The one writer of checkpoints. Without `model`, SOURCE's weights are linked (config-only) or loaded, patched
    with the plan and saved (full); with `model` (an already-loaded, patched model, e.g. trained by `rope-extend
    train`), that model is saved, and verification checks stock transformers' reload against it (same RoPE, same
    outputs beyond the original length, in the dtype the weights are saved in). Either way OUT gets SOURCE's other
    files (tokenizer...), the portable config, the raised length caps, `rope_extend.yaml`, the model card and the
    record. A model a mixed-precision `Trainer` prepared is written and verified as stock transformers runs it
    (`stock_forward`). The serving hints are computed once and named for the terminal, the card and the record.
    """
    started = time.perf_counter()
    step = options.on_step or (lambda message: None)
    mode = options.write_mode(loaded=model is not None)
    model = stock_forward(model) if model is not None else None
    out_path, carried = _checked_before_writing(source, plan, out, options, mode, loaded=model is not None)
    hints = ServingHints.of(plan, source.raw)
    result = _result(source, plan, out_path, mode, hints)
    with _atomic_dir(out_path, options.overwrite) as tmp:
        new = _write_weights_and_config(tmp, source, plan, carried, options, mode, model, result, step)
        spec_yaml = plan.spec.to_yaml()
        (tmp / "rope_extend.yaml").write_text(spec_yaml)
        if options.extra is not None:
            options.extra(tmp)
        unbacked = _write_card(tmp, source, plan, new, hints, spec_yaml, options, result)
        _write_record(tmp, hints, spec_yaml, result, options.verify, unbacked)
        result.written += ["rope_extend.yaml", "README.md"]
        if options.verify:
            _verify_written(tmp, source, plan, mode, options, result, step, trained=model is not None)
        result.patched_outputs = None
    result.seconds = time.perf_counter() - started
    return result


def _checked_before_writing(source: Source, plan: PatchPlan, out: str | os.PathLike, options: WriteOptions,
                            mode: str, loaded: bool) -> tuple[Path, list[Path]]:
    """OUT checked against SOURCE, SOURCE's files to carry over, and (before anything is created or loaded) the
    plan's small-model forward and the memory a full write needs: (OUT's absolute path, the files to carry)."""
    out_path = check_output_path(source.folder, Path(out), options.overwrite)
    carried = scan_source(source.folder, options.allow_pickle)
    if options.verify and not loaded:  # a plan whose small-model forward fails is refused
        verify_or_explain(plan, source.config)
    if mode == "full" and not loaded:  # the weights in the dtype they load in, and the probe
        check_loading(source.given, source.folder, source.config, options.dtype, skip=not options.memory_check)
    return out_path, carried


def _result(source: Source, plan: PatchPlan, out_path: Path, mode: str, hints: ServingHints) -> PatchResult:
    """The result as the terminal shows it: OUT named by its path (the card and the record name it otherwise)."""
    result = PatchResult(out=out_path, source=source.folder, mode=mode, plan=plan, warnings=list(plan.warnings))
    result.serving = hints.markdown(str(out_path))
    result.serve = hints.serve(str(out_path))
    result.warnings += [w for w in hints.warnings if w not in result.warnings]
    return result


def _write_weights_and_config(tmp: Path, source: Source, plan: PatchPlan, carried: list[Path], options: WriteOptions,
                              mode: str, model, result: PatchResult, step) -> dict:
    """SOURCE's files, the weights (linked, or saved: a loaded model's or SOURCE's patched) and the portable
    config.json in `tmp`, the length caps raised; returns the config.json written."""
    if model is not None:
        step("writing the trained checkpoint")
        new = _save_loaded(model, source.folder, tmp, carried, plan, result)
    elif mode == "config-only":
        step(f"writing the {mode} checkpoint")
        new = _config_only(source.folder, tmp, carried, plan, source.raw, result)
    else:
        step(f"writing the {mode} checkpoint")
        new = _full(source.folder, tmp, carried, plan, source.raw, result, options.dtype, options.allow_pickle,
                    options.trust_remote_code)
    result.written = ["config.json"] + _update_caps(tmp, plan.old_max_position_embeddings, plan.spec.target_length)
    return new


def _write_card(tmp: Path, source: Source, plan: PatchPlan, new: dict, hints: ServingHints, spec_yaml: str,
                options: WriteOptions, result: PatchResult) -> dict:
    """The model card (README.md) of what was written, with the parity report of it (issue 10); returns the serving
    routes that report contradicts, which neither the card nor the record lists (the terminal warns of them)."""
    engines, unbacked = card_parity(plan, tmp, hints) if options.engines_report else (None, {})
    result.warnings += [  # a route the check contradicts that no hint warned about (the terminal lists it)
        f"{engine} ({'this checkpoint' if which == 'command' else 'the original model'}): not listed in the "
        f"card: {why}" for (engine, which), why in unbacked.items()
        if not any(engine in w for w in result.warnings)
    ]
    card = build_model_card(
        base_model=_public_name(source.given, source.folder),
        source_dir=source.folder,
        spec_yaml=spec_yaml,
        method=plan.spec.method,
        config_diff=config_diff(compat.text_part(source.raw), compat.text_part(new)),
        serving=card_serving(hints, options.hub_id, result.out.name, unbacked),
        eval_summary=options.eval_summary,
        engines=engines,
        training=options.training,
    )
    if (tmp / "README.md").exists():
        (tmp / "README.md").unlink()
    (tmp / "README.md").write_text(card)
    return unbacked


def card_serving(hints: ServingHints, hub_id: str | None, folder_name: str, unbacked: dict | None = None) -> str:
    """The card's Serving section: the commands for the Hub repo OUT is pushed to (`hub_id`), or for OUT as a
    folder beside the reader (`./NAME`, with a line that says where to run them from), never OUT's absolute path.
    A push to a repo renders the section for that repo from the record (`publish.cards.with_serving`)."""
    if hub_id:
        return hints.markdown(hub_id, unbacked)
    local = f"./{folder_name}"
    return (f"The commands name this checkpoint's folder `{shlex.quote(local)}`: run them from the folder that holds "
            f"it. A push to the Hub sends this card with the commands naming the repo instead.\n\n"
            + hints.markdown(local, unbacked))


def _verify_written(tmp: Path, source: Source, plan: PatchPlan, mode: str, options: WriteOptions,
                    result: PatchResult, step, trained: bool) -> None:
    """Verify what was written in `tmp` (`verify_output`); a failure is raised, or, with `keep_unverified`, the
    written folder is kept there, its card and record saying why."""
    step("verifying: stock transformers reload equals the trained model" if trained
         else "verifying: stock transformers reload, the tokenizer and a forward beyond the original length")
    try:
        verify_output(tmp, plan, mode, source_config=source.config, patched_outputs=result.patched_outputs,
                      patched_dtype=result.patched_dtype)
    except VerificationError as exc:
        if options.keep_unverified is None:
            raise
        raise _keep_unverified(tmp, Path(options.keep_unverified).expanduser().absolute(), exc) from None
    result.verified = True


def _write_record(tmp: Path, hints: ServingHints, spec_yaml: str, result: PatchResult, verified: bool,
                  unbacked: dict | None = None) -> None:
    """OUT's rope_extend.yaml, written last: the spec, then rope-extend's record of every file now in OUT (the
    weights shared with SOURCE by their identity, the rest by sha256) and of the card's serving commands (without
    the `unbacked` routes, as the card), with the model named `record.MODEL_ID` (what `rope-extend push` reads and
    checks)."""
    shared = {name: how for name, how in result.placed.items() if how in sharing.SHARED}
    record.write_record(tmp, spec_yaml, serve=str(hints.serve(record.MODEL_ID)),
                        serving=hints.markdown(record.MODEL_ID, unbacked), shared=shared, verified=verified)


def stock_forward(model):
    """`model` running the forward stock transformers runs after a reload. transformers' `Trainer` with bf16/fp16
    prepares the model with accelerate, which keeps the float32 master weights but replaces `model.forward` by one
    that runs under autocast, and leaves it so after training: probing that forward compares a bfloat16 computation
    with the float32 reload of the same weights (issue 36: max abs diff 46 at output scale 33.8 on SmolLM2).
    accelerate's own unwrap (`keep_fp32_wrapper=False`) restores the model's forward."""
    if "_original_forward" not in vars(model):  # accelerate's marker of its mixed-precision wrapper
        return model
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=False)


UNVERIFIED_NOTE = """> **Not verified.** rope-extend wrote this checkpoint in full, then stock transformers' reload of it failed
> verification: {reason}
> The weights are the trained ones as saved; check the reason before using them. To verify again, rerun the
> `rope-extend train` command that wrote it: it resumes from its state folder and writes and verifies OUT without
> training again."""


def _keep_unverified(tmp: Path, kept: Path, exc: Exception) -> VerificationError:
    """Move a written checkpoint that failed verification from the temporary folder to `kept` (a previous kept folder
    rope-extend wrote is replaced; a foreign one is left alone and `kept-2`, `kept-3`... used), the card saying why."""
    reason = " ".join(str(exc).split())
    readme = tmp / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    lines = text.splitlines()
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    note = UNVERIFIED_NOTE.format(reason=reason)
    lines = lines[: title + 1] + ["", note] + lines[title + 1 :] if title is not None else [note, "", *lines]
    readme.write_text("\n".join(lines) + "\n")
    record.refresh(tmp, record.read_record(tmp), verified=False)  # its card says why; a push must not say otherwise
    target, number = kept, 1
    while target.exists() and not (target / "rope_extend.yaml").is_file():
        number += 1
        target = kept.with_name(f"{kept.name}-{number}")
    if target.exists():
        old = target.parent / f".{target.name}{TMP_TAG}{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(target)
    return UnverifiedCheckpointError(reason, kept=str(target), reason=reason)


def _public_name(source: str | os.PathLike, resolved: Path) -> str:
    """What the model card calls the base model: its Hub repo (`hub.base_model_id`: a Hub id, the alias's repo,
    a Hub cache snapshot's repo), or the local folder's name (never its path)."""
    from .hub import base_model_id

    return base_model_id(source, resolved) or resolved.name
