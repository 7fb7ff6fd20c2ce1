"""Serve checkpoints in a real vLLM, one at a time, and answer requests: runs in vLLM's own Python, JSON in and out.

Standalone on purpose (no rope_extend import: vLLM pins another transformers): `rope_extend.engines.vllm.run`
starts `python -I worker.py` under the vLLM environment's Python and writes one JSON request per line on its
stdin; each request gets one JSON line back on the worker's stdout (everything else the worker or vLLM prints goes
to stderr). One worker serves many checkpoints in turn, so vLLM is imported once.

Two routes, the same operations:
- `offline`: `vllm.LLM(...)` in this process, its engine core in-process too (VLLM_ENABLE_V1_MULTIPROCESSING=0,
  the uni executor: one process on the CPU, no spawned workers, a few seconds per start);
- `server`: `vllm serve MODEL ...` as users start it (the `vllm` command beside this Python), a subprocess on a
  free port, queried with the `openai` client (completions with `echo` and `logprobs` for prompt
  log-probabilities), stopped with SIGTERM (SIGKILL after 60 s).

Requests:
  {"op": "load", "route": "offline" | "server", "model": DIR, "max_model_len": N, "hf_overrides": {...} | null,
   "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", ...}, "engine_args": {"tensor_parallel_size": 2, ...}}
  {"op": "prompt_logprobs", "prompt": [ids]}     -> {"logprobs": [null, lp_1, ..., lp_{n-1}]}  (NaN stays NaN)
  {"op": "generate", "prompt": [ids], "max_tokens": k}   -> {"token_ids": [...]} (greedy)
  {"op": "unload"}, {"op": "quit"}
Every reply is {"ok": true, ...} or {"ok": false, "error": "Type: message"}: what vLLM raised (a refused request is
a result, not a failure of the worker).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback

SERVER_START_TIMEOUT = 900  # seconds: a loaded 2-core machine starts the server in 1-2 minutes
SERVED_NAME = "checkpoint"


def _error(exc: BaseException) -> dict:
    return {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]}"}


class Offline:
    """`vllm.LLM` in this process."""

    route = "offline"

    def __init__(self, request: dict):
        import vllm
        from vllm import envs

        envs.disable_envs_cache()  # the engine caches environment variables once started; this load sets its own
        args = dict(request.get("engine_args", {}))
        parallel = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
        args.setdefault("distributed_executor_backend", "uni" if parallel == 1 else "mp")  # one process on one device
        self.llm = vllm.LLM(
            model=request["model"],
            max_model_len=int(request["max_model_len"]),
            hf_overrides=request.get("hf_overrides") or None,
            dtype=request.get("dtype", "float32"),
            enforce_eager=True,
            seed=0,
            **args,
        )

    def prompt_logprobs(self, prompt: list[int]) -> list:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
        out = self.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        return [None if d is None else d[prompt[i]].logprob for i, d in enumerate(out.prompt_logprobs)]

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        out = self.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        return list(out.outputs[0].token_ids)

    def close(self) -> None:
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(request: dict, port: int) -> list[str]:
    """The `vllm serve` arguments of a load request (the model first, as `vllm serve MODEL` takes it)."""
    args = [request["model"], "--max-model-len", str(int(request["max_model_len"])),
            "--dtype", request.get("dtype", "float32"), "--enforce-eager", "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME]
    if request.get("hf_overrides"):
        args += ["--hf-overrides", json.dumps(request["hf_overrides"], separators=(",", ":"))]
    for key, value in request.get("engine_args", {}).items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


class Server:
    """The OpenAI-compatible server in a subprocess, queried with the `openai` client."""

    route = "server"

    def __init__(self, request: dict):
        import openai

        port = _free_port()
        vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
        self.command = [vllm, "serve", *server_args(request, port)]
        env = dict(os.environ, **request.get("env", {}))
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server as users run it
        self.proc = subprocess.Popen(self.command, stdout=sys.stderr, stderr=sys.stderr, env=env,
                                     start_new_session=True)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                    timeout=3600)
        self._wait(port)

    def _wait(self, port: int) -> None:
        import urllib.request

        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with status {self.proc.returncode} while starting "
                                   f"(its log is on stderr): {' '.join(self.command)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the vLLM server did not answer /health within {SERVER_START_TIMEOUT} s")
            time.sleep(0.5)

    def prompt_logprobs(self, prompt: list[int]) -> list:
        r = self.client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=1, echo=True, logprobs=0,
                                           temperature=0)
        values = r.choices[0].logprobs.token_logprobs[: len(prompt)]  # the echoed prompt, then the new token
        return [None if i == 0 else (float("nan") if v is None else v) for i, v in enumerate(values)]

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        r = self.client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           extra_body={"return_token_ids": True})
        return list(r.choices[0].model_extra["token_ids"])

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


ROUTES = {"offline": Offline, "server": Server}


def _restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def serve(requests, reply) -> None:
    """Answer each request (a dict) with reply(dict) until "quit" or the end of input."""
    engine, env_set = None, {}
    try:
        for request in requests:
            op = request.get("op")
            try:
                if op == "quit":
                    reply({"ok": True})
                    return
                if op in ("load", "unload") and engine is not None:
                    engine.close()
                    engine = None
                if op == "load":
                    _restore(env_set)  # the previous load's variables, as they were before it
                    env_set = {key: os.environ.get(key) for key in request.get("env", {})}
                    os.environ.update(request.get("env", {}))
                    started = time.perf_counter()
                    engine = ROUTES[request["route"]](request)
                    reply({"ok": True, "seconds": round(time.perf_counter() - started, 2)})
                elif op == "unload":
                    reply({"ok": True})
                elif engine is None:
                    reply({"ok": False, "error": f"RuntimeError: {op!r} before a successful load"})
                elif op == "prompt_logprobs":
                    started = time.perf_counter()
                    logprobs = engine.prompt_logprobs(request["prompt"])
                    reply({"ok": True, "logprobs": logprobs, "seconds": round(time.perf_counter() - started, 2)})
                elif op == "generate":
                    started = time.perf_counter()
                    tokens = engine.generate(request["prompt"], int(request["max_tokens"]))
                    reply({"ok": True, "token_ids": tokens, "seconds": round(time.perf_counter() - started, 2)})
                else:
                    reply({"ok": False, "error": f"ValueError: unknown op {op!r}"})
            except Exception as exc:  # reported to the caller: a refusal by vLLM is a result
                traceback.print_exc(file=sys.stderr)
                reply(_error(exc))
    finally:
        if engine is not None:
            engine.close()


def main() -> None:
    # The protocol owns the original stdout; anything else printing to fd 1 (vLLM, its children) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    def stop(signum, frame):  # the client ends the worker at once (an interrupt): serve's finally closes the engine
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    import vllm
    from vllm.platforms import current_platform

    reply({"ok": True, "ready": True, "vllm": vllm.__version__, "device": str(current_platform.device_type),
           "python": sys.version.split()[0]})
    serve((json.loads(line) for line in sys.stdin if line.strip()), reply)
    # The engine is shut down (serve's finally); skip the interpreter's teardown of vLLM and torch (atexit hooks,
    # thread joins: seconds, for nothing left to save).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # vLLM may start processes with spawn: nothing runs on import
    main()
