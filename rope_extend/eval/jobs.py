"""Planning and executing evaluation jobs.

A *case* is one number in the report (perplexity of one text at one length, one passkey prompt...); a *job* is
one piece of model work that produces one or more cases for one variant. Planning is pure: it turns the suite's
cases, the variants and the already-finished records into an ordered job list. Executing runs one job on a
loaded model and returns its metrics.

Sharing that does not change a number (up to float rounding; ``bench/eval_sharing.py`` checks it): for a variant
whose RoPE does not depend on the sequence length (the unpatched model and every static method)

* perplexity of the same text at 2k, 8k and 16k comes from ONE forward at 16k -- a causal model's loss at
  position ``i`` does not depend on what follows;
* probe prompts of one task (same instructions, the same filler stream, needles at different depths and
  lengths) prefill their common start once: run deepest needle first, each prompt reuses the KV cache of the
  previous one up to where they differ, so it only prefills from its needle on.

Dynamic methods rescale with the current length, so each of their perplexity lengths gets its own forward. Their
probe prompts of ONE length still share a prefix exactly: every prompt of a cell has the same token count and
``max_new_tokens``, and the patched model (``dynamic_mode="consistent"``, what eval uses) holds one scale per
``generate`` request, computed from prompt length + ``max_new_tokens``; so the cached prefix was computed at
the very scale the next prompt's own prefill would use. Dual-chunk's length scale (a factor from the number of keys
of each forward) shares the same way: the cached prefix was computed in the prefill of a prompt of the same length.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

from .probes import PROBES, SECTIONS
from .suite import Case
from .variants import Variant, applies

SECTION_ORDER = ("perplexity", *SECTIONS, "entropy")  # an interleaved run's order within a round


def section_rank(kind: str) -> int:
    """Where a case's kind runs within an interleaved round (a probe runs with its suite section)."""
    return SECTION_ORDER.index(PROBES[kind].section if kind in PROBES else kind)


@dataclass(frozen=True)
class Job:
    """Model work for one variant: ``cases`` share one forward (perplexity at several lengths), share a KV prefix
    (probe prompts of one task), or are one case."""

    variant: Variant
    cases: tuple[Case, ...]
    round: int = 0  # the sample's rank within its cell (interleaved runs finish round by round)

    @property
    def kind(self) -> str:
        return self.cases[0].kind

    @property
    def length(self) -> int:
        return max(c.length for c in self.cases)

    def cost(self) -> float:
        """Rough relative cost (for the ETA): linear + quadratic attention term."""
        L = self.length
        n = len(self.cases) if self.cases[0].is_probe else 1
        return n * L * (1.0 + L / 16384.0) * (1.3 if self.cases[0].is_probe else 1.0)


def length_independent(variant: Variant) -> bool:
    """Whether the variant's output at a position does not depend on the sequence length (static RoPE).

    Asks the method (`depends_on_length`: dynamic methods, dual-chunk's length scale); a callable spec is unknown
    territory and treated as dynamic.
    """
    spec = variant.spec_dict()
    if spec is None:
        return True
    if "callable" in spec:
        return False
    from ..methods.registry import get_method

    return not get_method(spec["method"]).depends_on_length(spec)


def probes_share_within_length(variant: Variant) -> bool:
    """Whether probe prompts of one length can share a KV prefix on this variant: static ones always (see
    `length_independent`), dynamic ones too (one scale per request of a fixed length); a callable spec is
    unknown territory and never shares."""
    spec = variant.spec_dict()
    return spec is None or "callable" not in spec


def _rounds(cases: list[Case]) -> dict[str, int]:
    """Rank of each probe case within its (task, haystack, length) cell, in suite order; other cases are round 0."""
    seen: dict[tuple, int] = defaultdict(int)
    out = {}
    for c in cases:
        if c.is_probe:
            out[c.case_id] = seen[(c.kind, c.haystack, c.length)]
            seen[(c.kind, c.haystack, c.length)] += 1
        else:
            out[c.case_id] = 0
    return out


