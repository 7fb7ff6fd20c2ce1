"""A real SGLang, run: the run adapter of the SGLang room (`SglangRun`, the room's `run`) and its worker
(`SglangWorker`): SGLang's own server, started under the SGLang environment's Python (`env.py`).

`SglangWorker.load` starts `python -m sglang.launch_server --model-path FOLDER --context-length N
[--json-model-override-args JSON]` as the card prints it, with `--device cpu --dtype float32` on the CPU engine
(`SGLANG_USE_CPU_ENGINE=1`: its torch-native path), and waits for `/health`; requests go to SGLang's native
`/generate` with `input_ids` (prompt log-probabilities: `return_logprob`, `logprob_start_len` 0, one new token;
greedy generation: temperature 0). One server serves one checkpoint; loading the next stops it first. What SGLang
refuses (a config it will not start with, a request longer than its context length) comes back as
`SglangRefused` with SGLang's own message: for the report that is a result.

There is one route, the server: SGLang's offline `sglang.Engine` runs the same tokenizer manager, scheduler and
model runner in-process, so it would serve the same numbers through the same code (`--run sglang`).

`SglangRun` tells the two commands what SGLang is to them: the card's two routes with its printed command's
settings (`SglangServing`: --context-length, --json-model-override-args, the environment), and for `eval --engine
sglang` what SGLang serves, checked through the SGLang port (`engines.sglang`) before anything loads. The port
follows SGLang 0.5.23's source; the engine that runs is 0.5.15 (the last release that runs on a CPU from PyPI:
`env.py`), and the rows and records name the version each was checked on.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from ..run_engine import EngineRefused, EvalServing
from ..runs import card_routes, card_settings, log_tail, port_verdicts
from . import port
from .env import CPU_ENV, SglangEnv, ensure_sglang
from .port import SglangServing

if TYPE_CHECKING:
    from ...plan import PatchPlan
    from ..hint import EngineHint, Route
    from ..registry import ServingEngine

ROUTES = ("server",)
START_TIMEOUT = 900.0  # seconds for a server to answer /health (a start takes 20-40 s on 2 idle cores)
# Chunked prefill off, SGLang 0.5.15 reserves max_prefill_tokens x 1.5 MB (16384 x 1.5: 24 GB) for activations out of
# the machine's memory (server_args.py `_handle_gpu_memory_settings`) and refuses to start on a 23 GB CPU machine
# ("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=-0.049", measured): on the CPU
# the worker gives it a static fraction itself (the KV pool is capped by --max-total-tokens anyway).
CPU_ONE_BATCH_MEMORY = "0.3"
# eval's engine arguments -> SGLang's server flags
FLAGS = {"tensor_parallel_size": "--tp-size"}


class SglangError(RuntimeError):
    """The SGLang server itself failed (it exited, or answered nonsense); the message ends with its log's tail."""


class SglangRefused(EngineRefused):
    """SGLang refused a load or a request; the message is SGLang's own (e.g. the input is longer than the model's
    context length)."""


