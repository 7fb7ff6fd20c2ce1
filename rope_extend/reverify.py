"""`rope-extend verify OUT`: verify a written folder again, as it is now, then refresh its card and record.

What "verified" means is `verify.py` (the check `patch_model` and the writer run while writing); this module runs
that check again later, on a folder already written.

A push sends only what rope-extend verified (`rope_extend.record`). After a deliberate edit (a chat template, the
generation defaults, a config key, other weights), `reverify(OUT)` runs the real verification again on OUT as it now
is, the same one `patch` runs:

1. OUT must be a checkpoint rope-extend wrote with a record (without one: the line that says how to make one), its
   config.json carrying rope-extend's marker (the spec and the model's RoPE before the patch); the patch is planned
   again from them (`plan.plan_patch`).
2. Every weight file's header must describe exactly its length, and the index's shards must exist
   (`files.check_safetensors`, `files.index_shards`). The tokenizer must load and every chat template compile
   (`tokenizer.verify_tokenizer`). Then stock transformers must build the planned RoPE from OUT's
   config.json, and a forward beyond the original length must agree with rope-extend's patched model: on a small
   random-weight model of the config when the weights are the ones verified (nothing in their record changed), on
   the real weights otherwise (stock transformers' load of OUT against OUT's weights loaded with the config before
   the patch and patched in-process: the model is loaded twice, one after the other).
3. Only then is anything written: the record (the same files, as they are now: `record.write_record`) and, when the
   card is rope-extend's (unchanged since it was recorded), its 'Where it serves identically' section recomputed and
   a line in its Provenance saying what was re-verified. A card edited by hand is the user's: left as written.

Files added to OUT after it was written stay out of the record (a push sends them only with `--include`), but for
weights: weight files (and their index) the record does not list, a full checkpoint re-sharded for instance, make
the forward run on the real weights, and the record then lists them (a record that lists no weights vouches for no
model: `publish.selection.unverified_reason`). An OUT with no weight file is refused.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import compat, files, record, sharing
from .errors import CheckpointError, VerificationError
from .facts import read_rope

REVERIFIED = "Re-verified by rope-extend"


@dataclass
class Reverified:
    folder: Path
    changed: list[tuple[str, str]] = field(default_factory=list)  # what differed from the record, with how
    real_weights: bool = False  # the forward ran on the real weights (they changed)
    card: str = "refreshed"  # or "kept as edited", "none"
    weights: list[str] = field(default_factory=list)  # the weight files (and index) the record now vouches for
    seconds: float = 0.0


def reverify(folder: str | os.PathLike, on_step: Callable[[str], None] | None = None,
             memory_check: bool = True) -> Reverified:
    """Re-verify OUT as it is now and refresh its card and record (see the module docstring). Raises
    CheckpointError (what OUT lacks), VerificationError (what no longer verifies) or, with `memory_check`,
    NotEnoughMemoryError (changed weights that do not fit the memory to load); nothing is written then."""
    started = time.perf_counter()
    step = on_step or (lambda message: None)
    given = str(folder)
    root = _written_folder(given)
    recorded = _recorded(root, given)
    config, plan, pristine = _planned_again(root, given)
    changed, added = _changes(root, recorded)
    real = any(record.is_top_weight(name) for name, _ in changed) or not recorded.contents_known
    _check_weight_files(root, given, step)
    if real:  # OUT's weights are loaded: refused before loading when they do not fit the memory
        from . import memory
        from .checkpoint import check_loading

        check_loading(given, root, config, "auto", skip=not memory_check,
                      ways=memory.WaysOut(dtype_flag=None, device="a machine with more memory"))
    step("verifying: the tokenizer, stock transformers reload and a forward beyond the original length"
         + (" on the real weights (they changed)" if real else ""))
    edited = ", ".join(name for name, _ in changed) or "no file"
    try:
        _verify(root, plan, real, pristine)
    except VerificationError as exc:
        raise VerificationError(f"OUT {given!r} does not verify as it is now: {exc}; nothing was written: restore "
                                f"what changed ({edited}), or write OUT again with `rope-extend patch` into a new "
                                "folder") from None
    step("refreshing the record and the card")
    result = _refresh(root, recorded, plan, changed, added, real)
    result.seconds = time.perf_counter() - started
    return result


def _written_folder(given: str) -> Path:
    """OUT as an absolute path: a checkpoint folder rope-extend may write (not a Hub cache snapshot)."""
    root = Path(os.path.abspath(Path(given).expanduser()))
    if not (root / "config.json").is_file():
        raise CheckpointError(f"OUT {given!r} is not a checkpoint folder (no config.json); give the folder "
                              "`rope-extend patch` or `train` wrote")
    if files.hub_repo_root(root) is not None:
        raise CheckpointError(f"OUT {given!r} is a Hub cache snapshot (its files are links to the cache's blobs), "
                              "which rope-extend never writes; download the repo into a folder of its own (hf "
                              "download REPO --local-dir DIR) and verify that")
    return root


def _recorded(root: Path, given: str) -> record.Record:
    """OUT's record; without one, the line that says how to make one (or that rope-extend did not write OUT)."""
    recorded = record.read_record(root)
    if recorded is not None:
        return recorded
    if record.written_by_rope_extend(root):
        raise CheckpointError(record.no_record_message(root).replace(", so nothing was sent", ""))
    raise CheckpointError(f"OUT {given!r} was not written by rope-extend (no rope_extend.yaml, no rope_extend "
                          "marker in config.json): there is no patch to verify; write one with `rope-extend patch`")


