"""A real mlx-lm, run: the run adapter of the MLX room (`MlxRun`, the room's `run`) and its client of `worker.py`
(`MlxWorker`).

`MlxWorker` starts the worker under the MLX environment's Python (`env.py`) and sends it requests (JSON lines): load a
checkpoint as `mlx_lm.load(FOLDER, model_config=...)` does, in float32, then prompt log-probabilities and greedy
generation through mlx-lm's own `generate_step`, prefilling the card command's chunks (`--prefill-step-size`,
default 2048) into the KV cache. One worker serves many checkpoints in turn. What mlx-lm refuses (an unknown RoPE
type) comes back as `MlxRefused` with mlx-lm's own message: for the report that is a result.

`MlxRun` tells the two commands what MLX is to them: `--run mlx` (one route: `generate_step`, the loop behind
`mlx_lm.generate`, `mlx_lm.stream_generate` and, with the same prefill chunks, `mlx_lm.server`); the card's two routes
with its printed command's settings (the room's hint: `MlxServing`, the model_config and the prefill step); for
`eval --engine mlx`, what mlx-lm serves as rope-extend computes it, checked through the port before anything loads;
and how a folder is loaded with those settings. The comparison itself is the same for every run engine: `engines.runs`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import hf_config
from ..run_engine import EngineRefused, EvalServing
from ..runs import card_routes, card_settings, log_tail, port_verdicts
from ..served import NotServed, Served, compare, default_inv_freq
from . import port
from .port import MlxServing

if TYPE_CHECKING:
    from ...plan import PatchPlan
    from ..hint import EngineHint, Route
    from ..registry import ServingEngine
    from .env import MlxEnv

ROUTES = ("generate",)
CARD_ROUTES = ("this checkpoint", "original model + model_config")


class MlxError(RuntimeError):
    """The MLX worker itself failed (it exited, or answered nonsense); the message ends with its log's tail."""


class MlxRefused(EngineRefused):
    """mlx-lm refused a load or a request; the message is mlx-lm's own (e.g. `ValueError: Unsupported RoPE type`)."""


