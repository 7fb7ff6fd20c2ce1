"""Serve checkpoints in a real mlx-lm, one at a time, and answer requests: runs in the MLX environment's Python, JSON
in and out.

Standalone on purpose (no rope_extend import: mlx-lm's environment has no torch): `rope_extend.engines.mlx.run`
starts `python -I worker.py` under the MLX environment's Python (`env.py`) and writes one JSON request per line on
its stdin; each request gets one JSON line back on the worker's stdout (everything else goes to stderr).

A checkpoint is loaded as `mlx_lm.load(FOLDER, model_config=...)` loads it (the card's Python route; `mlx_lm.generate
--model FOLDER` and `mlx_lm.server --model FOLDER` call the same `load` with no model_config), in float32
(`model.set_dtype(mx.float32)`), and every request runs through mlx-lm's own `generate_step` (mlx_lm/generate.py),
the loop behind `mlx_lm.generate` and `mlx_lm.stream_generate`: the prompt but its last token prefilled in chunks of
`prefill_step_size` tokens into a fresh KV cache, then the last token, then one token per step. For prompt
log-probabilities the model is wrapped so that every forward call `generate_step` makes hands its logits over: the
log-probability of each next prompt token is taken from the chunk that computed it, so a RoPE that depends on the
chunk (dynamic NTK: mlx-lm scales it by each call's last position) is measured as the command serves it.

Requests:
  {"op": "load", "model": DIR, "model_config": {...} | null, "prefill_step": N}  -> {"seconds", "rope", "device"}
  {"op": "prompt_logprobs", "prompt": [ids]}          -> {"logprobs": [null, lp_1, ..., lp_{n-1}], "calls": the
                                                          (offset, tokens) of each forward call generate_step made}
  {"op": "generate", "prompt": [ids], "max_tokens": k} -> {"token_ids": [...]} (greedy; stops before an EOS token,
                                                          as mlx_lm.generate does)
  {"op": "rope", "config": {...}, "model_config": {...} | null, "n": N, "prefill_step": S, "positions": [...]}
      -> {"cos": [[...]], "sin": [[...]], "calls": [[offset, length], ...], "rope": class name}: mlx-lm's own RoPE
      module for that config (built by its llama model from the config as `load` reads it) applied the way
      `generate_step` applies it to a request of N tokens (its N - 1 prompt tokens, then the generated one), read
      back at `positions`: the port's check (tests/test_mlx_engine.py).
  {"op": "quit"}
Every reply is {"ok": true, ...} or {"ok": false, "error": "Type: message"}: what mlx-lm raised (a refused config is
a result, not a failure of the worker).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _error(exc: BaseException) -> dict:
    return {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]}"}


class Capture:
    """The model as `generate_step` calls it, recording the log-probability of each next prompt token from the
    logits of the call that computed it (`targets`: the prompt's token ids; the call's positions follow on from the
    previous calls')."""

    def __init__(self, model, targets: list[int]):
        self.model, self.targets, self.offset, self.logprobs, self.calls = model, targets, 0, [], []

    def __getattr__(self, name):  # make_cache, layers, ...: the model's
        return getattr(self.model, name)

    def __call__(self, inputs, cache=None, **kwargs):
        import mlx.core as mx

        logits = self.model(inputs, cache=cache, **kwargs)
        length = inputs.shape[1]
        self.calls.append((self.offset, length))
        want = self.targets[self.offset + 1: self.offset + length + 1]  # the tokens these positions predict
        if want:
            rows = logits[0, : len(want)].astype(mx.float32)
            picked = mx.take_along_axis(rows, mx.array(want)[:, None], axis=-1)[:, 0] - mx.logsumexp(rows, axis=-1)
            mx.eval(picked)
            self.logprobs += picked.tolist()
        self.offset += length
        return logits


class Served:
    """One checkpoint loaded with mlx-lm."""

    def __init__(self, request: dict):
        import mlx.core as mx
        from mlx_lm import load

        self.model, self.tokenizer = load(request["model"], model_config=request.get("model_config") or None)
        self.model.set_dtype(mx.float32)
        self.prefill_step = int(request["prefill_step"])
        self.rope = type(self.model.layers[0].self_attn.rope).__name__ if hasattr(self.model, "layers") else "?"

    def prompt_logprobs(self, prompt: list[int]) -> list:
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        capture = Capture(self.model, prompt)
        for _ in generate_step(mx.array(prompt), capture, max_tokens=0, prefill_step_size=self.prefill_step):
            pass  # max_tokens=0: the prefill and the last prompt token's step only
        self.calls = capture.calls
        return [None, *capture.logprobs[: len(prompt) - 1]]

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        out, eos = [], set(self.tokenizer.eos_token_ids)
        for token, _ in generate_step(mx.array(prompt), self.model, max_tokens=max_tokens,
                                      prefill_step_size=self.prefill_step):
            if token in eos:  # mlx_lm.stream_generate stops before an EOS token
                break
            out.append(int(token))
        return out


def rope_probe(request: dict) -> dict:
    """mlx-lm's RoPE module for a config, applied as `generate_step` applies it to a request of n tokens; cos and sin
    (magnitude included) read back at `positions` by rotating the unit vectors (1, 0) of every rotary pair."""
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import _get_classes

    config = dict(request["config"])
    config.update(request.get("model_config") or {})  # mlx_lm.utils.load_model: config.update(model_config)
    config.update(num_hidden_layers=1, vocab_size=64, intermediate_size=64)  # a small model; its RoPE is the config's
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    attention = model.layers[0].self_attn
    rope, dims = attention.rope, attention.head_dim
    calls = []

    class Recorder(nn.Module):
        def __call__(self, x, offset=0):
            if not calls or calls[-1][0] != offset:  # queries then keys: one call each
                calls.append((int(offset), int(x.shape[-2])))
            return rope(x, offset=offset)

    attention.rope = Recorder()
    n = int(request["n"])
    prompt = mx.array(np.arange(n - 1) % 64)
    for _ in generate_step(prompt, model, max_tokens=1, prefill_step_size=int(request["prefill_step"])):
        pass  # the prompt's chunks, its last token, then the generated token (position n - 1)
    half = dims // 2
    cos = np.zeros((n, half))
    sin = np.zeros((n, half))
    for offset, length in calls:  # each call's rotation at its positions, as the call computed it
        unit = mx.concatenate([mx.ones((1, 1, length, half)), mx.zeros((1, 1, length, dims - half))], axis=-1)
        out = np.array(rope(unit, offset=offset).astype(mx.float32))[0, 0]
        cos[offset: offset + length] = out[:, :half]
        sin[offset: offset + length] = out[:, half:]
    at = request["positions"]
    return {"cos": cos[at].tolist(), "sin": sin[at].tolist(), "calls": calls, "rope": type(rope).__name__}


def serve(requests, reply) -> None:
    """Answer each request (a dict) with reply(dict) until "quit" or the end of input."""
    import mlx.core as mx

    served = None
    for request in requests:
        op = request.get("op")
        try:
            if op == "quit":
                reply({"ok": True})
                return
            if op == "load":
                served = None
                started = time.perf_counter()
                served = Served(request)
                reply({"ok": True, "seconds": round(time.perf_counter() - started, 2), "rope": served.rope,
                       "device": str(mx.default_device())})
            elif op == "rope":
                reply({"ok": True, **rope_probe(request)})
            elif served is None:
                reply({"ok": False, "error": f"RuntimeError: {op!r} before a successful load"})
            elif op == "prompt_logprobs":
                started = time.perf_counter()
                logprobs = served.prompt_logprobs(request["prompt"])
                reply({"ok": True, "logprobs": logprobs, "calls": served.calls,
                       "seconds": round(time.perf_counter() - started, 2)})
            elif op == "generate":
                started = time.perf_counter()
                tokens = served.generate(request["prompt"], int(request["max_tokens"]))
                reply({"ok": True, "token_ids": tokens, "seconds": round(time.perf_counter() - started, 2)})
            else:
                reply({"ok": False, "error": f"ValueError: unknown op {op!r}"})
        except Exception as exc:  # reported to the caller: a refusal by mlx-lm is a result
            traceback.print_exc(file=sys.stderr)
            reply(_error(exc))


def main() -> None:
    # The protocol owns the original stdout; anything else printing to fd 1 goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    import mlx.core as mx
    import mlx_lm

    reply({"ok": True, "ready": True, "mlx_lm": mlx_lm.__version__, "mlx": mx.__version__,
           "device": "gpu" if mx.default_device() == mx.gpu else "cpu", "python": sys.version.split()[0]})
    serve((json.loads(line) for line in sys.stdin if line.strip()), reply)


if __name__ == "__main__":
    main()
