"""Memory before loading: what a command needs to load SOURCE's weights and run them at a length, what the device
has, and the one-line refusal when it does not fit.

Every command that loads weights (`eval`, `tune`, `train`, `patch --mode full`, `verify` of changed weights) calls
`check` once, before loading, so that a model too large for the machine is
one line naming the numbers and the ways out instead of a process the kernel kills. The estimate:

- weights: every tensor of the safetensors headers (read without the tensors) in the dtype they load in: the asked
  floating dtype, or the stored one for `auto`; integer tensors keep theirs. Pickle weights: their file sizes,
  scaled from the stored dtype.
- working memory at `length` tokens, batch 1, no gradients, memory-efficient attention (the SDPA kernels the eval
  uses): one decoder layer's activations (the residual, its sum and the normed input, then q/k/v, their rotated
  copies and the attention output, or the MLP's three intermediate-sized tensors, whichever is larger), RMSNorm's
  float32 upcast, the float32 cos and sin, the final hidden states, the key/value cache when the command decodes
  (probes), one layer's attention probabilities when it measures attention entropy, and one 1024-position chunk
  of float32 logits. tests/test_memory.py holds it to a forward's measured peak.
- training (`training_need`, one process): float32 weights with their gradients and AdamW's two moments (LoRA:
  frozen weights, trained adapters and copies), a micro-batch's activations (`activation_bytes`, or
  `checkpointed_bytes_per_token` with gradient checkpointing) and one loss chunk; `train` decides its default
  window and `--gradient-checkpointing auto` from the same numbers.

The device's memory is `/proc/meminfo`'s MemAvailable (bounded by a cgroup v2 limit when there is one), or the CUDA
device's free memory; a `--device-map` spreads the model over devices itself (accelerate), so it is not checked.
`--no-memory-check` (`skip=True`) loads anyway.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

from . import files
from .errors import RopeExtendError

GiB = 1 << 30
LOGITS_CHUNK = 1024  # positions per chunk of the loss (eval/perplexity.py's token_losses)
SKIP_FLAG = "--no-memory-check"
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max, memory.current

# bytes per element of each safetensors dtype, and of each dtype a command loads in
STORED_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1}
STORED_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "double": "float64"}


class NotEnoughMemoryError(RopeExtendError, ValueError):
    """Running the command as asked needs more memory than the device has (the message names both and the ways
    out)."""


@dataclass(frozen=True)
class Need:
    """What loading SOURCE and running it at `length` tokens takes, in bytes."""

    dtype: str  # the dtype the weights load in
    weights: int
    working: int  # activations, key/value cache, logits (or gradients, optimizer state) at `length`
    length: int
    per_token: int  # the part of `working` that grows with the length (bytes per token)

    @property
    def total(self) -> int:
        return self.weights + self.working


@dataclass(frozen=True)
class Available:
    bytes: int
    where: str  # "RAM" or "cuda:0"


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# --- the weights -------------------------------------------------------------------------------------------------------
def _weight_files(folder: Path) -> list[Path]:
    shards = files.index_shards(folder)
    if shards:
        return [folder / rel for rel in shards]
    return sorted(folder.glob("*.safetensors"))


def stored_dtype(folder: Path) -> str:
    """The floating dtype most of SOURCE's weights are stored in (the dtype `auto` loads them in)."""
    counts: dict[str, int] = {}
    for path in _weight_files(folder)[:1]:
        header = files.read_safetensors_header(path)[0]
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in STORED_NAMES:
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + 1
    if counts:
        return STORED_NAMES[max(counts, key=counts.get)]
    raw = files.read_config(folder)
    named = str(raw.get("dtype") or raw.get("torch_dtype") or "float32")
    return named if named in DTYPE_BYTES else "float32"


def load_dtype(folder: Path, dtype: str | None) -> str:
    """The dtype the weights load in: `dtype`, or the stored one for `auto` / None."""
    if dtype in (None, "auto"):
        return stored_dtype(folder)
    name = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if name not in DTYPE_BYTES:
        raise ValueError(f"--dtype {dtype!r} is not a dtype to load weights in; use one of auto, "
                         f"{', '.join(DTYPE_BYTES)}")
    return name


def weights_bytes(folder: Path, dtype: str | None) -> int:
    """Bytes of SOURCE's weights loaded in `dtype`, from the safetensors headers (the tensors are never read)."""
    element = DTYPE_BYTES[load_dtype(folder, dtype)]
    total = 0
    safetensors = _weight_files(folder)
    for path in safetensors:
        header = files.read_safetensors_header(path)[0]
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape") or []:
                count *= int(dim)
            stored = str(entry.get("dtype"))
            total += count * (element if stored in STORED_NAMES else STORED_BYTES.get(stored, element))
    if safetensors:
        return total
    pickles = sum(p.stat().st_size for p in folder.glob("*.bin"))  # no header to read: scale the file sizes
    return pickles * element // DTYPE_BYTES[stored_dtype(folder)]


