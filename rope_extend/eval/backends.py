"""Where `rope-extend eval` runs each variant: transformers in this process (default), or a real vLLM (`--engine vllm`).

A backend answers what the evaluator asks of one loaded variant: the next-token losses of a token sequence
(perplexity) and the greedy answers to probe prompts (passkey, needles); attention entropy needs the attention
weights, so only transformers has it.

- `TransformersBackend`: the model loaded with transformers and patched in place with `patch_model`; probes of one
  task reuse the KV cache of their common prefix (`eval.jobs`).
- `VllmBackend`: the variant served by vLLM as the card says to serve the original model with the method (its
  `--hf-overrides`, from the engine hints) in a `vllm_run.VllmWorker`: losses are minus its prompt
  log-probabilities, answers its greedy generation decoded with the same tokenizer. `plan_vllm` checks, once
  and before anything loads, that vLLM serves every variant identically at every length the suite asks (the
  vLLM port of `rope_extend.engines` at those lengths): a method vLLM serves otherwise (attention-level methods,
  dynamic scaling beyond the window, LongRoPE's short factors) is refused in one line; the unpatched model is
  served up to its window only (vLLM's cos/sin cache has that many rows), so its longer cases are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("transformers", "vllm")


class TransformersBackend:
    """A variant as a (patched) model in this process."""

    name = "transformers"

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


class VllmBackend:
    """A variant served by vLLM (`VllmWorker`, already loaded with the variant's settings)."""

    name = "vllm"

    def __init__(self, worker, tokenizer):
        self.worker, self.tok = worker, tokenizer

    def token_losses(self, ids, chunk_size: int = 1024):
        import torch

        return -torch.tensor(self.worker.prompt_logprobs(ids.reshape(-1).tolist()), dtype=torch.float32)

    def probes(self, samples: list) -> list[dict]:
        """Greedy answers, one request each (vLLM's prefix cache shares what prompts have in common)."""
        from .probes import score

        out = []
        for sample in samples:
            tokens = self.worker.generate(sample.input_ids, sample.max_new_tokens)
            text = self.tok.decode(tokens, skip_special_tokens=True)
            out.append({"score": score(sample, text), "output": text, "answers": sample.answers})
        return out

    def entropy(self, ids, length: int, queries: int) -> list[float]:
        raise ValueError("attention entropy needs the attention weights, which vLLM does not return")


# --- what vLLM serves, planned once before loading --------------------------------------------------------------------
@dataclass(frozen=True)
class VllmServing:
    """How one variant is served: the original model with `hf_overrides` and `max_model_len` (+ `env`); `left_out`:
    the case ids it cannot serve (the unpatched model beyond its window) and `why`."""

    hf_overrides: dict | None
    max_model_len: int
    env: dict
    left_out: frozenset = frozenset()
    why: str = ""


def _positions(case, budget) -> int:
    """Positions a case's request runs: a perplexity text of N tokens is a prompt of N tokens (the one token then
    generated never runs); a probe prompt of N tokens with k = budget(case) new tokens runs N + k - 1."""
    return case.length + budget(case) - 1 if case.is_probe else case.length


def _max_model_len(cases: list, budget) -> int:
    """--max-model-len for these cases: prompt + new tokens (1 for a perplexity text) of the longest."""
    return max([c.length + (budget(c) if c.is_probe else 1) for c in cases], default=1)


def plan_vllm(model_path, variants: list, plans: dict, cases: dict, budget) -> dict[str, VllmServing]:
    """The vLLM serving of every variant (by name), or ValueError in one line for a variant vLLM cannot evaluate:
    a callable spec, an entropy case, or a method vLLM does not serve as rope-extend computes it at some length the
    suite asks for. `plans`: each spec variant's PatchPlan on SOURCE (by name), made once by `run_eval`; `cases`:
    each variant's cases (by name); `budget(case)`: a probe case's max_new_tokens."""
    from ..engines.parity import vllm_eval_serving
    from ..source import load_source

    loaded = load_source(model_path, config_only=True)
    raw = loaded.raw
    if any(c.kind == "entropy" for mine in cases.values() for c in mine):
        raise ValueError("eval --engine vllm: the suite measures attention entropy, which needs the attention "
                         "weights vLLM does not return; drop its entropy section or use --engine transformers")
    out = {}
    for v in variants:
        spec = v.spec_dict()
        if spec is not None and "callable" in spec:
            raise ValueError(f"eval --engine vllm: variant {v.name!r} is a Python callable, which vLLM cannot "
                             "serve; give it as a spec (method=...) or use --engine transformers")
        plan = None if spec is None else plans[v.name]  # the plan run_eval made, not a second one
        mine = cases[v.name]
        served = vllm_eval_serving(plan, raw, _max_model_len(mine, budget), [_positions(c, budget) for c in mine])
        bad = {n: why for n, why in served.verdicts.items() if why}
        if bad and plan is not None:
            n = min(bad)
            raise ValueError(f"eval --engine vllm: vLLM does not serve {v.name} as rope-extend computes it at {n} "
                             f"tokens ({bad[n]}); evaluate it with --engine transformers")
        kept = [c for c in mine if _positions(c, budget) not in bad]
        if len(kept) < len(mine):  # the unpatched model beyond its window: re-plan for what is left
            served = vllm_eval_serving(None, raw, _max_model_len(kept, budget), [])
        out[v.name] = VllmServing(served.overrides, _max_model_len(kept, budget), served.env,
                                  frozenset(c.case_id for c in mine if c not in kept), bad[min(bad)] if bad else "")
    return out