def _planned_again(root: Path, given: str):
    """(OUT's config, the patch its marker records planned again from the RoPE before the patch, that RoPE's
    config); refused, before any model is built, when the marker is lost or edited or config.json's RoPE is not
    what that patch writes."""
    from .source import Source, plan_source
    from .spec import RopeSpec

    config = _quietly(lambda: files.load_config(root))  # transformers' own warnings about an edit: said below
    text = compat.text_config(config)
    marker = compat.read_marker(text)
    restore = "restore config.json, or write OUT again with `rope-extend patch` into a new folder"
    if not marker or not isinstance(marker.get("spec"), dict):
        raise CheckpointError(f"OUT {given!r}: config.json has lost rope-extend's marker (the `rope_extend` key: the "
                              f"spec and the RoPE before the patch), so the patch cannot be planned again; {restore}")
    facts = read_rope(text)  # the marker's record of the RoPE before the patch: the patch is planned from there
    try:
        spec = RopeSpec(**marker["spec"])
    except (ValueError, TypeError) as exc:  # SpecError, pydantic's: the marker itself was edited
        reason = re.sub(r"; (give|use|set|remove|pass) .*$", "", " ".join(str(exc).split())).removeprefix(
            "invalid spec: ")  # the spec's own advice is for a spec a user writes, not for this marker
        raise CheckpointError(f"OUT {given!r} does not verify as it is now: config.json's rope_extend marker (its "
                              f"record of the patch) was edited and no longer holds together ({reason}); nothing was "
                              f"written: {restore}") from None
    pristine = compat.stock_config(text, facts.pristine_slots, facts.pristine_max_position_embeddings, None)
    # what its marker records, planned from the RoPE before the patch (config.json as it is now may be edited)
    plan = plan_source(Source(given, root, files.read_config(root), pristine), spec)
    edits = config_edits(facts, plan)  # before any model is built: config.json is read, not run
    if edits:
        raise VerificationError(
            f"OUT {given!r} does not verify as it is now: config.json's rope parameters no longer match the record: "
            f"{'; '.join(edits)} (the patch its rope_extend marker records, {plan.spec.method} x{plan.spec.factor:g} "
            f"over {plan.spec.original_max_position_embeddings} tokens, writes those), so stock loaders would serve "
            f"another RoPE; nothing was written: {restore}")
    return config, plan, pristine


def _changes(root: Path, recorded: record.Record) -> tuple[list[tuple[str, str]], list[str]]:
    """(every file not as recorded, with how, the weights added since included; the weight files added since: a
    re-sharded checkpoint's, verified on and then recorded)."""
    changed = record.changes(root, recorded) if recorded.contents_known else [
        (name, "not recorded by content") for name in sorted(recorded.files)]
    added = [name for name, _ in record.walk(root) if record.is_top_weight(name) and name not in recorded.files]
    return changed + [(name, "added") for name in added], added


def _check_weight_files(root: Path, given: str, step: Callable[[str], None]) -> None:
    """OUT holds weights, each weight file's header describes exactly its length, and the index's shards exist."""
    weights = sorted(name for name, _ in record.walk(root) if sharing.is_weight(name) and "/" not in name)
    if not weights:
        raise CheckpointError(f"OUT {given!r} holds no weight file (*.safetensors), so there is no model to verify; "
                              "put its weights back, or write OUT again with `rope-extend patch` into a new folder")
    step(f"checking {len(weights)} weight file{'s' * (len(weights) != 1)} and the index")
    for name in weights:
        files.check_safetensors(record.contents(root, name))
    files.index_shards(root)


