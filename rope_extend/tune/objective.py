"""The tuning objective: mean next-token loss of the positions beyond the original window on calibration text.

One candidate = patch the loaded model in place (`patch_model`: buffers only, cheap), one forward over the first
`length` calibration tokens through the eval library's chunked loss, `unpatch_model`. Only positions whose predicted
token index is >= L count (the same convention as `rope_extend.eval.perplexity`): inside the window the per-dim
candidates are the original model by construction, so the loss there says nothing about them.

A forward's time grows between linearly and quadratically with its length (SmolLM2-135M on CPU: 8k ~ 0.3x a 16k
forward), so the search accounts cost in units of one target-length forward with `eval_cost`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..eval.perplexity import token_losses
from ..patch import patch_model, unpatch_model
from .space import Candidate


def eval_cost(length: int, target_length: int) -> float:
    """Cost of one forward of `length` tokens in target-length forwards: (n / N) ** 1.5 (between linear and
    quadratic; measured on CPU for SmolLM2: an 8k forward is 0.30-0.35 of a 16k one)."""
    return (length / target_length) ** 1.5


@dataclass
class Evaluation:
    loss: float
    n_tokens: int
    seconds: float


class CalibrationObjective:
    """Mean loss beyond `original_length` of a candidate on the first `length` tokens of `token_ids`."""

    def __init__(self, model, token_ids: torch.Tensor, original_length: int, chunk_size: int = 1024):
        self.model = model
        self.token_ids = token_ids.reshape(-1)
        self.original_length = int(original_length)
        self.chunk_size = chunk_size

    def check_length(self, length: int) -> None:
        if self.token_ids.numel() < length:
            raise ValueError(
                f"the calibration text has {self.token_ids.numel()} tokens but the search needs {length}; "
                "give a longer --text (or concatenate several documents)"
            )

    def __call__(self, candidate: Candidate, length: int) -> Evaluation:
        self.check_length(length)
        start = time.perf_counter()
        patch_model(self.model, candidate.spec)
        try:
            losses = token_losses(self.model, self.token_ids[:length], chunk_size=self.chunk_size)
        finally:
            unpatch_model(self.model)
        beyond = losses[self.original_length - 1 :]
        loss = float(beyond.double().mean())
        if not torch.isfinite(torch.tensor(loss)):
            loss = float("inf")
        return Evaluation(loss, int(beyond.numel()), time.perf_counter() - start)