def plan_jobs(
    cases: list[Case],
    variants: list[Variant],
    done: set[tuple],
    *,
    share: bool = True,
    interleave: bool = False,
    excluded: frozenset = frozenset(),
) -> list[Job]:
    """Jobs for every (variant, case) not in ``done`` (keys ``(variant name, fingerprint, case_id)``) nor in
    ``excluded`` (keys ``(variant name, case_id)``: what the engine cannot serve).

    ``share``: one forward for all perplexity lengths of a text when the variant is length-independent; probe
    prompts share KV prefixes (across lengths when static, within one length when dynamic).
    ``interleave``: order by sample round, section (perplexity first), length, then variant, so a run stopped
    early has every variant with the same samples (one job per haystack and sample index, so records land often;
    the model is reloaded when the variant changes: cheap for
    small models); otherwise variant by variant, one load each.
    """
    rounds = _rounds(cases)
    jobs: list[Job] = []
    for v in variants:
        pending = [c for c in cases if (v.name, v.fingerprint, c.case_id) not in done and applies(c, v)
                   and (v.name, c.case_id) not in excluded]
        groups: dict[tuple, list[Case]] = {}
        static = share and length_independent(v)
        for c in pending:
            if c.kind == "perplexity" and static:
                key = ("perplexity", tuple(sorted(c.params.items())))
            elif c.is_probe and static:  # prompts of one task share instructions and filler up to the needle
                key = (c.kind,) + ((c.haystack, c.index) if interleave else ())
            elif c.is_probe and share and probes_share_within_length(v):  # dynamic: only prompts of one length
                key = (c.kind, c.length) + ((c.haystack, c.index) if interleave else ())
            else:
                key = (c.case_id,)
            groups.setdefault(key, []).append(c)
        jobs += [Job(v, tuple(g), min(rounds[c.case_id] for c in g)) for g in groups.values()]
    if interleave:
        order = {v.name: i for i, v in enumerate(variants)}
        jobs.sort(key=lambda j: (j.round, section_rank(j.kind), j.length, order[j.variant.name]))
    return jobs


class Evaluator:
    """Runs jobs on one loaded model variant (caches the tokenised texts across variants).

    backend: where the variant runs (`eval.backends`); default: `model` in this process with transformers."""

    _text_cache: ClassVar[dict] = {}

    def __init__(self, model, tokenizer, original: int, seed: int, backend=None):
        from .backends import TransformersBackend

        self.model, self.tok, self.original, self.seed = model, tokenizer, original, seed
        self.backend = backend or TransformersBackend(model, tokenizer)  # (backends never imports jobs)
        self.patch_report = None  # what patching this variant reported (kept for the first record)

    def text_ids(self, source):
        from .perplexity import tokenize_text
        from .texts import load_text

        key = (id(type(self.tok)), getattr(self.tok, "name_or_path", ""), len(self.tok), str(source))
        if key not in self._text_cache:
            self._text_cache[key] = tokenize_text(self.tok, load_text(source))
        return self._text_cache[key]

    def run(self, job: Job) -> list[dict]:
        """Metrics for each of the job's cases, in order."""
        first = job.cases[0]
        if first.kind == "perplexity":
            from .perplexity import perplexity_from_losses, text_window

            p = first.params
            lengths = [c.length for c in job.cases]
            ids = text_window(self.text_ids(p.get("text")), max(lengths), int(p.get("start", 0)))
            by_length = perplexity_from_losses(
                self.backend.token_losses(ids, chunk_size=int(p.get("chunk_size", 1024))), lengths,
                original_length=self.original, bucket_size=int(p.get("bucket_size", 1024)),
                block_size=int(p.get("block_size", 128)),
            )
            return [dict(by_length[c.length], text=p.get("text") or "pydoc_topics") for c in job.cases]
        if first.is_probe:
            samples = [self.probe(c) for c in job.cases]
            results = self.backend.probes(samples)
            return [dict(r, needle_positions=s.needle_positions) for r, s in zip(results, samples)]
        return [self.run_case(c) for c in job.cases]

    def run_case(self, case: Case) -> dict:
        """An entropy case (the only kind that is not one of a job's shared forwards or probe prompts)."""
        p = case.params
        per_layer = self.backend.entropy(self.text_ids(p.get("text")), case.length, int(p.get("queries", 128)))
        return {"mean_entropy": sum(per_layer) / len(per_layer), "per_layer": per_layer}

    def probe(self, case: Case):
        from .probes import make_probe

        params = {k: v for k, v in case.params.items() if k != "ceiling"}
        return make_probe(self.tok, case.kind, case.length, 0.5 if case.depth is None else case.depth,
                          index=case.index, seed=self.seed, **params)

    def preflight(self, cases: list[Case]) -> None:
        """Fail fast, before any model work: every text must be long enough and every probe prompt must fit its
        length (a prompt is never truncated)."""
        for c in cases:
            if c.kind in ("perplexity", "entropy"):
                n = self.text_ids(c.params.get("text")).numel() - int(c.params.get("start", 0))
                if c.length > n:
                    raise ValueError(
                        f"perplexity text {c.params.get('text') or 'pydoc_topics'!r} has only {n} tokens; the "
                        f"suite asks for {c.length} (use shorter lengths or a longer --text)"
                    )
            else:
                self.probe(c)