# --- the work at a length ---------------------------------------------------------------------------------------------
def _dims(config) -> tuple[int, int, int, int, int, int, int]:
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return (hidden, config.intermediate_size, heads * head_dim, kv_heads * head_dim, head_dim, heads,
            config.num_hidden_layers)


def inference_per_token(config, element: int, kv_cache: bool = False) -> int:
    """Bytes per token of a forward without gradients (see the module docstring), the cache included if asked."""
    hidden, intermediate, q_dim, kv_dim, head_dim, _, layers = _dims(config)
    attention = 3 * q_dim + 3 * kv_dim  # q, k, v, rotated q and k, the output
    layer = 3 * hidden + max(attention, 3 * intermediate)  # the residual, its sum and the normed input; the larger
    cache = 2 * layers * kv_dim if kv_cache else 0
    float32 = 4 * (2 * hidden + 2 * head_dim)  # RMSNorm's float32 upcast and square; cos and sin in float32
    return element * (layer + hidden + cache) + float32


def inference_need(folder: Path, config, dtype: str | None, length: int, *, kv_cache: bool = False,
                   scores_length: int = 0) -> Need:
    """Loading SOURCE in `dtype` and running it at `length` tokens (decoding with a cache if `kv_cache`; one layer's
    attention probabilities at `scores_length` tokens when the command measures them)."""
    dtype = load_dtype(folder, dtype)
    element = DTYPE_BYTES[dtype]
    per_token = inference_per_token(config, element, kv_cache)
    heads = _dims(config)[5]
    fixed = 2 * LOGITS_CHUNK * config.vocab_size * 4 + 2 * heads * scores_length**2 * 4
    return Need(dtype, weights_bytes(folder, dtype), per_token * length + fixed, length, per_token)


# --- training ---------------------------------------------------------------------------------------------------------
LOSS_CHUNK_BYTES = 3 * (256 << 20)  # one chunk of float32 logits, its softmax and its gradient (train/loss.py)
ADAMW_BYTES = 16  # a trained float32 parameter: the weight, its gradient, AdamW's two moments
FROZEN_BYTES = 4  # a frozen float32 parameter (LoRA's base weights)


def activation_bytes(tokens: int, hidden: int, intermediate: int, kv_dim: int, layers: int, element: int) -> int:
    """Activations a llama-style decoder keeps for the backward pass of `tokens` tokens without gradient
    checkpointing: per layer and token about 10 hidden-sized tensors (norm inputs/outputs, q, rotated q, attention
    output, residuals), 4 key/value-sized (k, rotated k, v) and 4 MLP-sized (gate, up, activation, product) in the
    compute dtype (`element` bytes): ~48 KB per token and layer for SmolLM2-135M in float32
    (tests/test_train_memory.py holds it to what autograd saves)."""
    return tokens * layers * (10 * hidden + 4 * kv_dim + 4 * intermediate) * element


def checkpointed_bytes_per_token(hidden: int, layers: int) -> int:
    """With gradient checkpointing: each layer's input (float32, kept and recomputed) plus one layer's
    recomputation (~24 hidden-sized float32 tensors), per token."""
    return layers * hidden * 4 * 2 + hidden * 4 * 24


def training_per_token(config, element: int, checkpointing: bool) -> int:
    """Bytes per token a training forward keeps for the backward pass (`checkpointed_bytes_per_token` or
    `activation_bytes` of one token)."""
    hidden, intermediate, _, kv_dim, _, _, layers = _dims(config)
    if checkpointing:
        return checkpointed_bytes_per_token(hidden, layers)
    return activation_bytes(1, hidden, intermediate, kv_dim, layers, element)


def _trained_by_lora(folder: Path, r: int, embeddings_and_norms: bool) -> int:
    """Parameters LoRA trains (`train/lora.py`): an r-rank adapter on every linear layer but the output head
    (r x (in + out) each), and, with `embeddings_and_norms`, a trained copy of the input embedding and the norms."""
    trained = 0
    for path in _weight_files(folder):
        for name, entry in files.read_safetensors_header(path)[0].items():
            shape = entry.get("shape") if isinstance(entry, dict) and name != "__metadata__" else None
            if not shape:
                continue
            count = 1
            for dim in shape:
                count *= int(dim)
            if name.endswith("proj.weight") and len(shape) == 2:
                trained += r * (shape[0] + shape[1])
            elif embeddings_and_norms and ("embed_tokens" in name or name.endswith("norm.weight")):
                trained += count
    return trained