def _refresh(root: Path, recorded: record.Record, plan, changed: list[tuple[str, str]], added: list[str],
             real: bool) -> Reverified:
    """Only after verification: the card (rope-extend's, unchanged since recorded: its engines section recomputed
    and a Provenance line saying what was re-verified; an edited one is the user's) and the record rewritten."""
    from .engines.parity import card_section

    card_path = root / record.CARD
    card_edited = any(name == record.CARD for name, _ in changed) and recorded.contents_known
    result = Reverified(folder=root, changed=changed, real_weights=real,
                        card="none" if not card_path.is_file() else "kept as edited" if card_edited else "refreshed")
    if result.card == "refreshed":
        what = ", ".join(name for name, _ in changed) or "nothing changed"
        note = (f"{REVERIFIED} {_version()} on {time.strftime('%Y-%m-%d')} ({what}): stock transformers' reload "
                f"and a forward beyond the original length{' on the real weights' if real else ''}.")
        record.write_fresh(card_path, refresh_card(card_path.read_text(encoding="utf-8"), card_section(plan, root),
                                                   note))
    record.refresh(root, recorded, added=added)
    result.weights = record.read_record(root).weights
    return result


def config_edits(facts, plan) -> list[str]:
    """What config.json (as `facts` read it) holds that the planned patch does not write: each RoPE parameter the
    plan writes with another value or missing, and max_position_embeddings. Empty when config.json is as written."""
    import math

    edits = []
    for slot, params in plan.slots.items():
        now = facts.slots.get(slot)
        where = "" if slot in (None, compat.FLAT) else f"{slot}: "
        if now is None:
            edits.append(f"{where}no rope parameters where the patch writes {params}")
            continue
        for key, value in params.items():
            held = now.get(key)
            same = (held == value if not (isinstance(held, (int, float)) and isinstance(value, (int, float)))
                    else math.isclose(float(held), float(value), rel_tol=1e-9, abs_tol=1e-12))
            if not same:
                edits.append(f"{where}{key} is {_shown(held)} where the patch writes {_shown(value)}")
    if facts.max_position_embeddings != plan.max_position_embeddings:
        edits.append(f"max_position_embeddings is {facts.max_position_embeddings} where the patch writes "
                     f"{plan.max_position_embeddings}")
    return edits


def _shown(value) -> str:
    return "missing" if value is None else repr(value) if isinstance(value, float) else str(value)


def _quietly(call: Callable):
    """`call()` with transformers' logging at errors only (its warning about an edited config is said by
    `config_edits` in rope-extend's words)."""
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    finally:
        hf_logging.set_verbosity(level)


def _verify(root: Path, plan, real: bool, source) -> None:
    """The verification of `checkpoint.verify_output` with `source` (OUT's config before the patch): a small model
    of it, or with `real`, OUT's real weights patched in-process against stock transformers' load of OUT."""
    from .checkpoint import verify_output
    from .tokenizer import verify_tokenizer

    if not real:
        verify_output(root, plan, "config-only", source_config=source)
        return
    verify_tokenizer(root)  # before the weights are loaded: it costs little and says the same
    outputs, dtype = patched_outputs_of(root, plan)
    verify_output(root, plan, "full", source_config=source, patched_outputs=outputs, patched_dtype=dtype)


def patched_outputs_of(root: Path, plan):
    """rope-extend's patched model of OUT's weights: loaded with the config before the patch, patched in-process."""
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    from .patch import apply_patch
    from .verify import model_dtype, probe_outputs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(root)
        facts = read_rope(compat.text_config(config))
        compat.write_slots(compat.text_config(config), facts.pristine_slots, facts.pristine_max_position_embeddings,
                           None)
        model = AutoModelForCausalLM.from_pretrained(root, config=config, low_cpu_mem_usage=True,
                                                     **compat.dtype_kwargs("auto")).eval()
        apply_patch(model, plan)
    outputs, dtype = probe_outputs(model, plan), model_dtype(model)
    del model
    return outputs, dtype


def _version() -> str:
    from . import __version__

    return __version__


def refresh_card(text: str, engines: str, note: str) -> str:
    """`text` (a card rope-extend wrote) with its 'Where it serves identically' section replaced by `engines` and
    `note` as the last line of its Provenance section (a previous re-verification's line replaced)."""
    heading = "\n## Where it serves identically\n\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        end = len(text) if end < 0 else end
        text = text[: start + len(heading)] + engines.rstrip() + "\n" + text[end:]
    lines = [line for line in text.rstrip("\n").split("\n") if not line.startswith(REVERIFIED)]
    return "\n".join(lines) + "\n\n" + note + "\n"
