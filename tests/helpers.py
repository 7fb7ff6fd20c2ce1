"""Helpers the test modules share, so that no test module imports another: the attention-level methods'
independent references (the papers' formulas, scored in float64) and tiny patched models, random attention inputs,
the training runs' source and arguments, a small GGUF. Fixtures shared by several modules are in conftest.py."""

from __future__ import annotations

import math
import os
from pathlib import Path

import tiny
import torch

from rope_extend import patch_model
from rope_extend.attention.maps import DualChunkMap, SelfExtendMap, StringMap
from rope_extend.compat import EAGER_THROUGH_ATTENTION_REGISTRY, GENERATE_CACHE_KEYWORD
from rope_extend.engines import sglang as _sglang_port
from rope_extend.engines import sglang_run as _sglang_run
from rope_extend.engines import vllm_run as _vllm_run
from rope_extend.engines import vllm_worker as _vllm_worker

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


def _case_id(case):
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


def _cache(cache) -> dict:
    return {GENERATE_CACHE_KEYWORD: cache, "use_cache": True}


def _patched(arch: str, method: str, impl: str | None = None, **extra):
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
        model.generate(first, attention_mask=torch.ones_like(first), **_cache(cache), **settings)
        cache.crop(shared - cache.get_seq_length())
        if before_reuse is not None:
            before_reuse()
        reused = model.generate(second, attention_mask=torch.ones_like(second), **_cache(cache), **settings)
    return alone, reused


# --- random attention inputs ------------------------------------------------------------------------------------------
def _inputs(B, H, Hkv, D, rdim, n_q, n_k, start, seed):
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


def _toy_text(words: int = 2400) -> str:
    """A learnable text: a fixed cycle of 60 words (the next word is determined by the previous two)."""
    vocab = [f"w{i:02d}" for i in range(60)]
    return " ".join(vocab[i % 60] for i in range(words)) + "\n"


def _args(source: Path, text: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
            "--steps", str(STEPS), "--batch-tokens", "64", "--lr", "3e-3", "--warmup", "0", "--save-steps", "1",
            "-o", str(out), *extra]


def _child_env() -> dict:
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
sglang_serving_rule = _sglang_port.serving_rule  # the SGLang port's serving rule (the card's command)


class BorrowedWorker:
    """A session's engine worker lent to code that would start (and close) its own; counts the loads it serves."""

    def __init__(self, worker):
        self.worker, self.loads = worker, 0

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def load(self, *args, **kwargs):
        self.loads += 1
        return self.worker.load(*args, **kwargs)

    def close(self) -> None:
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
    import pytest

    theirs = {(r["variant"], r["case_id"]): r for r in want}
    assert run["engine"].startswith(engine)
    assert "unpatched" in run["left_out"] and str(window) in run["left_out"]["unpatched"]
    left = {(r["variant"], r["case_id"]) for r in want} - {(r["variant"], r["case_id"]) for r in got}
    # beyond the window: a perplexity text longer than it, a probe whose answer runs past its last position
    assert left and all(v == "unpatched" and theirs[(v, c)]["length"] >= window for v, c in left)
    for r in got:
        other = theirs[(r["variant"], r["case_id"])]
        if r["kind"] == "perplexity":
            assert r["metrics"]["ppl"] == pytest.approx(other["metrics"]["ppl"], rel=1e-3), r["case_id"]
        else:
            assert r["metrics"]["output"] == other["metrics"]["output"], (r["variant"], r["case_id"])
    assert {r["kind"] for r in got} == {"perplexity", "passkey", "niah_single"}
    assert any(r["length"] == 2 * window for r in got)  # beyond the window, for the methods
