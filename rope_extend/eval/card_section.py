"""An evaluation run as the model card's Evaluation section (`rope_extend.card.EvaluationSection`): its tables, the
lengths it measured and the model-index entries (`patch --eval`, `demo`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CardEval:
    """An evaluation run for the card: the records of `run_eval`, the suite, and which variant is this checkpoint
    (None: the one variant besides the unpatched baseline)."""

    records: list[dict]
    suite: str
    smoke: bool = False
    variant: str | None = None
    notes: list[str] = field(default_factory=list)

    def checkpoint_variant(self) -> str | None:
        from .variants import BASELINE

        if self.variant is not None:
            return self.variant
        names = list(dict.fromkeys(r["variant"] for r in self.records if r["variant"] != BASELINE))
        return names[0] if len(names) == 1 else None

    def markdown(self) -> str:
        from .report import smoke_banner, summary_tables

        parts = [smoke_banner(self.suite)] if self.smoke else []
        parts.append(summary_tables(self.records).rstrip())
        # The card links no report: the eval folder is not part of the checkpoint, so it is never published.
        parts.append(f"Measured with rope-extend's `{self.suite}` suite.")
        return "\n\n".join(parts)

    def measured_lengths(self) -> list[int]:
        variant = self.checkpoint_variant()
        return sorted({int(r["length"]) for r in self.records if r["variant"] == variant and r.get("length")})

    def results(self, model_name: str) -> list:
        """One `EvalResult` per measurement of the checkpoint's variant: perplexity by text and length, retrieval
        accuracy by task, haystack and length; `metric_args` holds n and the 95 % interval (``"n = 1: no interval"``
        for a perplexity of one block)."""
        from huggingface_hub import EvalResult

        from .report import accuracy, haystack_of
        from .stats import NO_INTERVAL

        variant = self.checkpoint_variant()
        suite = f"suite {self.suite}" + (" (smoke test: too few samples for evidence)" if self.smoke else "")
        out = []
        probes: dict[tuple[str, str, int], list[float]] = {}
        for r in self.records:
            if r["variant"] != variant:
                continue
            m, length = r["metrics"], int(r["length"])
            if r["kind"] == "perplexity":
                args: dict[str, Any] = {"context_length": length}
                if len(m.get("block_losses") or ()) == 1:  # one block: no interval (older records carry [x, x])
                    args["interval_95"] = NO_INTERVAL
                elif m.get("ppl_ci"):
                    args["interval_95"] = [round(float(x), 4) for x in m["ppl_ci"]]
                if m.get("block_losses"):
                    args["n"] = len(m["block_losses"])
                    args["n_unit"] = f"{m.get('block_size', 128)}-token blocks"
                text = m.get("text") or "text"
                out.append(EvalResult(
                    task_type="text-generation", task_name=f"perplexity at {length} tokens", dataset_type=text,
                    dataset_name=text, metric_type="perplexity", metric_value=round(float(m["ppl"]), 4),
                    metric_name=f"perplexity ({length} tokens)", metric_config=suite, metric_args=args,
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
            ))
        return out
