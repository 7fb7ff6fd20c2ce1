"""`tune_model`: the whole `rope-extend tune` run as a function (what the CLI calls).

Loads the model once, tokenizes the calibration text, runs the search (`search.tune`), writes the winning spec
(`best.yaml`) plus the best closed form and best per-dimension curve, optionally evaluates the held-out comparison,
and writes the report. Every stage is resumable from the files in the output folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..facts import read_rope
from ..outputs import HELDOUT_LOG, SEARCH_LOG, check_replaceable
from ..spec import RopeSpec
from . import heldout as ho
from .options import TuneOptions
from .report import write_report
from .search import TuneResult, tune


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def spec_yaml(spec: dict[str, Any], comment: str) -> str:
    """Validated YAML of a spec dict, with a provenance comment on top."""
    body = RopeSpec(**spec).to_yaml()
    return "".join(f"# {line}\n" for line in comment.splitlines()) + body


def heldout_variants(result: TuneResult) -> list[ho.HeldoutVariant]:
    """The issue's comparison set: unpatched, the closed forms at defaults, the tuned closed form and curve.

    The tuned specs, YaRN and the unpatched model come first, so a run cut short has the key comparison.
    """
    tuned = []
    if result.best_per_dim is not None:
        tuned.append(ho.HeldoutVariant("tuned per-dim", result.spec("best_per_dim")))
    if result.best_closed is not None:
        tuned.append(ho.HeldoutVariant(f"tuned closed: {result.best_closed.candidate.name}", result.spec("best_closed")))
    defaults = ho.default_variants(result.geometry.factor)
    first = [v for v in defaults if v.name.startswith(("yarn", "unpatched"))]
    return tuned[:1] + first + tuned[1:] + [v for v in defaults if v not in first]


def tune_model(model_path: str, target_length: int, output: str | Path,
               options: TuneOptions | None = None) -> TuneResult:
    """Run the search (and the held-out comparison when `options.heldout` is given), write the specs, the report
    and OUT/summary.json; returns the search's result.

    `model_path`: a checkpoint folder, a Hub id or the alias `smollm2`, resolved as `patch` resolves SOURCE;
    `options`: how it runs (`tune.options.TuneOptions`; the defaults when None)."""
    from ..eval.perplexity import tokenize_text
    from ..eval.texts import load_text, text_label
    from ..eval.variants import load_model

    options = options or TuneOptions()
    output = Path(output)
    check_replaceable(output, "tune")  # a new or empty folder, or a tune output (resumed): never a user's folder
    folder = _check_memory(model_path, target_length, options)
    output.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(folder, dtype=options.dtype, device_map=options.device_map, device=options.device)
    calib_ids = tokenize_text(tokenizer, load_text(options.text))
    header = {"model": str(model_path), "text": text_label(options.text), "dtype": options.dtype}
    held = heldout_comparison(model, tokenizer, str(model_path), target_length, output, options)
    result = tune(model, target_length, calib_ids, budget=options.budget, methods=options.methods,
                  knots=options.knots, log_path=output / SEARCH_LOG, resume=options.resume, header=header,
                  attention_factor=options.attention_factor)
    written = write_specs(output, result, f"{_command(model_path, target_length, options)}\n"
                          f"calibration text: {header['text']}; {len(result.records)} evaluations")
    records = held(heldout_variants(result)) if held is not None else None
    summary = write_report(output, result, records, model.config, plots=options.plots)
    summary["specs"] = written
    (output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _check_memory(model_path: str, target_length: int, options: TuneOptions) -> Path:
    """SOURCE's folder (a folder, a Hub id through the Hub cache, or an alias: as `patch`), after refusing in one
    line, before loading, a run that needs more memory than the device has (`rope_extend.memory`)."""
    from .. import compat, memory
    from ..files import load_config
    from ..hub import resolve_source

    folder = resolve_source(model_path)
    memory.check_inference(str(model_path), folder, compat.text_config(load_config(folder)), options.dtype,
                           target_length, kv_cache=options.passkey_samples > 0, device=options.device,
                           device_map=options.device_map, ways=memory.WaysOut(length="--target-length {fits}"),
                           skip=not options.memory_check)
    return folder


def heldout_comparison(model, tokenizer, model_name: str, target_length: int, output: Path,
                       options: TuneOptions) -> Callable[[list[ho.HeldoutVariant]], list[dict]] | None:
    """The held-out comparison on `options.heldout` (None without one): a function of the variants it compares,
    resumable from OUT's held-out log. With `baselines_first`, the closed forms at their defaults (which do not
    depend on the search) are compared at once, the unpatched model and YaRN first."""
    from ..eval.perplexity import tokenize_text
    from ..eval.texts import load_text

    if options.heldout is None:
        return None
    label = "licenses" if str(options.heldout) == "licenses" else str(options.heldout)
    ids = tokenize_text(tokenizer, ho.license_text() if label == "licenses" else load_text(options.heldout))
    original = read_rope(model.config).original_length()

    def compare(variants: list[ho.HeldoutVariant]) -> list[dict]:
        return ho.compare(model, ids, variants, original, target_length, tokenizer=tokenizer,
                          passkey_samples=options.passkey_samples, log_path=output / HELDOUT_LOG,
                          resume=options.resume, header={"model": model_name, "text": label})

    if options.baselines_first:
        defaults = ho.default_variants(target_length / original)
        first = [v for v in defaults if v.name.startswith(("unpatched", "yarn"))]
        compare(first + [v for v in defaults if v not in first])
    return compare


def _command(model_path: str, target_length: int, options: TuneOptions) -> str:
    """The command that tuned it, as the specs' comments give it."""
    return (f"rope-extend tune {Path(str(model_path)).name} --target-length {target_length} --budget {options.budget:g}"
            + (f" --attention-factor {options.attention_factor:g}" if options.attention_factor is not None else ""))


def write_specs(output: Path, result: TuneResult, provenance: str) -> dict[str, str]:
    """best.yaml (the winner), best-closed.yaml and best-per-dim.yaml (those found), each with `provenance` and the
    calibration loss that chose it in a comment, written atomically; returns which is where."""
    written = {}
    for which, name in (("winner", "best.yaml"), ("best_closed", "best-closed.yaml"),
                        ("best_per_dim", "best-per-dim.yaml")):
        scored = getattr(result, which)
        if scored is None:
            continue
        comment = f"{provenance}\n{which}: {scored.candidate.name}, calibration loss beyond " \
                  f"{result.geometry.original_length} at {scored.length} tokens: {scored.loss:.4f}"
        _atomic_write(output / name, spec_yaml(result.spec(which), comment))
        written[which] = str(output / name)
    return written