def training_need(folder: Path, config, window: int, micro_batch: int = 1, *, compute_dtype: str = "float32",
                  checkpointing: bool = True, lora_r: int | None = None, embeddings_and_norms: bool = True) -> Need:
    """One training process on SOURCE: float32 weights (16 bytes a trained parameter with its gradient and AdamW's
    moments; LoRA: 4 a frozen one, 16 an adapter's or a trained copy's), and the activations of a micro-batch of
    `micro_batch` windows of `window` tokens in `compute_dtype` (bfloat16 mixed precision keeps most in 16 bits),
    plus one loss chunk."""
    parameters = weights_bytes(folder, "float32") // 4
    if lora_r is None:
        weights = ADAMW_BYTES * parameters
    else:
        weights = FROZEN_BYTES * parameters + ADAMW_BYTES * _trained_by_lora(folder, lora_r, embeddings_and_norms)
    per_token = micro_batch * training_per_token(config, DTYPE_BYTES[compute_dtype], checkpointing)
    return Need("float32", weights, per_token * window + LOSS_CHUNK_BYTES, window, per_token)


# --- the device ---------------------------------------------------------------------------------------------------------
def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_available() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        limit = (CGROUP / "memory.max").read_text().strip()
        if limit != "max":
            return max(int(limit) - int((CGROUP / "memory.current").read_text().strip()), 0)
    return None


def available(device: str | None = None) -> Available:
    """Free memory where the weights will live: the CUDA device's for `cuda[:N]`, else the RAM's."""
    if device and str(device).startswith("cuda"):
        import torch

        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        return Available(int(torch.cuda.mem_get_info(index)[0]), f"cuda:{index}")
    readings = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return Available(min(readings) if readings else 8 * GiB, "RAM")


# --- the check ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WaysOut:
    """How the command's user changes what it needs: the flags this command has for each way out."""

    dtype_flag: str | None = "--dtype"  # the flag that loads the weights in another dtype, if the command has one
    device: str | None = "--device cuda, or --device-map auto to spread it over devices"
    length: str | None = None  # how to ask for a shorter length, `{fits}` the longest that fits
    # other runs that need less: (what to do, the flag) -> the estimate of that run, offered when it is smaller
    offers: tuple[tuple[str, str, Need], ...] = ()
    other: tuple[str, ...] = ()  # ways that load nothing (e.g. "write the config only (--mode config-only)")


def refusal(source: str, need: Need, have: Available, ways: WaysOut, what: str = "weights") -> str:
    """The one line: the numbers, then every way out that helps."""
    ways_out = [f"{words} ({flag}: ~{gib(other.total)})" for words, flag, other in ways.offers
                if other.total < need.total]
    ways_out += list(ways.other)
    if ways.device:
        ways_out.append(f"run it on another device ({ways.device})")
    room = have.bytes - need.weights - (need.working - need.per_token * need.length)
    if room > 0 and need.per_token and ways.length:
        fits = room // need.per_token // 1024 * 1024
        if 0 < fits < need.length:
            ways_out.append(f"use a shorter length ({ways.length.format(fits=fits)})")
    ways_out.append(f"pass {SKIP_FLAG} to load it anyway")
    return (f"{source} needs ~{gib(need.total)} of {have.where} in {need.dtype} at {need.length} tokens ({what} "
            f"{gib(need.weights)}, activations ~{gib(need.working)}) and {gib(have.bytes)} is available; to fit it, "
            + ", ".join(ways_out[:-1]) + ", or " + ways_out[-1])


def check(source: str, need: Need, *, device: str | None = None, device_map: str | None = None,
          ways: WaysOut = WaysOut(), what: str = "weights", skip: bool = False) -> None:
    """Refuse (NotEnoughMemoryError, one line) when `need` exceeds the memory where it will run; `what` names
    `need.weights` in the line. Nothing is checked with `skip` or a `device_map` (accelerate places the layers
    itself)."""
    if skip or device_map:
        return
    have = available(device)
    if need.total > have.bytes:
        raise NotEnoughMemoryError(refusal(source, need, have, ways, what))


def check_inference(source: str, folder: Path, config, dtype: str | None, length: int, *, kv_cache: bool = False,
                    scores_length: int = 0, device: str | None = None, device_map: str | None = None,
                    ways: WaysOut = WaysOut(), skip: bool = False) -> Need:
    """`check` for a command that loads SOURCE (`folder`, its text `config`) in `dtype` (`--dtype`) and runs it
    without gradients at `length` tokens; bfloat16 is offered when it needs less. Returns the estimate."""
    need = inference_need(folder, config, dtype, length, kv_cache=kv_cache, scores_length=scores_length)
    if not (skip or device_map) and need.dtype != "bfloat16" and ways.dtype_flag:
        bf16 = inference_need(folder, config, "bfloat16", length, kv_cache=kv_cache, scores_length=scores_length)
        ways = replace(ways, offers=(("load it in bfloat16", f"{ways.dtype_flag} bfloat16", bf16), *ways.offers))
    check(source, need, device=device, device_map=device_map, ways=ways, skip=skip)
    return need
