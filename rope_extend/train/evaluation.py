"""`--eval-suite SUITE`: the evaluation before and after training, under names that say which model is which.

Before training (`before`), `rope-extend eval` runs on SOURCE unpatched and on SOURCE with the run's plan
training-free, into `OUT-eval/before/`; after OUT is written (`after`), on OUT as stock transformers loads it, with
no spec applied on top, into `OUT-eval/after/`. The card's block (`section`) is the eval's own summary tables, one
column per model; `training.json`'s `eval` (`summary`) copies every case's number from the eval's records. Both
evals run on the training's device and in its precision (`settings`), and resume when the command is rerun.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import training_card
from .prepare import Prepared, trains_in_bf16
from .recipe import TrainSpec


def eval_dir(prep: Prepared) -> Path:
    return prep.out.parent / f"{prep.out.name}-eval"


def training_free_label(prep: Prepared) -> str:
    """The eval's name for SOURCE with the plan applied training-free ('yarn-x2', as `rope-extend eval` names it)."""
    from ..eval.variants import variant_name

    return variant_name(prep.plan.spec, set())


def trained_label(prep: Prepared) -> str:
    """The eval's name for the trained checkpoint: 'trained yarn-x2'."""
    return f"trained {training_free_label(prep)}"


def settings(spec: TrainSpec, device: str) -> dict:
    """Where `--eval-suite` runs, the same before and after: the training's device; float32 on the CPU (as the CPU
    records in eval/reports), bfloat16 on a GPU that trains in it (as the GPU records), float32 when asked."""
    if device == "cpu":
        return {"device": "cpu", "dtype": "float32"}
    return {"device": device, "dtype": "bfloat16" if trains_in_bf16(spec, device) else "float32"}


def before(prep: Prepared) -> list[dict]:
    """SOURCE unpatched and with the plan training-free, on the suite (resumable: finished cases are kept)."""
    from ..eval.options import EvalOptions
    from ..eval.runner import run_eval

    return run_eval(str(prep.source), [prep.plan.spec], prep.spec.evaluation.suite, eval_dir(prep) / "before",
                    EvalOptions(progress=False, **settings(prep.spec, prep.device)))


def after(prep: Prepared, out: Path) -> list[dict]:
    """OUT as stock transformers loads it (its own config carries the scaling: no spec is applied on top), under
    its own name rather than the eval runner's 'unpatched'."""
    from ..eval.options import EvalOptions
    from ..eval.runner import run_eval

    return run_eval(str(out), {trained_label(prep): None}, prep.spec.evaluation.suite, eval_dir(prep) / "after",
                    EvalOptions(include_baseline=False, progress=False, **settings(prep.spec, prep.device)))


def summary(prep: Prepared, before_records: list[dict], after_records: list[dict] | None) -> dict:
    """training.json's `eval`: every case's headline number, copied from the eval's own records."""
    from ..eval.suite import load_suite
    from ..eval.variants import BASELINE

    rows = []
    for r in before_records + (after_records or []):
        m = r["metrics"]
        row = {"variant": r["variant"], "case_id": r["case_id"], "kind": r["kind"], "length": r["length"]}
        if "ppl" in m:
            row.update(ppl=m["ppl"], ppl_ci=m.get("ppl_ci"))
        elif "score" in m:
            row["score"] = m["score"]
        rows.append(row)
    folder = eval_dir(prep)
    return {"suite": load_suite(prep.spec.evaluation.suite).name, **settings(prep.spec, prep.device),
            "before": str(folder / "before"), "after": str(folder / "after") if after_records is not None else None,
            "variants": {BASELINE: "SOURCE as loaded", training_free_label(prep): "SOURCE patched, training-free",
                         trained_label(prep): "this checkpoint (trained), as stock transformers loads it"},
            "records": rows}


def section(prep: Prepared, before_records: list[dict], after_records: list[dict] | None) -> str:
    """The card's eval block: the eval's own summary tables, one column per variant."""
    from ..eval.runner import summary_markdown
    from ..eval.suite import load_suite

    plan, where = prep.plan.spec, settings(prep.spec, prep.device)
    head = (f"Suite `{load_suite(prep.spec.evaluation.suite).name}` ({where['device']}, {where['dtype']}): `unpatched` is "
            "SOURCE as loaded, "
            f"`{training_free_label(prep)}` SOURCE with {plan.method} x{plan.factor:g} training-free, ")
    if after_records is None:
        head += "before training (the trained checkpoint's column is added when the run finishes)."
    else:
        # The reports' folder is beside OUT, not published with it: the card points to what is (training.json).
        head += (f"`{trained_label(prep)}` this checkpoint as stock transformers loads it (no spec applied on top). "
                 f"`{training_card.SUMMARY_FILE}` (`eval`) holds every measurement.")
    records = before_records + (after_records or [])
    return f"{training_card.EVAL_START}\n{head}\n\n{summary_markdown(records).rstrip()}\n{training_card.EVAL_END}"


def write_after(prep: Prepared, out: Path, before_records: list[dict], after_records: list[dict],
                run_summary: dict) -> None:
    """Replace the card's before-only eval block with before + after, and add both to training.json."""
    readme = out / "README.md"
    readme.write_text(training_card.replace_eval(readme.read_text(), section(prep, before_records, after_records)))
    run_summary["eval"] = summary(prep, before_records, after_records)
    (out / training_card.SUMMARY_FILE).write_text(json.dumps(run_summary, indent=2) + "\n")
