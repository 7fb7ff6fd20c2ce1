"""Helpers the test modules share, so that no test module imports another: the attention-level methods'
independent references (the papers' formulas, scored in float64) and tiny patched models, random attention inputs,
the training runs' source and arguments, a small GGUF. Fixtures shared by several modules are in conftest.py."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import tiny
import torch

from rope_extend import patch_model
from rope_extend.attention.maps import DualChunkMap, SelfExtendMap, StringMap
from rope_extend.compat import EAGER_THROUGH_ATTENTION_REGISTRY, GENERATE_CACHE_KEYWORD
from rope_extend.engines import engine_env as _engine_env
from rope_extend.engines.registry import get_engine
from rope_extend.engines.sglang import run as _sglang_run
from rope_extend.engines.vllm import run as _vllm_run
from rope_extend.engines.vllm import worker as _vllm_worker
from rope_extend.engines.written import Written

ROOT = Path(__file__).resolve().parents[1]

# transformers 4.x and 5.0 call their eager attention directly (refused, see test_refusals_name_why): SDPA only there
IMPLS = ["eager", "sdpa"] if EAGER_THROUGH_ATTENTION_REGISTRY else ["sdpa"]


# --- the papers' formulas, one pair at a time -------------------------------------------------------------------------
def self_extend_distance(i: int, j: int, group: int, window: int) -> int:
    """LongLM: neighbour tokens keep their distance; the rest use floor-divided positions, the query's shifted by
    W - W // G."""
    if i - j < window:
        return i - j
    return (i // group + window - window // group) - j // group


def dual_chunk_distance(i: int, j: int, chunk_size: int, local_window: int) -> int:
    """ChunkLlama: key position j mod s; query position t (same chunk), min(t + s, c) (previous chunk), c (older)."""
    s = chunk_size - local_window
    t, key = i % s, j % s
    if i // s == j // s:
        return t - key
    if i // s == j // s + 1:
        return min(t + s, chunk_size) - key
    return chunk_size - key


def string_distance(i: int, j: int, shifted_offset: int, local_value: int) -> int:
    """STRING (An et al. 2025): a distance d = i - j below S is kept; d >= S becomes d - S + W."""
    d = i - j
    return d if d < shifted_offset else d - shifted_offset + local_value


def distances(fn, q_pos: list[int], k_pos: list[int], *params) -> torch.Tensor:
    return torch.tensor([[fn(i, j, *params) for j in k_pos] for i in q_pos], dtype=torch.float64)


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half RoPE at positions pos [B, n] on the first 2·len(inv_freq) dims."""
    rdim = 2 * inv_freq.numel()
    angles = pos.double()[..., None] * inv_freq.double()
    cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
    xr = x[..., :rdim].double()
    half = torch.cat((-xr[..., rdim // 2 :], xr[..., : rdim // 2]), -1)
    return torch.cat(((xr * cos + half * sin), x[..., rdim:].double()), -1).to(x.dtype)


def pair_scores(q: torch.Tensor, k: torch.Tensor, dist: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE scores of un-rotated q [q, D] and k [k, D] at the given distances [q, k] (float64)."""
    F = inv_freq.numel()
    zq = torch.complex(q[:, :F].double(), q[:, F : 2 * F].double())
    zk = torch.complex(k[:, :F].double(), k[:, F : 2 * F].double())
    phase = torch.exp(1j * dist[..., None] * inv_freq.double())
    rotary = (zq[:, None, :] * zk.conj()[None, :, :] * phase).real.sum(-1)
    return rotary + q[:, 2 * F :].double() @ k[:, 2 * F :].double().T


def reference_attention(q_raw, k_raw, v, q_pos, k_pos, allowed, scaling, dist_fn, params, inv_freq,
                        softcap=None, log_n_original=None):
    """Naive attention: [B, Hq, q, D] un-rotated inputs, per-row positions, allowed [B, q, k] -> [B, q, Hq, Dv]."""
    B, H, nq, _ = q_raw.shape
    rep = H // k_raw.shape[1]
    out = torch.zeros(B, nq, H, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        dist = distances(dist_fn, q_pos[b].tolist(), k_pos[b].tolist(), *params)
        for h in range(H):
            s = pair_scores(q_raw[b, h], k_raw[b, h // rep], dist, inv_freq) * scaling
            if log_n_original:
                s = s * torch.tensor([max(1.0, math.log(p + 1) / math.log(log_n_original)) for p in q_pos[b].tolist()],
                                     dtype=torch.float64)[:, None]
            if softcap:
                s = torch.tanh(s / softcap) * softcap
            s = s.masked_fill(~allowed[b], float("-inf"))
            out[b, :, h] = torch.softmax(s, -1) @ v[b, h // rep].double()
    return out


CASES = [
    (SelfExtendMap(2, 4), self_extend_distance, (2, 4)),
    (SelfExtendMap(3, 8), self_extend_distance, (3, 8)),
    (SelfExtendMap(4, 6), self_extend_distance, (4, 6)),  # G does not divide W
    (DualChunkMap(12, 4), dual_chunk_distance, (12, 4)),
    (DualChunkMap(10, 7), dual_chunk_distance, (10, 7)),  # local window longer than the chunk length 3
    (DualChunkMap(16, 1), dual_chunk_distance, (16, 1)),
    (StringMap(12, 4), string_distance, (12, 4)),  # STRING (tests/test_string.py has its own)
]


def case_id(case):
    return f"{type(case[0]).__name__}{case[2]}"


# --- whole models ---------------------------------------------------------------------------------------------------------
SPECS = {
    "self-extend": {"method": "self-extend", "group_size": 4, "neighbor_window": 8},
    # the position map alone: the length scale (default 0.05) makes pieces differ from one forward by design (the
    # authors' decode takes the length so far); tests/test_authors_ports.py pins it against their code
    "dual-chunk": {"method": "dual-chunk", "chunk_size": 20, "local_window": 6, "length_scale": 0.0},
}
WINDOW = {"self-extend": 8, "dual-chunk": 14}  # below these lengths the model is the original


def make(arch: str, impl: str | None = None):
    model = tiny.make_model(arch)
    if (impl or IMPLS[0]) != "eager":
        model.set_attn_implementation(impl or IMPLS[0])
    return model


def cache_kwargs(cache) -> dict:
    return {GENERATE_CACHE_KEYWORD: cache, "use_cache": True}


def patched_model(arch: str, method: str, impl: str | None = None, **extra):
    model = make(arch, impl)
    patch_model(model, **{**SPECS[method], "factor": 3, **extra})
    return model


def generate_alone_and_after_a_shared_prefix(model, n: int, shared: int, new_tokens: int, before_reuse=None):
    """(generate() on a second n-token prompt from scratch, the same after generate() on a first prompt that shares
    its first `shared` tokens, the cache cropped back to them), under inference_mode as the eval's probes run."""
    from transformers import DynamicCache

    first, second = tiny.input_ids(n, seed=5), tiny.input_ids(n, seed=5).clone()
    second[0, shared:] = tiny.input_ids(n - shared, seed=6)[0]
    settings = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    with torch.inference_mode():
        alone = model.generate(second, attention_mask=torch.ones_like(second), **settings)
        cache = DynamicCache(config=model.config)
        model.generate(first, attention_mask=torch.ones_like(first), **cache_kwargs(cache), **settings)
        cache.crop(shared - cache.get_seq_length())
        if before_reuse is not None:
            before_reuse()
        reused = model.generate(second, attention_mask=torch.ones_like(second), **cache_kwargs(cache), **settings)
    return alone, reused


# --- random attention inputs ------------------------------------------------------------------------------------------
def attention_inputs(B, H, Hkv, D, rdim, n_q, n_k, start, seed):
    generator = torch.Generator().manual_seed(seed)
    q_raw = torch.randn(B, H, n_q, D, generator=generator)
    k_raw = torch.randn(B, Hkv, n_k, D, generator=generator)
    v = torch.randn(B, Hkv, n_k, D, generator=generator)
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, rdim, 2).double() / rdim))
    k_pos = (torch.arange(n_k) + start)[None].repeat(B, 1)
    q_pos = k_pos[:, n_k - n_q :]
    return q_raw, k_raw, v, q_pos, k_pos, inv_freq


# --- training runs (tests/test_train.py, tests/test_train_progress.py) ------------------------------------------------
STEPS = 6


def toy_text(words: int = 2400) -> str:
    """A learnable text: a fixed cycle of 60 words (the next word is determined by the previous two)."""
    vocab = [f"w{i:02d}" for i in range(60)]
    return " ".join(vocab[i % 60] for i in range(words)) + "\n"


def train_argv(source: Path, text: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
            "--steps", str(STEPS), "--batch-tokens", "64", "--lr", "3e-3", "--warmup", "0", "--save-steps", "1",
            "-o", str(out), *extra]


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# --- a small GGUF -----------------------------------------------------------------------------------------------------
HEAD_DIM, N_HEAD, N_CTX, BASE = 64, 4, 8192, 100000.0


def write_tiny_gguf(path: Path, arch: str = "llama", extra: dict | None = None, tensors: dict | None = None) -> Path:
    """A small model-shaped GGUF (random F32/F16 tensors, a few metadata keys)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(HEAD_DIM * N_HEAD)
    writer.add_head_count(N_HEAD)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(BASE)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    for key, value in (extra or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32)
    rng = np.random.default_rng(0)
    tensors = tensors or {
        "token_embd.weight": rng.standard_normal((3, HEAD_DIM * N_HEAD)).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((HEAD_DIM * N_HEAD, 7)).astype(np.float16),  # odd size: padding
        "output_norm.weight": rng.standard_normal(HEAD_DIM * N_HEAD).astype(np.float32),
    }
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- the memory a machine reports (tests/test_memory.py, tests/test_sources.py) ----------------------------------------
GiB = 1 << 30


def fake_memory(monkeypatch, tmp_path: Path, available: int, cgroup_limit: int | None = None) -> None:
    """/proc/meminfo and the cgroup files as the kernel writes them, with `available` bytes MemAvailable."""
    from rope_extend import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       24576000 kB\nMemFree:         1000000 kB\n"
                       f"MemAvailable:   {available // 1024:8d} kB\nBuffers:          100000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir(exist_ok=True)
    if cgroup_limit is not None:
        (cgroup / "memory.max").write_text(f"{cgroup_limit}\n")
        (cgroup / "memory.current").write_text(f"{GiB}\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "CGROUP", cgroup)


# --- run engines (tests/test_vllm_engine.py, tests/test_sglang_engine.py, tests/test_run_engines.py) -------------------
# The adapters come from the registry (`rope_extend.engines.runs.lookup`), the session's workers from conftest.py;
# what is an engine module's own is named here only, the one place to edit when those modules move.
VllmRefused = _vllm_run.VllmRefused  # vLLM's refusal (a runs.EngineRefused)
kv_cache_bytes = _vllm_run.kv_cache_bytes  # the KV cache the vLLM adapter sizes for one request
vllm_server_args = _vllm_worker.server_args  # `vllm serve`'s argument list, as the worker builds it
SglangRefused = _sglang_run.SglangRefused  # SGLang's refusal (a runs.EngineRefused)
sglang_server_args = _sglang_run.server_args  # `python -m sglang.launch_server`'s argument list


def sglang_serving_rule(plan):
    """The SGLang room's hint for `plan`: the card's command and its routes (this checkpoint, the original model
    with the overrides)."""
    return get_engine("sglang").hint(Written.of(plan))


class BorrowedWorker:
    """A session's engine worker lent to code that would start (and close) its own; counts the loads it serves."""

    def __init__(self, worker):
        self.worker, self.loads = worker, 0

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def load(self, *args, **kwargs):
        self.loads += 1
        return self.worker.load(*args, **kwargs)

    def close(self, now: bool = False) -> None:
        pass


# The quick suite's sections at the 2-layer model's scale (window 256): what `eval --engine` is checked on.
ENGINE_SUITE = {
    "name": "engine-parity",
    "seed": 0,
    "short_context": [128],
    "perplexity": {"text": "pydoc_topics", "lengths": [200, "2x"], "bucket_size": 128, "chunk_size": 128},
    "passkey": {"lengths": ["1.25x"], "depths": [0.5], "samples": 1},
    "needle": {"tasks": ["niah_single"], "lengths": [], "depths": [0.5], "samples": 1},
}


def assert_engine_eval_matches(got: list, want: list, run: dict, engine: str, window: int) -> None:
    """`eval --engine E`'s records `got` against transformers' `want` on ENGINE_SUITE: `run.json` names the engine
    (`engine`, its label's start), the unpatched model's cases beyond its window are left out (said in run.json),
    every perplexity within 1e-3 (relative), every probe answer the same text, and a case beyond the window ran."""
    theirs = {(r["variant"], r["case_id"]): r for r in want}
    assert run["engine"].startswith(engine)
    assert "unpatched" in run["left_out"] and str(window) in run["left_out"]["unpatched"]
    left = {(r["variant"], r["case_id"]) for r in want} - {(r["variant"], r["case_id"]) for r in got}
    # beyond the window: a perplexity text longer than it, a probe whose answer runs past its last position
    assert left and all(v == "unpatched" and theirs[(v, c)]["length"] >= window for v, c in left)
    assert_records_match(got, want)
    assert any(r["length"] == 2 * window for r in got)  # beyond the window, for the methods


def assert_records_match(got: list, want: list) -> None:
    """Each of an engine's eval records `got` against transformers' record of the same variant and case in `want`:
    perplexity within 1e-3 (relative), every probe answer the same text; ENGINE_SUITE's three kinds all ran."""
    import pytest

    theirs = {(r["variant"], r["case_id"]): r for r in want}
    for r in got:
        other = theirs[(r["variant"], r["case_id"])]
        if r["kind"] == "perplexity":
            assert r["metrics"]["ppl"] == pytest.approx(other["metrics"]["ppl"], rel=1e-3), r["case_id"]
        else:
            assert r["metrics"]["output"] == other["metrics"]["output"], (r["variant"], r["case_id"])
    assert {r["kind"] for r in got} == {"perplexity", "passkey", "niah_single"}


# --- a virtualenv built once per machine (tests/test_gpu_bundle.py) ---------------------------------------------------
def cached_venv(name: str, requirements: list[str], module: str) -> Path:
    """A virtualenv holding `requirements` and what they require, built once per machine as the engines'
    environments are (`rope_extend.engines.engine_env`: one builder at a time, versions.json written last, a build
    without it redone from scratch) in $ROPE_EXTEND_CACHE/NAME-<key>, the key a hash of the requirements and this
    Python's version, and reused while both are the same; `import module` is its check. Returns its Python. A test
    never installs into it (its installs go to a --prefix of their own)."""
    import hashlib
    import json
    import sys

    from rope_extend.demo_model import cache_root

    key = hashlib.sha256(json.dumps([sys.version, sorted(requirements)]).encode()).hexdigest()[:12]
    root = cache_root() / f"{name}-{key}"
    with _engine_env.locked(root):
        if _engine_env.read_stamp(root) is None:
            python = _engine_env.create_venv(root)
            _engine_env.pip(root, "install", *requirements)
            _engine_env.write_stamp(root, {"requirements": sorted(requirements), "python": sys.version,
                                           "versions": _engine_env.installed_versions(python, module)})
    return root / "bin" / "python"


# --- llama.cpp against transformers (tests/test_gguf_llamacpp.py; its long run: tests/checks/) -----------------------
# Perplexity of the second half of a ctx-token window (what `llama-perplexity -c ctx --chunks 1` scores), the same
# tokens on both sides (llama.cpp's own tokenisation fed to transformers).
F32_TOLERANCE = 0.01  # llama.cpp on an f32 GGUF vs transformers fp32: relative perplexity difference
Q4_TOLERANCE = 0.02  # a Q4_1 GGUF (llama.cpp's quantised dot products) vs transformers on its dequantised weights
ROUTE_TOLERANCE = 1e-3  # ntk's printed flag rounds the base to 6 digits: 204522 vs 204522.28 (5e-6 relative)
GGUF_SPECS = {
    "yarn": {"method": "yarn", "factor": 2},
    "llama3": {"method": "llama3", "factor": 2},
    "ntk": {"method": "ntk", "factor": 2},
}


def transformers4_python() -> str:
    """An interpreter with transformers 4.x for convert_hf_to_gguf.py (ROPE_EXTEND_OTHER_PYTHON or this one)."""
    import subprocess
    import sys

    import pytest

    for python in (os.environ.get("ROPE_EXTEND_OTHER_PYTHON"), sys.executable):
        if not python:
            continue
        proc = subprocess.run([python, "-c", "import transformers, sentencepiece; print(transformers.__version__)"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip().startswith("4."):
            return python
    pytest.fail("convert_hf_to_gguf.py needs transformers 4.x with sentencepiece: set ROPE_EXTEND_OTHER_PYTHON to "
                "such an interpreter (make test does: .venv4)")


def printed_llamacpp_flags(hf_dir: Path, spec: dict) -> list[str]:
    """The llama.cpp flags in the serving hints `rope-extend patch` prints for this spec."""
    import re

    from rope_extend.engines.serving import serving_hints
    from rope_extend.files import load_config
    from rope_extend.plan import plan_patch

    text, _ = serving_hints(plan_patch(load_config(hf_dir), spec), "out")
    match = re.search(r"llama-server -m \S+ -c \d+ ([^`]*)`", text)
    assert match, f"no llama.cpp command in the serving hints:\n{text}"
    return match.group(1).split()


def assert_close(llamacpp_ppl: float, transformers_ppl: float, tolerance: float) -> None:
    diff = abs(llamacpp_ppl - transformers_ppl) / transformers_ppl
    assert diff < tolerance, f"llama.cpp {llamacpp_ppl:.4f} vs transformers {transformers_ppl:.4f}: {100 * diff:.2f}%"


def assert_far(patched_ppl: float, unpatched_ppl: float, margin: float) -> None:
    """The window tells the method from no scaling (else an engine that ignored the scaling would pass)."""
    diff = abs(patched_ppl - unpatched_ppl) / patched_ppl
    assert diff > margin, f"patched {patched_ppl:.4f} vs unpatched {unpatched_ppl:.4f}: {100 * diff:.2f}% < {100 * margin}%"


LLAMACPP_TOP = 32  # the tokens per position compared with transformers: llama.cpp's most likely ones


def read_llamacpp_logprobs(path: Path, top: int = LLAMACPP_TOP):
    """The file `llama-perplexity --kl-divergence-base FILE` saves (tools/perplexity/perplexity.cpp): "_logits_",
    n_ctx, n_vocab, n_chunk (int32), the chunks' token ids (int32), then for each scored position of each chunk the
    log-softmax over the vocabulary as uint16 (a float32 scale and minimum first, then n_vocab values, padded to an
    even count + 4): log p = minimum + scale x value, to (max logit - min logit) / 65535 <= 2.4e-4 nats, and clipped
    at 16 nats below the most likely token (the next token of a model cut to 2 layers often lies below, so it is
    not what is compared). Returns the first chunk's token ids, and for every scored position (n_ctx/2 .. n_ctx - 2)
    the ids of its `top` most likely next tokens and their log-probabilities ([positions, top] arrays; NaN where
    clipped)."""
    import numpy as np

    data = Path(path).read_bytes()
    assert data[:8] == b"_logits_", f"{path} is not a llama-perplexity logits file"
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(data, "<i4", 3, 8))
    tokens = np.frombuffer(data, "<i4", n_chunk * n_ctx, 20)[:n_ctx]
    first, nv = n_ctx // 2, 2 * ((n_vocab + 1) // 2) + 4
    rows = np.frombuffer(data, "<u2", (n_ctx - 1 - first) * nv, 20 + 4 * n_chunk * n_ctx).reshape(-1, nv)
    head = rows[:, :4].copy().view("<f4")  # scale, minimum log p
    values = rows[:, 4: 4 + n_vocab]
    ids = np.argsort(-values.astype(np.int32), axis=1, kind="stable")[:, :top]
    kept = np.take_along_axis(values, ids, 1)
    logp = head[:, 1:2].astype(np.float64) + head[:, 0:1] * kept
    logp[kept == 0] = np.nan  # clipped: at least 16 nats below the most likely token
    return tokens.tolist(), ids, logp


class Parity:
    """Lazily computed, shared numbers of one model: every llama.cpp run and transformers forward happens at most
    once. `hf_dir` is the Hugging Face checkpoint, `base_gguf` where its f32 GGUF is (converted there by
    convert_hf_to_gguf.py when missing), `q4_gguf` a Q4_1 GGUF of the same weights (the Hugging Face ones are its
    dequantisation), `ctx` the window the tests score by default. With `logprobs`, llama.cpp's runs also save the
    log-probabilities of every scored position (`read_llamacpp_logprobs`; 2 bytes x the vocabulary a position, so
    for short windows only), to compare position by position with transformers' (`compare`)."""

    def __init__(self, llamacpp, hf_dir: Path, base_gguf: Path, q4_gguf: Path | None, workdir: Path, ctx: int,
                 name: str = "gguf parity", logprobs: bool = False):
        from rope_extend.eval.texts import pydoc_topics_text

        self.lc, self.hf_dir, self.f32_gguf, self.q4_gguf, self.work = llamacpp, hf_dir, base_gguf, q4_gguf, workdir
        self.ctx, self.name, self.logprobs = ctx, name, logprobs
        self.text = workdir / "pydoc_topics.txt"
        self.text.write_text(pydoc_topics_text(), encoding="utf-8")
        self.times: dict[str, float] = {}
        self._lcpp: dict[tuple[str, int], tuple[float, tuple | None]] = {}  # (route, ctx) -> ppl, (ids, log p)
        self._routes: dict[str, tuple[Path, list[str]]] = {}
        self._hf: dict[tuple[str, int], torch.Tensor] = {}  # (method, ctx) -> transformers' log p (see _forward)
        self._model = None
        self._ids = None

    # -- inputs ----------------------------------------------------------------------------------------------------
    def base_gguf(self) -> Path:
        if not self.f32_gguf.is_file():  # cached where the caller says (the demo model's: once per machine)
            self._timed("convert f32", lambda: self.lc.convert_hf_to_gguf(self.hf_dir, self.f32_gguf,
                                                                          python=transformers4_python()))
        return self.f32_gguf

    def ids(self, ctx: int | None = None) -> torch.Tensor:
        """The first ctx of llama.cpp's token ids of the text (what ``llama-perplexity -c ctx`` scores from)."""
        if self._ids is None:
            ids = self.lc.tokenize(self.base_gguf(), self.text)
            assert len(ids) >= 2 * self.ctx, f"llama-perplexity needs {2 * self.ctx} tokens, the text has {len(ids)}"
            self._ids = torch.tensor(ids[: self.ctx])
        return self._ids[: ctx or self.ctx]

    # -- llama.cpp ---------------------------------------------------------------------------------------------------
    def llamacpp(self, route: str, ctx: int | None = None) -> float:
        """llama.cpp's perplexity of `route` ("unpatched", "yarn:gguf", "ntk:flags", "llama3:convert", "yarn:q4_1")."""
        return self._llamacpp_run(route, ctx)[0]

    def compare(self, route: str, method: str, ctx: int | None = None):
        """llama.cpp running `route` against transformers running rope-extend's `method` (or "unpatched"): the
        log-probabilities of llama.cpp's LLAMACPP_TOP most likely next tokens at every scored position, by the run
        engines' rule (`runs.compare_logprobs`: identical = every one within 5e-2 nats, their mean within 1e-3)."""
        return self.compare_with(self._llamacpp_run(route, ctx)[1], method, ctx)

    def compare_with(self, llamacpp_logprobs, method: str, ctx: int | None = None):
        import numpy as np

        from rope_extend.engines.runs import compare_logprobs

        ids, logp = llamacpp_logprobs
        reference = self._forward(method, ctx).gather(1, torch.as_tensor(ids)).double().numpy()
        kept = ~np.isnan(logp)  # not clipped
        assert kept.sum() >= logp.size // 2, f"only {kept.sum()} of {logp.size} log-probabilities were saved unclipped"
        return compare_logprobs(logp[kept].tolist(), reference[kept].tolist())

    def _llamacpp_run(self, route: str, ctx: int | None) -> tuple[float, tuple | None]:
        key = (route, ctx or self.ctx)
        if key not in self._lcpp:
            model, args = self._route(route)
            self._lcpp[key] = self.llamacpp_file(model, key[1], *args, what=f"llama.cpp {self.label(*key)}")
        return self._lcpp[key]

    def llamacpp_file(self, model: Path, ctx: int | None = None, *args: str, what: str | None = None
                      ) -> tuple[float, tuple | None]:
        """llama.cpp's perplexity (and with `logprobs` the scored positions' log-probabilities: `compare_with`) of
        any GGUF file on the text."""
        import os

        ctx = ctx or self.ctx
        what = what or f"llama.cpp {Path(model).name} @{ctx}"
        saved = self.work / f".logits-{os.getpid()}.bin"
        extra = ["--kl-divergence-base", str(saved)] if self.logprobs else []
        ppl = self._timed(what, lambda: self.lc.perplexity(model, self.text, ctx, *args, *extra))
        logprobs = None
        if self.logprobs:
            tokens, *logprobs = read_llamacpp_logprobs(saved)
            saved.unlink()
            assert tokens == self.ids(ctx).tolist(), "llama-perplexity scored other tokens than llama-tokenize gave"
            logprobs = tuple(logprobs)
        self._progress(f"{what}: ppl {ppl:.4f} ({self.times[what]:.0f} s)")
        return ppl, logprobs

    def gguf_of(self, route: str) -> Path:
        """The GGUF file llama.cpp runs for `route`."""
        return self._route(route)[0]

    def _route(self, route: str) -> tuple[Path, list[str]]:
        if route not in self._routes:
            self._routes[route] = self._make_route(route)
        return self._routes[route]

    def _make_route(self, route: str) -> tuple[Path, list[str]]:
        from rope_extend.gguf.write import patch_gguf

        if route == "unpatched":
            return self.base_gguf(), []
        method, how = route.split(":")
        if how == "flags":
            return self.base_gguf(), printed_llamacpp_flags(self.hf_dir, GGUF_SPECS[method])
        if how == "gguf":
            out = self.work / f"{method}.gguf"
            patch_gguf(self.base_gguf(), GGUF_SPECS[method], out, overwrite=True)
            return out, []
        if how == "q4_1":
            out = self.work / f"{method}.Q4_1.gguf"
            patch_gguf(self.q4_gguf, GGUF_SPECS[method], out, overwrite=True)
            return out, []
        if how == "convert":
            from rope_extend.checkpoint import patch_checkpoint

            folder = self.work / f"{method}-hf"
            patch_checkpoint(self.hf_dir, GGUF_SPECS[method], folder, overwrite=True)
            out = self.work / f"{method}-converted.gguf"
            self._timed(f"convert {method}", lambda: self.lc.convert_hf_to_gguf(folder, out, python=transformers4_python()))
            return out, []
        raise ValueError(route)

    # -- transformers ------------------------------------------------------------------------------------------------
    def transformers(self, method: str, ctx: int | None = None) -> float:
        """Perplexity of tokens ctx/2+1 .. ctx-1 (llama-perplexity's scored half) with rope-extend's patch_model."""
        n = ctx or self.ctx
        rows = self._forward(method, n)
        if rows.dim() == 2:  # log-softmax rows: the next token's
            rows = rows.gather(1, self.ids(n)[n // 2 + 1:, None])[:, 0]
        return math.exp(-float(rows.double().mean()))

    def _forward(self, method: str, ctx: int | None = None) -> torch.Tensor:
        """transformers with rope-extend's `method`, on the scored positions ctx/2 .. ctx-2: with `logprobs` the
        log-softmax over the vocabulary ([positions, vocab]), else the next tokens' log p (`token_losses`)."""
        key = (method, ctx or self.ctx)
        if key not in self._hf:
            from rope_extend.eval.perplexity import token_losses
            from rope_extend.patch import unpatch_model

            model = self._load()
            unpatch_model(model)
            if method != "unpatched":
                patch_model(model, GGUF_SPECS[method])
            n, what = key[1], f"transformers {self.label(*key)}"

            def run() -> torch.Tensor:
                ids = self.ids(n)
                if not self.logprobs:
                    return -token_losses(model, ids)[n // 2: n - 1]
                with torch.no_grad():
                    logits = model(input_ids=ids[None], attention_mask=torch.ones_like(ids[None])).logits[0]
                return logits[n // 2: n - 1].float().log_softmax(-1)

            self._hf[key] = self._timed(what, run)
            self._progress(f"{what}: ppl {self.transformers(method, n):.4f} ({self.times[what]:.0f} s)")
        return self._hf[key]

    def _load(self):
        if self._model is None:
            from transformers import AutoModelForCausalLM

            from rope_extend.compat import dtype_kwargs

            self._model = AutoModelForCausalLM.from_pretrained(str(self.hf_dir), **dtype_kwargs(torch.float32)).eval()
        return self._model

    # -- reporting ---------------------------------------------------------------------------------------------------
    def label(self, name: str, ctx: int) -> str:
        """A route or method, with its window when it is not the default one."""
        return name if ctx == self.ctx else f"{name} @{ctx}"

    def _timed(self, what: str, fn):
        import time

        t0 = time.monotonic()
        result = fn()
        self.times[what] = time.monotonic() - t0
        return result

    def _progress(self, line: str) -> None:
        import sys

        print(f"[{self.name}] {line}", file=sys.__stderr__, flush=True)

    def table(self) -> str:
        rows = [f"{'route':<16} {'llama.cpp':>10} {'transformers':>12} {'diff':>8}"]
        for (route, ctx), (ppl, _) in self._lcpp.items():
            method = route.split(":")[0]
            hf = self.transformers(method, ctx) if (method, ctx) in self._hf else None
            diff = f"{100 * (ppl - hf) / hf:+.2f}%" if hf else "-"
            rows.append(f"{self.label(route, ctx):<16} {ppl:>10.4f} {hf or float('nan'):>12.4f} {diff:>8}")
        return "\n".join(rows + [f"time {what}: {seconds:.0f} s" for what, seconds in self.times.items()])


def gguf_first_layers(source: Path, out: Path, layers: int, window: int) -> Path:
    """A GGUF of `source`'s first `layers` blocks with a `window`-token context (every other key and the kept
    tensors' bytes as they are, quantised ones included), written as gguf-py's gguf_new_metadata.py copies a file:
    the GGUF twin of `eval.toy_models.short_window_demo` (the demo's Q4_1 file cut as that cuts its checkpoint)."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    changed = {f"{arch}.block_count": layers, f"{arch}.context_length": window}
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, changed.get(field.name, field.contents()), vtype, sub_type=sub_type)
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return out


# --- planted bugs in applying a plan (tests/test_eval_smollm2.py, tests/test_train_lora.py) ---------------------------
# Each makes the patch give the rotary modules other frequencies or another attention factor than the plan it made and
# checked (the plan is right, the model is not, so rope-extend's own checks of the plan pass), as a bug in applying
# it would: what the short tests must catch (each long run in tests/checks/ would too).
def _attention_factor_twice(compute, ctx):
    inv_freq, attention = compute(ctx)
    return inv_freq, attention * (1 + 0.1 * math.log(ctx.factor))


def _rope_theta_dropped(compute, ctx):
    return compute(dataclasses.replace(ctx, base=10000.0))


def _frequencies_unscaled(compute, ctx):
    return compute(dataclasses.replace(ctx, factor=1.0))


APPLY_BUGS = {
    "attention factor applied twice": _attention_factor_twice,
    "rope_theta dropped (transformers' default 10000)": _rope_theta_dropped,
    "frequencies left unscaled": _frequencies_unscaled,
}


class _AppliedWithBug:
    """A plan whose `compute` (what the rotary modules get) goes through a bug; everything else is the plan's."""

    def __init__(self, plan, bug):
        self._plan, self._bug = plan, bug

    def __getattr__(self, name):
        return getattr(self._plan, name)

    def compute(self, slot, seq_len=None, device=None):
        return self._bug(self._plan.method.compute, self._plan.context(slot, seq_len, device))


def plant_apply_bug(monkeypatch, bug: str) -> list[str]:
    """Plant APPLY_BUGS[bug] into `rope_extend.patch.apply_plan`; returns the list of methods it was applied to."""
    from rope_extend import patch

    apply_plan = patch.apply_plan
    applied = []

    def apply_with_bug(model, plan, *args, **kwargs):
        applied.append(plan.spec.method)
        return apply_plan(model, _AppliedWithBug(plan, APPLY_BUGS[bug]), *args, **kwargs)

    monkeypatch.setattr(patch, "apply_plan", apply_with_bug)
    return applied


# --- the Hub: what a push sends (tests/test_hub_push.py, tests/test_train.py) ---------------------------------------
def reference_serving(out: Path, name: str) -> tuple[str, str]:
    """The card's Serving section and the serve line for `name`, computed from scratch by planning the patch again
    from OUT's config (what the push did before it read OUT's record): the reference for the recorded ones."""
    from rope_extend import compat
    from rope_extend.engines.serving import serve_command, serving_hints
    from rope_extend.files import load_config
    from rope_extend.plan import plan_patch
    from rope_extend.spec import RopeSpec

    config = compat.text_config(load_config(out))
    plan = plan_patch(config, RopeSpec(**compat.read_marker(config)["spec"]))
    return serving_hints(plan, name)[0], serve_command(plan, name)


def expected_card(out: Path, repo_id: str) -> bytes:
    """OUT's card with its Serving section (written for OUT's folder as `./NAME`, with the line that says where to
    run the commands from) naming `repo_id` instead, and nothing else."""
    local = (out / "README.md").read_text()
    written, wanted = reference_serving(out, f"./{out.name}")[0].strip(), reference_serving(out, repo_id)[0].strip()
    head, section = local.split("\n## Serving\n\n")
    note, rest = section.split("\n\n", 1)
    assert note.startswith(f"The commands name this checkpoint's folder `./{out.name}`: run them from the folder")
    assert rest.count(written) == 1 and rest.startswith(written)
    return (head + "\n## Serving\n\n" + rest.replace(written, wanted)).encode()


# --- the audit, run (`rope-extend engines MODEL --run ENGINE`): real config.json files in an offline Hub cache ------
QWEN, PHI, LLAMA = "Qwen/Qwen2.5-7B-Instruct", "microsoft/Phi-3.5-mini-instruct", "meta-llama/Llama-3.1-8B"


def offline_hub(tmp_path: Path, monkeypatch, *more: str) -> Path:
    """A Hub cache holding the real config.json of Qwen2.5-7B-Instruct (with the YaRN x4 its card tells users to
    add), Phi-3.5-mini-instruct, Llama-3.1-8B and the repos `more`, set as HF_HUB_CACHE, offline, no other
    transformers line."""
    import hubcache

    cache = tmp_path / "hub"
    hubcache.build_config(cache, QWEN, hubcache.QWEN_YARN)
    for repo in (PHI, LLAMA, *more):
        hubcache.build_config(cache, repo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    return cache


def run_audit(args: list[str], capsys) -> tuple[int, dict, str]:
    """`rope-extend engines ARGS --json` in this process: (exit code, the report, stderr)."""
    import json

    from rope_extend.cli import run

    capsys.readouterr()
    code = run(["engines", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err
