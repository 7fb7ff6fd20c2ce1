"""Where `rope-extend eval` runs each variant: transformers in this process (the reference, default), or a run
engine (`--engine NAME`: a real serving engine registered in `rope_extend.engines.runs`, e.g. vLLM).

A backend answers what the evaluator asks of one loaded variant: the next-token losses of a token sequence
(perplexity) and the greedy answers to probe prompts (passkey, needles); attention entropy needs the attention
weights, so only transformers has it.

- `TransformersBackend`: the model loaded with transformers and patched in place with `patch_model`; probes of one
  task reuse the KV cache of their common prefix (`eval.jobs`).
- `EngineBackend`: the variant served by a run engine as the card says to serve the original model with the method
  (its overrides, from the engine hints), loaded in the engine's worker: losses are minus its prompt
  log-probabilities, answers its greedy generation decoded with the same tokenizer. `plan_engine` asks the engine,
  once and before anything loads, whether it serves every variant identically at every length the suite asks (the
  engine's port of `rope_extend.engines` at those lengths): a method it serves otherwise (for vLLM: attention-level
  methods, dynamic scaling beyond the window, LongRoPE's short factors) is refused in one line; the unpatched model
  is served up to its window only (vLLM's cos/sin cache has that many rows), so its longer cases are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class TransformersBackend:
    """A variant as a (patched) model in this process."""

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def token_losses(self, ids, chunk_size: int = 1024):
        from .perplexity import token_losses

        return token_losses(self.model, ids, chunk_size=chunk_size)

    def probes(self, samples: list) -> list[dict]:
        """Greedy answers; prompts of one job share their common prefix's KV cache."""
        from .probes import run_probe, run_probes_sharing_prefix

        if len(samples) > 1:
            return run_probes_sharing_prefix(self.model, self.tok, samples)
        return [run_probe(self.model, self.tok, samples[0])]

    def entropy(self, ids, length: int, queries: int) -> list[float]:
        from ..entropy import attention_entropy

        return attention_entropy(self.model, ids, [length], queries=queries)[length]


class EngineBackend:
    """A variant served by a run engine (`worker`, already loaded with the variant's settings)."""

    def __init__(self, worker, tokenizer):
        self.worker, self.tok = worker, tokenizer

    def token_losses(self, ids, chunk_size: int = 1024):
        import torch

        return -torch.tensor(self.worker.prompt_logprobs(ids.reshape(-1).tolist()), dtype=torch.float32)

    def probes(self, samples: list) -> list[dict]:
        """Greedy answers, one request each (the engine's prefix cache shares what prompts have in common)."""
        from .probes import score

        out = []
        for sample in samples:
            tokens = self.worker.generate(sample.input_ids, sample.max_new_tokens)
            text = self.tok.decode(tokens, skip_special_tokens=True)
            out.append({"score": score(sample, text), "output": text, "answers": sample.answers})
        return out

    def entropy(self, ids, length: int, queries: int) -> list[float]:
        raise ValueError("attention entropy needs the attention weights, which a serving engine does not return")


# --- what a run engine serves, planned once before loading ------------------------------------------------------------
@dataclass(frozen=True)
class EngineServing:
    """How one variant is served: the engine's `settings` (the original model with its overrides, for requests of up
    to the longest case); `left_out`: the case ids it cannot serve (the unpatched model beyond its window) and
    `why`."""

    settings: Any
    left_out: frozenset = frozenset()
    why: str = ""


def _positions(case, budget) -> int:
    """Positions a case's request runs: a perplexity text of N tokens is a prompt of N tokens (the one token then
    generated never runs); a probe prompt of N tokens with k = budget(case) new tokens runs N + k - 1."""
    return case.length + budget(case) - 1 if case.is_probe else case.length


def _max_len(cases: list, budget) -> int:
    """The context length these cases need: prompt + new tokens (1 for a perplexity text) of the longest."""
    return max([c.length + (budget(c) if c.is_probe else 1) for c in cases], default=1)


def plan_engine(engine, model_path, variants: list, plans: dict, cases: dict, budget) -> dict[str, EngineServing]:
    """The serving of every variant (by name) by the run engine `engine` (a `RunEngine`), or ValueError in one
    line for a variant it cannot evaluate: a callable spec, an entropy case, or a method it does not serve as
    rope-extend computes it at some length the suite asks for. `plans`: each spec variant's PatchPlan on SOURCE (by
    name), made once by `run_eval`; `cases`: each variant's cases (by name); `budget(case)`: a probe case's
    max_new_tokens."""
    from ..engines.runs import REFERENCE
    from ..source import load_source

    loaded = load_source(model_path, config_only=True)
    raw = loaded.raw
    where = f"eval --engine {engine.name}"
    if any(c.kind == "entropy" for mine in cases.values() for c in mine):
        raise ValueError(f"{where}: the suite measures attention entropy, which needs the attention weights "
                         f"{engine.title} does not return; drop its entropy section or use --engine {REFERENCE}")
    out = {}
    for v in variants:
        spec = v.spec_dict()
        if spec is not None and "callable" in spec:
            raise ValueError(f"{where}: variant {v.name!r} is a Python callable, which {engine.title} cannot "
                             f"serve; give it as a spec (method=...) or use --engine {REFERENCE}")
        plan = None if spec is None else plans[v.name]  # the plan run_eval made, not a second one
        mine = cases[v.name]
        served = engine.eval_serving(plan, raw, _max_len(mine, budget), [_positions(c, budget) for c in mine])
        bad = {n: why for n, why in served.verdicts.items() if why}
        if bad and plan is not None:
            n = min(bad)
            raise ValueError(f"{where}: {engine.title} does not serve {v.name} as rope-extend computes it at {n} "
                             f"tokens ({bad[n]}); evaluate it with --engine {REFERENCE}")
        kept = [c for c in mine if _positions(c, budget) not in bad]
        if len(kept) < len(mine):  # the unpatched model beyond its window: re-plan for what is left
            served = engine.eval_serving(None, raw, _max_len(kept, budget), [])
        out[v.name] = EngineServing(served.settings, frozenset(c.case_id for c in mine if c not in kept),
                                    bad[min(bad)] if bad else "")
    return out
