"""Dual chunk attention (An et al. 2024, "Training-Free Long-Context Scaling of LLMs", ChunkLlama).

Keys sit at their position modulo the chunk length s = chunk_size - local_window. A query at offset t of its
chunk sees keys of its own chunk at the original distance (intra-chunk), keys of the previous chunk from position
min(t + s, chunk_size) (successive-chunk: the first local_window queries keep exact distances across the
boundary), and keys of older chunks from position chunk_size (inter-chunk). The largest distance is chunk_size,
whatever the length, so there is no reach limit; a spec still names the length it reaches (a factor or a target
length beyond L: without one it would change the model and extend nothing, which the plan refuses). Defaults as in the authors' code as it stands
(HKUNLP/ChunkLlama chunkllama_attn_replace.py at 847ae71): chunk_size = 3L/4, local_window = L // 8 (since d304027;
L // 16 before, and in rope-extend before issue 51), and the length scale 0.05 (added at a4835cf, 0.05 since
7b8ef1e); docs/attention-methods.md has the measurements behind them.
"""

from __future__ import annotations

import math

from .attention_level import LOG_N, AttentionAdvice, AttentionGguf, AttentionMethod
from .registry import Param, register

DEFAULT_LENGTH_SCALE = 0.05  # ChunkLlama's get_mscale: 0.05·ln(n/L) + 1 (a4835cf; 0.05 since 7b8ef1e)
MAX_LENGTH_SCALE = 0.5  # c above this multiplies the logits by more than 4x at 4L: a softmax change, not a correction


class DualChunk(AttentionMethod):
    name = "dual-chunk"
    aliases = ("dca", "chunkllama", "dual-chunk-attention")
    params = {
        "chunk_size": Param(int, None, "the largest distance attention sees; chunks are chunk_size - local_window "
                            "long (default 3L/4)", positive=True, derived="3L/4"),
        "local_window": Param(int, None, "queries this close to a chunk boundary keep exact distances to the "
                              "previous chunk (default L // 8)", positive=True, derived="L/8"),
        "log_n": LOG_N,
        "length_scale": Param(float, None, "c: cos and sin of every query and key times c·ln(n/L) + 1 once the "
                              "sequence n exceeds L, so every logit times its square (default 0.05, the authors' "
                              "code; 0: off)", derived="0.05"),
    }
    formula = "original θ_i; keys at j mod s; queries intra / successive / inter-chunk (largest distance chunk_size)"
    use_when = ("Retrieval and perplexity beyond L without training, served in-process with rope_extend.patch_model "
                "(stock engines serve the model without it, its own RoPE and window); measured ahead of frequency scaling at 2x, behind it "
                "at 4x (docs/results-retrieval.md)")
    paper = "https://arxiv.org/abs/2402.17463"

    def validate(self, spec) -> None:
        super().validate(spec)
        scale = spec.length_scale
        if scale is not None and not 0 <= scale <= MAX_LENGTH_SCALE:
            raise ValueError(
                f"length_scale {scale:g} must lie in [0, {MAX_LENGTH_SCALE:g}]: every logit is multiplied by "
                f"(c·ln(n/L) + 1)², already {(MAX_LENGTH_SCALE * math.log(4) + 1) ** 2:.1f}x at 4L with c = "
                f"{MAX_LENGTH_SCALE:g}; the authors use 0.05 (0 turns it off)"
            )
        chunk, local = spec.chunk_size, spec.local_window
        if chunk is not None and local is not None and local >= chunk:
            raise ValueError(
                f"local_window {local} must be below chunk_size {chunk} (chunks are chunk_size - local_window "
                "tokens long); lower local_window or raise chunk_size"
            )

    def fill_params(self, spec):
        L = spec.original_max_position_embeddings
        chunk = spec.chunk_size if spec.chunk_size is not None else (3 * L) // 4
        local = spec.local_window if spec.local_window is not None else max(1, L // 8)
        if chunk >= L:
            raise self._error(
                f"chunk_size {chunk} is the largest distance dual-chunk attention keeps and must be below the "
                f"original length L = {L}; choose e.g. {(3 * L) // 4}", "chunk_size", chunk)
        if local >= chunk:
            raise self._error(
                f"local_window {local} must be below chunk_size {chunk} (chunks are chunk_size - local_window "
                f"tokens long); choose e.g. {max(1, L // 8)}", "local_window", local)
        scale = spec.length_scale if spec.length_scale is not None else DEFAULT_LENGTH_SCALE
        return spec.model_copy(update={"chunk_size": int(chunk), "local_window": int(local),
                                       "length_scale": float(scale)})

    def mapping(self, spec):
        from ..attention.maps import DualChunkMap

        return DualChunkMap(int(spec.chunk_size), int(spec.local_window), float(spec.length_scale or 0.0),
                            int(spec.original_max_position_embeddings))

    def depends_on_length(self, spec: dict) -> bool:
        scale = spec.get("length_scale")
        return bool(DEFAULT_LENGTH_SCALE if scale is None else scale)


DUAL_CHUNK = register(DualChunk(), gguf=AttentionGguf, advice=AttentionAdvice)
