"""transformers, the reference engine: what every run engine's output is compared with (`engines.runs`).

`reference` runs rope-extend's RoPE (`patch.apply_patch` on the original model) in transformers, float32, and returns
the log-probability of every prompt token of each request; `text_ids` gives the requests' tokens (the evaluation
text under the checkpoint's tokenizer). A run engine serves the same token ids and `runs.compare_logprobs` measures
the difference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .runs import REFERENCE, RunProgress


def reference_logprobs(model, ids: list[int]):
    """transformers' log p(token i | tokens < i), i = 1..n-1, float32, from a (patched) model's forward."""
    import torch

    from ..eval.perplexity import token_losses

    return (-token_losses(model, torch.tensor(ids, dtype=torch.long))).tolist()


def text_ids(tokenizer_dir: Path, n: int, text: str | None = None) -> list[int]:
    """The first n token ids of the evaluation text (`eval.texts`; default pydoc_topics, with the debian_licenses
    text appended when it is too short) under the checkpoint's tokenizer. Only a prefix is tokenised."""
    return list(_text_ids(str(Path(tokenizer_dir).resolve()), n, text))


@functools.lru_cache(maxsize=8)
def _text_ids(tokenizer_dir: str, n: int, text: str | None) -> tuple[int, ...]:
    from transformers import AutoTokenizer

    from ..eval.perplexity import tokenize_text
    from ..eval.texts import LICENSES_TEXT, load_text

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    full = load_text(text) if text is not None else load_text(None) + "\n\n" + load_text(LICENSES_TEXT)
    chars = 8 * n
    while True:  # a token is rarely more than 8 characters: tokenise a prefix, longer only if it falls short
        ids = tokenize_text(tokenizer, full[:chars]).tolist()
        if len(ids) >= n + 64 or chars >= len(full):  # the cut word (at the end) is left out
            break
        chars *= 2
    if len(ids) < n:
        raise ValueError(f"the evaluation text has {len(ids)} tokens under this tokenizer; the long request needs {n}")
    return tuple(ids[:n])


def reference_model(model_dir: Path, plan):
    """The original model in `model_dir` with rope-extend's RoPE (`plan` applied), float32: what the reference runs
    (the writer's verification is not at stake here)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..compat import dtype_kwargs
    from ..patch import apply_patch

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **dtype_kwargs(torch.float32)).eval()
    apply_patch(model, plan)
    return model


@dataclass(frozen=True)
class Cost:
    """Seconds a forward of n tokens takes on this machine, a·n + b·n² (the projections grow with n, attention with
    n²), fitted on two forwards of the reference model (`calibrate`)."""

    a: float
    b: float
    timed: tuple[tuple[int, float], ...]  # (tokens, seconds) of the forwards it was fitted on

    def __call__(self, n: int) -> float:
        return self.a * n + self.b * n * n

    def describe(self) -> str:
        return " and ".join(f"{n} tokens in {t:.2g} s" for n, t in self.timed)


def calibrate(model, ids: list[int], longest: int) -> Cost:
    """Time two forwards of `model` (at n and 2n tokens, n = min(512, longest / 2), after a short one that takes the
    first call's one-time costs) and fit `Cost` to them."""
    import time

    n1 = max(16, min(512, longest // 2))
    reference_logprobs(model, ids[:16])
    timed = []
    for n in (n1, 2 * n1):
        started = time.perf_counter()
        reference_logprobs(model, ids[:n])
        timed.append((n, time.perf_counter() - started))
    (n1, t1), (n2, t2) = timed
    b = max(0.0, (t2 - 2 * t1) / (2 * n1 * n1))
    a = max(0.0, (t1 - b * n1 * n1) / n1) if b else t2 / n2
    return Cost(a, b, tuple(timed))


def reference(model, plan, requests: dict[int, list[int]],
              progress: RunProgress | None = None) -> dict[int, list[float]]:
    """transformers running rope-extend's RoPE (`reference_model`: `plan` applied), float32: the log-probabilities of
    each request's prompt tokens. A request of n tokens is a prompt of n - 1 tokens and one generated token (an
    engine refuses a prompt of its whole context length: nothing could be generated); a dynamic method holds its
    scale at n, as rope-extend serves such a request (`fixed_rope_length`)."""
    from ..dynamic import fixed_rope_length

    out = {}
    for n, ids in requests.items():
        with (progress or RunProgress.silent()).request(f"{REFERENCE} (reference)", n):
            with fixed_rope_length(model, n):
                out[n] = reference_logprobs(model, ids)
    return out