class MlxWorker:
    """One `worker.py` process: `load` a checkpoint, then `prompt_logprobs` / `generate`; `close` ends it. Its stderr
    goes to `log_path` (a temp file by default), whose tail ends every MlxError."""

    def __init__(self, env: MlxEnv | None = None, *, log_path: str | None = None):
        from . import worker
        from .env import ensure_mlx

        self.env = env or ensure_mlx()
        self.version = self.env.mlx_lm_version
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rope-extend-mlx-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        environ.update(HF_HUB_OFFLINE=environ.get("HF_HUB_OFFLINE", "1"), TOKENIZERS_PARALLELISM="false",
                       **self.env.worker_environ())
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self.env.python), "-I", worker.__file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=environ, text=True, cwd=tempfile.gettempdir(),
            start_new_session=True,  # a terminal's Ctrl-C reaches rope-extend, which stops the worker (close(now=True))
        )
        hello = self._read()
        if not hello.get("ready"):
            raise MlxError(f"the MLX worker did not start: {hello}{self._tail()}")
        self.device = str(hello.get("device", "?"))
        self.rope = ""  # the RoPE class mlx-lm built for the loaded checkpoint
        self.calls: list[tuple[int, int]] = []  # (offset, tokens) of the forward calls of the last request

    def label(self, route: str = "generate") -> str:
        """What a run row names: 'mlx-lm 0.32.2 (mlx 0.32.4, mlx-cpu) on cpu, generate_step float32'."""
        return f"{self.env.label} on {self.device}, generate_step float32"

    # --- protocol -------------------------------------------------------------------------------------------------
    def _tail(self) -> str:
        return log_tail(self.log_path, "mlx-lm")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise MlxError(f"the MLX worker exited with status {self.proc.returncode}{self._tail()}")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        """One request to the worker (see worker.py); MlxRefused with mlx-lm's message when it raised."""
        if self.proc.poll() is not None:
            raise MlxError(f"the MLX worker has exited (status {self.proc.returncode}){self._tail()}")
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise MlxRefused(answer.get("error", "no error message"))
        return answer

    # --- operations -----------------------------------------------------------------------------------------------
    def load(self, model: str | os.PathLike, *, model_config: dict | None = None,
             prefill_step: int = port.PREFILL_STEP) -> float:
        """Serve `model` (a folder) as `mlx_lm.load(model, model_config=...)` loads it, requests prefilled
        `prefill_step` tokens at a time; returns the load's seconds. Raises MlxRefused with mlx-lm's message."""
        self.rope = ""
        answer = self.ask({"op": "load", "model": str(model), "model_config": model_config or None,
                           "prefill_step": int(prefill_step)})
        self.rope = answer["rope"]
        return float(answer["seconds"])

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(token i | tokens < i) for i = 1..n-1, each from the prefill chunk that computed it."""
        answer = self.ask({"op": "prompt_logprobs", "prompt": [int(i) for i in ids]})
        self.calls = [tuple(call) for call in answer["calls"]]
        return [math.nan if v is None else float(v) for v in answer["logprobs"][1:]]

    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `ids` (token ids, at most `max_tokens`; stops before the model's EOS)."""
        return self.ask({"op": "generate", "prompt": [int(i) for i in ids], "max_tokens": int(max_tokens)})["token_ids"]

    def rope_probe(self, config: dict, n: int, at: list[int], *, model_config: dict | None = None,
                   prefill_step: int = port.PREFILL_STEP) -> Served:
        """mlx-lm's own RoPE module for `config` (with `model_config`), applied as `generate_step` applies it to a
        request of n tokens, read back at positions `at` (cos/sin with their magnitude): what the port is checked
        against. MlxRefused where mlx-lm refuses the config."""
        answer = self.ask({"op": "rope", "config": config, "model_config": model_config or None, "n": int(n),
                           "prefill_step": int(prefill_step), "positions": [int(p) for p in at]})
        import numpy as np

        self.calls = [tuple(call) for call in answer["calls"]]
        return Served(inv_freq=None, cos=np.array(answer["cos"]), sin=np.array(answer["sin"]), note=answer["rope"])

    def close(self, now: bool = False) -> None:
        """End the worker: after its current request (`quit`), or `now` (an interrupt): killed (it starts nothing)."""
        if self.proc.poll() is None:
            try:
                if now:
                    raise subprocess.TimeoutExpired("interrupt", 0)
                self.ask({"op": "quit"})
                self.proc.wait(60)
            except (MlxError, MlxRefused, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> MlxWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the run-engine adapter ------------------------------------------------------------------------------------------
def _original_served(original_config: dict, n: int, prefill_step: int) -> str | None:
    """The unpatched model: None where mlx-lm serves the RoPE transformers 5 reads from the same config.json, else
    why not (e.g. a config with only `rope_parameters`)."""
    fields, rope = port.load_config(original_config)
    _, want = hf_config.load(original_config)
    if want.get("rope_type", "default") != "default":
        return (f"the original model's own {want['rope_type']} RoPE is not checked against {port.VERSION} here "
                "(only plain RoPE is)")
    served = port.served(fields, rope, n, prefill_step=prefill_step)
    if isinstance(served, NotServed):
        return served.reason
    reference = Served(inv_freq=default_inv_freq(int(fields["head_dim"]), float(want["rope_theta"])))
    delta = compare(served, reference, n)
    return None if delta.identical else (
        f"{port.VERSION} builds cos/sin {max(delta.max_cos, delta.max_sin):.2g} away from transformers' for this "
        f"config.json" + (f": {served.note}" if served.note else ""))


class MlxRun:
    """mlx-lm as a run engine (`rope_extend.engines.runs.RunEngine`): the adapter of the `mlx` room."""

    runs = {"mlx": "generate"}
    eval_route = "generate"
    options = ()

    def __init__(self, room: ServingEngine):
        self.room = room  # its rules and port: the card routes it serves, the checks before anything loads
        self.name, self.title = room.name, room.title

    def environment_label(self) -> str:
        from .env import ensure_mlx

        return ensure_mlx().label

    def card_routes(self, hint: EngineHint) -> list[Route]:
        return card_routes(hint)

    def eval_serving(self, plan: PatchPlan | None, original_config: dict, max_len: int, lengths) -> EvalServing:
        """The original model served with plan's method (its model_config) through `generate_step`, checked through
        the port at every request length (positions 0..n-1) against rope-extend's own RoPE; the unpatched model
        against the RoPE transformers reads from its config.json (mlx-lm may read another: `_original_served`)."""
        if plan is None:
            settings = MlxServing(None)
            return EvalServing(settings, {n: _original_served(original_config, n, settings.prefill_step)
                                          for n in sorted(set(lengths))})
        return port_verdicts(self.room, plan, card_settings(self.room, plan, original_config), original_config,
                             lengths)

    def open(self) -> MlxWorker:
        return MlxWorker()

    def load(self, worker: MlxWorker, folder: Path, settings: MlxServing, *, route: str,
             engine_args: dict | None = None) -> float:
        if route not in ROUTES:
            raise ValueError(f"route {route!r} is not one of {', '.join(ROUTES)}")
        if engine_args:
            raise ValueError(f"engine argument {next(iter(engine_args))!r} is not one mlx-lm takes")
        return worker.load(folder, model_config=settings.model_config, prefill_step=settings.prefill_step)

    def describe(self, settings: MlxServing) -> dict:
        return {"model_config": settings.model_config, "prefill_step_size": settings.prefill_step}
