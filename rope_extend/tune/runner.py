"""`tune_model`: the whole `rope-extend tune` run as a function (what the CLI calls).

Loads the model once, tokenizes the calibration text, runs the search (`search.tune`), writes the winning spec
(`best.yaml`) plus the best closed form and best per-dimension curve, optionally evaluates the held-out comparison,
and writes the report. Every stage is resumable from the files in the output folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..facts import read_rope
from ..outputs import HELDOUT_LOG, SEARCH_LOG, check_replaceable
from ..spec import RopeSpec
from . import heldout as ho
from .report import write_report
from .search import DEFAULT_BUDGET, TuneResult, tune


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


def tune_model(
    model_path: str,
    target_length: int,
    output: str | Path,
    *,
    text: str | Path | None = None,
    heldout: str | Path | None = None,
    budget: float = DEFAULT_BUDGET,
    methods: list[str] | None = None,
    knots: int = 6,
    passkey_samples: int = 0,
    dtype: str = "float32",
    device: str | None = None,
    device_map: str | None = None,
    resume: bool = True,
    plots: bool = True,
    baselines_first: bool = False,
    attention_factor: float | None = None,
    memory_check: bool = True,
) -> dict[str, Any]:
    """Run the search (and the held-out comparison when `heldout` is given); returns a summary dict.

    `baselines_first`: evaluate the held-out closed forms at their defaults before the search (they do not depend
    on it), so a run cut short on a slow machine still has the baseline table. `attention_factor`: pin the
    per-dimension curves' attention factor (see `search.tune`). `model_path`: a checkpoint folder, a Hub id or the
    alias `smollm2`, resolved as `patch` resolves SOURCE; `memory_check`: refuse, before loading, a run that needs
    more memory than the device has (`rope_extend.memory`)."""
    from .. import compat, memory
    from ..eval.perplexity import tokenize_text
    from ..eval.texts import load_text, text_label
    from ..eval.variants import load_model
    from ..files import load_config
    from ..hub import resolve_source

    output = Path(output)
    check_replaceable(output, "tune")  # a new or empty folder, or a tune output (resumed): never a user's folder
    folder = resolve_source(model_path)  # a folder, a Hub id (through the Hub cache) or an alias: as `patch`
    memory.check_inference(str(model_path), folder, compat.text_config(load_config(folder)), dtype, target_length,
                           kv_cache=passkey_samples > 0, device=device, device_map=device_map,
                           ways=memory.WaysOut(length="--target-length {fits}"), skip=not memory_check)
    output.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(folder, dtype=dtype, device_map=device_map, device=device)
    calib_ids = tokenize_text(tokenizer, load_text(text))
    header = {"model": str(model_path), "text": text_label(text), "dtype": dtype}
    held = None
    if heldout is not None:
        held_label = "licenses" if str(heldout) == "licenses" else str(heldout)
        held_ids = tokenize_text(tokenizer, ho.license_text() if held_label == "licenses" else load_text(heldout))

        def held_compare(variants):
            return ho.compare(
                model, held_ids, variants, read_rope(model.config).original_length(), target_length, tokenizer=tokenizer,
                passkey_samples=passkey_samples, log_path=output / HELDOUT_LOG, resume=resume,
                header={"model": str(model_path), "text": held_label},
            )

        held = held_compare
        if baselines_first:
            defaults = ho.default_variants(target_length / read_rope(model.config).original_length())
            held_compare([v for v in defaults if v.name.startswith(("unpatched", "yarn"))]
                         + [v for v in defaults if not v.name.startswith(("unpatched", "yarn"))])
    result = tune(model, target_length, calib_ids, budget=budget, methods=methods, knots=knots,
                  log_path=output / SEARCH_LOG, resume=resume, header=header, attention_factor=attention_factor)

    original = result.geometry.original_length
    provenance = (
        f"rope-extend tune {Path(str(model_path)).name} --target-length {target_length} --budget {budget:g}"
        + (f" --attention-factor {attention_factor:g}" if attention_factor is not None else "") + "\n"
        f"calibration text: {header['text']}; {len(result.records)} evaluations"
    )
    written = {}
    for which, name in (("winner", "best.yaml"), ("best_closed", "best-closed.yaml"), ("best_per_dim", "best-per-dim.yaml")):
        scored = getattr(result, which)
        if scored is None:
            continue
        comment = f"{provenance}\n{which}: {scored.candidate.name}, calibration loss beyond {original} at " \
                  f"{scored.length} tokens: {scored.loss:.4f}"
        _atomic_write(output / name, spec_yaml(result.spec(which), comment))
        written[which] = str(output / name)

    records = held(heldout_variants(result)) if held is not None else None
    summary = write_report(output, result, records, model.config, plots=plots)
    summary["specs"] = written
    (output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