def _free_port() -> int:
    """A free port SGLang can take: below 50000, because it derives others from it (its gRPC port is port + 10000)."""
    import random

    for _ in range(200):
        port = random.randint(20000, 49999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SglangError("no free port between 20000 and 49999 for the SGLang server")


def server_args(folder: str | os.PathLike, context_length: int, port: int, *, override_args: dict | None = None,
                engine_args: dict | None = None, device: str = "cpu", chunked_prefill_size: int | None = None
                ) -> list[str]:
    """`python -m sglang.launch_server`'s arguments for one checkpoint, as the card (or the audit) prints them, plus
    the CPU engine's device and dtype, a KV pool for one request of context_length tokens and `--sleep-on-idle`
    (SGLang's scheduler otherwise polls at a full core between requests, while rope-extend computes its reference
    beside it: 30 CPU-seconds of 30 idle seconds without it, 0.6 with it, SGLang 0.5.15 on this 2-core machine)."""
    args = ["-m", "sglang.launch_server", "--model-path", str(folder), "--context-length", str(int(context_length)),
            "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", str(int(context_length) + 1024),
            "--skip-server-warmup", "--sleep-on-idle"]
    if device == "cpu":
        args += ["--device", "cpu", "--dtype", "float32"]
    if override_args:
        args += ["--json-model-override-args", json.dumps(override_args, separators=(",", ":"))]
    if chunked_prefill_size is not None:
        args += ["--chunked-prefill-size", str(int(chunked_prefill_size))]
        if device == "cpu" and chunked_prefill_size == -1:
            args += ["--mem-fraction-static", CPU_ONE_BATCH_MEMORY]
    for key, value in (engine_args or {}).items():
        args += [FLAGS[key], str(value)]
    return args


class SglangWorker:
    """SGLang's server for one checkpoint at a time: `load` a folder, then `prompt_logprobs` / `generate`; `close`
    stops it. The server's log goes to `log_path` (a temp file by default), whose tail ends every SglangError and
    names what SGLang refused to start with."""

    def __init__(self, env: SglangEnv | None = None, *, log_path: str | None = None, device: str = "cpu"):
        self.env = env or ensure_sglang()
        self.version = self.env.sglang_version
        self.device = device
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rope-extend-sglang-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.url = ""

    def label(self, route: str = "server") -> str:
        """What a run row names: 'SGLang 0.5.15 on cpu, server + native /generate'."""
        return f"{self.env.label} on {self.device}, server + native /generate"

    # --- the server -------------------------------------------------------------------------------------------------
    def _tail(self) -> str:
        return log_tail(self.log_path, "SGLang")

    def _why_it_stopped(self) -> str:
        """The last error line of the server's log (SGLang's own words), else its last line."""
        try:
            lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        errors = [line for line in lines if "Error:" in line or "Exception:" in line]
        return (errors or lines or ["no log"])[-1][:1000]

    def _stop(self, now: bool = False) -> None:
        """Stop the server: SIGTERM and up to a minute to exit, or `now` (an interrupt): its whole session killed."""
        if self.proc is not None and self.proc.poll() is None:
            if now:
                os.killpg(self.proc.pid, signal.SIGKILL)  # started with start_new_session: its scheduler too
                self.proc.wait()
            else:
                self.proc.terminate()
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self._log is not None:
            self._log.close()
        self.proc, self._log = None, None

    def load(self, folder: str | os.PathLike, context_length: int, *, override_args: dict | None = None,
             env: dict | None = None, engine_args: dict | None = None, chunked_prefill_size: int | None = None
             ) -> float:
        """Serve `folder` as `python -m sglang.launch_server --model-path FOLDER --context-length N
        [--json-model-override-args JSON]` would, with `env` (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN); returns
        the start's seconds. Raises SglangRefused with SGLang's last error line when the server does not start."""
        self._stop()
        unknown = [key for key in (engine_args or {}) if key not in FLAGS]
        if unknown:
            raise ValueError(f"engine argument {unknown[0]!r} is not one SGLang takes ({', '.join(FLAGS)})")
        port = _free_port()
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        environ.update(HF_HUB_OFFLINE=environ.get("HF_HUB_OFFLINE", "1"), TOKENIZERS_PARALLELISM="false",
                       **(CPU_ENV if self.device == "cpu" else {}), **(env or {}))
        args = server_args(folder, context_length, port, override_args=override_args, engine_args=engine_args,
                           device=self.device, chunked_prefill_size=chunked_prefill_size)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {self.env.python} {' '.join(args)}\n".encode())
        started = time.perf_counter()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(self.env.python), *args], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=environ,
                                     cwd=tempfile.gettempdir(), start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        while True:
            if self.proc.poll() is not None:
                self._stop()
                raise SglangRefused(self._why_it_stopped())
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.perf_counter() - started > START_TIMEOUT:
                self._stop()
                raise SglangError(f"the SGLang server did not answer /health in {START_TIMEOUT:.0f} s{self._tail()}")
            time.sleep(0.5)
        return time.perf_counter() - started

    def _generate(self, ids: list[int], max_new_tokens: int, logprobs: bool) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise SglangError(f"no SGLang server is running (load a checkpoint first){self._tail()}")
        body = {"input_ids": [int(i) for i in ids],
                "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": 0.0}}
        if logprobs:
            body.update(return_logprob=True, logprob_start_len=0)
        request = urllib.request.Request(f"{self.url}/generate", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=None) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text[:1000]
            if 400 <= exc.code < 500:
                raise SglangRefused(message) from None
            raise SglangError(f"SGLang answered HTTP {exc.code}: {message}{self._tail()}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SglangError(f"the SGLang server did not answer ({exc}){self._tail()}") from None

    # --- operations (runs.EngineWorker) -------------------------------------------------------------------------------
    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(token i | tokens < i) for i = 1..n-1 of the loaded checkpoint (NaN where SGLang gives none)."""
        values = self._generate(ids, 1, logprobs=True)["meta_info"]["input_token_logprobs"]
        return [math.nan if v[0] is None else float(v[0]) for v in values[1:]]

    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `ids` (token ids, at most `max_tokens`; SGLang stops at the model's EOS)."""
        return [int(t) for t in self._generate(ids, max_tokens, logprobs=False)["output_ids"]]

    def close(self, now: bool = False) -> None:
        self._stop(now)

    def __enter__(self) -> SglangWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the run-engine adapter ------------------------------------------------------------------------------------------
class SglangRun:
    """SGLang as a run engine (`rope_extend.engines.runs.RunEngine`): the adapter of the `sglang` room."""

    runs = {"sglang": "server"}
    eval_route = "server"
    options = tuple(FLAGS)

    def __init__(self, room: ServingEngine):
        self.room = room  # its rules and port: the card routes it serves, the checks before anything loads
        self.name, self.title = room.name, room.title


    def environment_label(self) -> str:
        return ensure_sglang().label

    def card_routes(self, hint: EngineHint) -> list[Route]:
        return card_routes(hint)

    def eval_serving(self, plan: PatchPlan | None, original_config: dict, max_len: int, lengths) -> EvalServing:
        """The original model served with plan's method and --context-length max_len (the card's overrides),
        checked through the SGLang port at every request length (positions 0..n-1) against rope-extend's own RoPE."""
        overrides = None if plan is None else card_settings(self.room, plan, original_config).override_args
        fields, rope = port.load_config(original_config, overrides)
        settings = SglangServing(int(max_len), overrides, port.needs_longer(fields, rope, int(max_len)))
        return port_verdicts(self.room, plan, settings, original_config, lengths)

    def open(self) -> SglangWorker:
        return SglangWorker()

    def load(self, worker: SglangWorker, folder: Path, settings: SglangServing, *, route: str,
             engine_args: dict | None = None) -> float:
        """Serve `folder` with the card's settings, --context-length raised by the positions SGLang keeps back from a
        prompt (`port.RESERVED`), so that a request of the card's N tokens is accepted; SGLang's permission to exceed
        the model's window is added only where those positions alone cross it (the card's own env is kept as
        printed)."""
        if route not in ROUTES:
            raise ValueError(f"route {route!r} is not one of {', '.join(ROUTES)}")
        env = dict(settings.env)
        context = settings.context_length + port.RESERVED
        if not env:
            fields, rope = port.load_config(json.loads((Path(folder) / "config.json").read_text()),
                                            settings.override_args)
            if settings.context_length <= port.window(fields, rope) < context:
                env[port.LONGER] = "1"
        return worker.load(folder, context, override_args=settings.override_args, env=env, engine_args=engine_args,
                           chunked_prefill_size=settings.chunked_prefill_size)

    def describe(self, settings: SglangServing) -> dict:
        out = {"json_model_override_args": settings.override_args, "context_length": settings.context_length,
               "env": settings.env}
        if settings.chunked_prefill_size is not None:
            out["chunked_prefill_size"] = settings.chunked_prefill_size
        return out

