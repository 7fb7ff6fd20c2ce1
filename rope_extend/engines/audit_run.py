"""The audit, run: a model's own RoPE served in the real engine (`rope-extend engines MODEL --run ENGINE`).

The audit (`engines.audit`) reads only config.json; its verdicts come from the engines' ports. `--run` checks them
in the engine itself, without the model's weights: a small random-weight model of the audited config (`SmallModel`,
built by `small_model`: the config shrunk in width as the writer's verification shrinks it, `small_model.small_config`;
head_dim, the RoPE keys exactly as config.json writes them, max_position_embeddings and the layer types kept) with
a word-level tokenizer of its vocabulary, is served in each run engine through every audit route of its room, with
the route's own settings (the printed command's flags: `--max-model-len`, `--hf-overrides`, the environment...),
and the log-probability the engine gives every prompt token is compared with transformers running that same
config.json on the same model, on the same token ids (`runs.compare_logprobs`: identical within LOGPROB_TOL on
every token and MEAN_TOL on average).

The lengths: the audited requests (the pretraining length, the window: 32768 and 131072 tokens for Qwen2.5's YaRN
x4) are too long for a CPU, so the run serves the longest that fit `--long-tokens N` (`run_lengths`): the long
request min(window, N) tokens, the short one min(L, N/2), every report naming them. The routes are served as
printed (a `--max-model-len 131072` stays 131072: vLLM picks LongRoPE's factors by it), only the requests are
shorter, and the ports are compared with transformers at the measured lengths too, so that each run row stands
beside the port's verdict for exactly what it measured (`AuditReport.contradictions`).

Detection: with weights at their initial scale attention is almost uniform over the keys, and a RoPE that differs
may move the log-probabilities less than the tolerance. The small model's queries and keys are scaled by
`QK_SCALE` each (attention logits by its square: `sharpen`), so that attention follows positions; with it a YaRN
factor 2.5 % off moves the mean |Δ logprob| of a 4096-token request past MEAN_TOL on Qwen2.5's config (measured
by tests/test_engines_audit.py, which also shows the real engines reporting a deliberately wrong override).
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_TOKENS = 8192  # --long-tokens: the longest request a run serves (the long request; the short one half)
QK_SCALE = 4.0  # queries and keys x4 each: attention logits x16, so that attention follows positions
SEED = 0
FIRST_ID = 3  # request tokens start here (the ids below are the tokenizer's specials)


def run_lengths(short: int, long: int, tokens: int) -> tuple[int, int]:
    """The (short, long) request lengths a run serves for an audited model whose requests are `short` (the
    pretraining length L) and `long` (the window) tokens, within `tokens`: min(window, N) and min(L, N/2)."""
    if tokens < 64:
        raise ValueError(f"--long-tokens {tokens}: a run needs requests of at least 32 and 64 tokens; give 64 or more")
    return min(short, tokens // 2), min(long, tokens)


@dataclass(frozen=True)
class SmallModel:
    """The small random-weight model a run serves: a folder with its config.json (the audited model's text config as
    written, the shrunk sizes replaced), model.safetensors and a tokenizer."""

    folder: Path
    architecture: str
    model_type: str
    layers: int
    layer_types: tuple[str, ...]
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int | None
    vocab_size: int
    sharpened: str  # how queries and keys were scaled (or why not)
    special_ids: tuple[int, ...] = ()

    def describe(self) -> str:
        kinds = sorted(set(self.layer_types))
        types = f" ({', '.join(t.removesuffix('_attention') for t in kinds)})" if len(kinds) > 1 else ""
        head = f" of {self.head_dim}" if self.head_dim else ""
        return (f"{self.architecture}, {_count(self.layers, 'layer')}{types}, hidden {self.hidden_size}, "
                f"{_count(self.heads, 'head')}{head}, {_count(self.kv_heads, 'KV head')}, vocabulary "
                f"{self.vocab_size}; {self.sharpened}")

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "model_type": self.model_type, "layers": self.layers,
                "layer_types": list(self.layer_types), "hidden_size": self.hidden_size, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "vocab_size": self.vocab_size,
                "sharpened": self.sharpened, "seed": SEED}

    def request_ids(self, n: int) -> list[int]:
        """n token ids drawn (seeded) from the vocabulary, the tokenizer's specials and the config's bos / eos / pad
        left out: the same for every engine and the reference."""
        pool = [i for i in range(FIRST_ID, self.vocab_size) if i not in self.special_ids]
        rng = random.Random(SEED)
        return [rng.choice(pool) for _ in range(n)]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def small_model(raw: dict, text_config, folder: Path, window: int) -> SmallModel:
    """Write the small model of an audited config into `folder`: `raw` is the audited config.json (a composite
    model's text part is served as the text model), `text_config` the text config transformers loads from it,
    `window` the audited window (the tokenizer's model_max_length: vLLM caps --max-model-len at it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .. import compat
    from ..facts import read_rope
    from ..small_model import small_config

    small = small_config(text_config)
    try:
        cls = AutoModelForCausalLM._model_mapping[type(small)]
    except KeyError:
        raise ValueError(f"--run: transformers has no causal LM class for {small.model_type!r}, so no small model of "
                         "this config can be served; drop --run (the audit's ports still run)") from None
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls._from_config(small).float().eval()
    finally:
        torch.random.set_rng_state(state)
    sharpened = sharpen(model, QK_SCALE)
    folder.mkdir(parents=True, exist_ok=True)
    # stdout carries the report (--json): what save_pretrained's imports print (DeepSpeed's accelerator line) goes
    # to stderr
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)
    config = _small_config_json(raw, text_config, small, cls.__name__)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = _write_tokenizer(folder, small.vocab_size, window)
    # the config.json written carries the audited RoPE exactly: transformers reads the same slots and window from it
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reread = compat.text_config(AutoConfig.from_pretrained(folder))
    want, got = read_rope(text_config), read_rope(reread)
    if got.slots != want.slots or got.window != want.window:
        raise ValueError(f"--run: the small model's config.json does not carry the audited RoPE ({got.slots} against "
                         f"{want.slots}); report this as a bug of rope-extend")
    config_ids = {getattr(small, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    flat = {i for v in config_ids for i in (v if isinstance(v, list) else [v]) if isinstance(i, int)}
    types = tuple(getattr(small, "layer_types", None) or ("full_attention",) * small.num_hidden_layers)
    head_dim = small.__dict__.get("head_dim")
    return SmallModel(folder, cls.__name__, small.model_type, small.num_hidden_layers, types, small.hidden_size,
                      small.num_attention_heads, getattr(small, "num_key_value_heads", None) or
                      small.num_attention_heads, head_dim if isinstance(head_dim, int) else None, small.vocab_size,
                      sharpened, tuple(sorted(flat | set(specials))))


def _small_config_json(raw: dict, text_config, small, architecture: str) -> dict:
    """The audited config.json's text part as written (its RoPE keys untouched: an engine reads them its own way),
    with every size the shrinker changed, the text model's class and float32."""
    from .. import compat

    out = copy.deepcopy(compat.text_part(raw))
    before, after = text_config.to_dict(), small.to_dict()
    for key, value in after.items():
        if key.startswith("_") or key in ("architectures", "dtype", "torch_dtype", "transformers_version"):
            continue
        if before.get(key) != value or key == "model_type":
            out[key] = value
    out["architectures"] = [architecture]
    out["dtype"] = "float32"
    if "torch_dtype" in out:
        out["torch_dtype"] = "float32"
    return out


def _write_tokenizer(folder: Path, vocab_size: int, window: int) -> list[int]:
    """A word-level tokenizer with one word per id ("<unk>", "<s>", "</s>", then "t3", "t4", ...), which every
    engine loads from tokenizer.json; returns the ids of its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {word: i for i, word in enumerate(specials)}
    vocab.update({f"t{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                      model_max_length=window)
    wrapped.save_pretrained(folder)
    return list(range(len(specials)))


def sharpen(model, scale: float) -> str:
    """Scale the queries and keys of every attention layer by `scale` (attention logits by its square) through what
    produces them last: the q/k norms' weights where the layer normalises them (Gemma, Qwen 3: a projection's scale
    would be normalised away), else the q_proj / k_proj weights and biases, else the query and key rows of a fused
    qkv_proj laid out [q, k, v] (Phi-3). Returns what was done, in words."""
    import torch

    done, kinds, attention = 0, set(), 0
    with torch.no_grad():
        for module in model.modules():
            if not type(module).__name__.endswith("Attention"):
                continue
            attention += 1
            q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
            if isinstance(getattr(q_norm, "weight", None), torch.Tensor):
                # a layer that reads another layer's keys (KV sharing) has no k_norm: its queries alone are scaled
                if _scale_norm(q_norm, scale) and (k_norm is None or _scale_norm(k_norm, scale)):
                    done, kinds = done + 1, kinds | {"q_norm/k_norm weights"}
                continue
            q, k = getattr(module, "q_proj", None), getattr(module, "k_proj", None)
            if isinstance(q, torch.nn.Linear) and isinstance(k, torch.nn.Linear):
                for proj in (q, k):
                    proj.weight.mul_(scale)
                    if proj.bias is not None:
                        proj.bias.mul_(scale)
                done, kinds = done + 1, kinds | {"q_proj/k_proj"}
                continue
            qkv = getattr(module, "qkv_proj", None)
            head_dim = getattr(module, "head_dim", None)
            kv_heads = getattr(module, "num_key_value_heads", None)
            heads = getattr(getattr(module, "config", None), "num_attention_heads", None)
            if isinstance(qkv, torch.nn.Linear) and all(isinstance(v, int) for v in (head_dim, kv_heads, heads)):
                rows = (heads + kv_heads) * head_dim
                qkv.weight[:rows].mul_(scale)
                if qkv.bias is not None:
                    qkv.bias[:rows].mul_(scale)
                done, kinds = done + 1, kinds | {"qkv_proj's q and k rows"}
    if not done:
        return (f"queries and keys at their initial scale ({attention} attention layers, none with q_norm/k_norm, "
                "q_proj/k_proj or qkv_proj): a RoPE difference may hide under the tolerance")
    return f"queries and keys x{scale:g} ({', '.join(sorted(kinds))}) in {done} of {attention} attention layers"


def _scale_norm(norm, scale: float) -> bool:
    """Make a q/k norm's output `scale` times larger through its weight (weight·x̂ or, Gemma's, (1 + weight)·x̂);
    False (the weight restored) when neither form gives it."""
    import torch

    weight = norm.weight.detach().clone()
    x = torch.randn(2, weight.shape[-1], generator=torch.Generator().manual_seed(SEED))
    before = norm(x)
    for new in (weight * scale, scale * (1 + weight) - 1):
        norm.weight.copy_(new)
        if torch.allclose(norm(x), before * scale, rtol=1e-4, atol=1e-6):
            return True
    norm.weight.copy_(weight)
    return False


# --- the run ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunInfo:
    """What a run served: the small model, the request lengths measured within `tokens` (`--long-tokens`), and the
    reference (transformers running the small model's config.json)."""

    tokens: int
    lengths: tuple[int, int]
    model: SmallModel
    reference: str  # "transformers 5.25.0"

    def describe(self) -> str:
        short, long = self.lengths
        return (f"a small random-weight model of this config.json ({self.model.describe()}), served in each engine "
                f"through every route with the route's settings as printed, at {short} and {long} tokens (--long-tokens "
                f"{self.tokens}: the short request min(L, N/2), the long one min(window, N); a request of n tokens is "
                f"n - 1 prompt tokens), against {self.reference} running that config.json on the same model and "
                "token ids")

    def to_dict(self) -> dict[str, Any]:
        return {"run_tokens": self.tokens, "short_tokens": self.lengths[0], "long_tokens": self.lengths[1],
                "model": self.model.to_dict(), "reference": f"{self.reference} running this config.json on the "
                "small model (float32), prompt log-probabilities on the same token ids"}


@dataclass(frozen=True)
class Measured:
    """One audit route of one run engine, served: the room's name, the route's label and command, the worker's label,
    version and device, and per request length the log-probabilities against the reference (`LogprobDelta`) or why
    not (`NotServed`)."""

    engine: str
    route: str
    command: str
    label: str
    version: str | None
    device: str | None
    results: dict[int, Any]


def reference(folder: Path, requests: dict[int, list[int]], progress=None) -> dict[int, list[float]]:
    """transformers running the small model's config.json as it is (the audited RoPE, transformers' own rotary
    embedding; nothing of rope-extend applied), float32: each request's prompt log-probabilities."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..compat import dtype_kwargs
    from .reference import reference_logprobs
    from .runs import REFERENCE, RunProgress

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(str(folder), **dtype_kwargs(torch.float32)).eval()
    out = {}
    for n, ids in requests.items():
        with (progress or RunProgress.silent()).request(f"{REFERENCE} (reference, this config.json)", n):
            out[n] = reference_logprobs(model, ids)
    return out


def measure(raw: dict, text_config, audited, planned, routes: dict, tokens: int, tmp: Path,
            progress=None) -> tuple[RunInfo, list[Measured]]:
    """Serve the small model of the audited config in every planned run engine (`planned`: (adapter, route) of each
    `--run`) through every audit route of its room (`routes`: room name -> its `AuditRoute`s, settings included),
    and compare each request's prompt log-probabilities with the reference."""
    import transformers

    from .runs import LogprobDelta, RunProgress, Workers, serve_and_compare
    from .served import NotServed

    lengths = run_lengths(audited.short, audited.long, tokens)
    small = small_model(raw, text_config, tmp / "small", audited.long)
    info = RunInfo(tokens, lengths, small, f"transformers {transformers.__version__}")
    ids = small.request_ids(max(lengths))
    requests = {n: ids[: n - 1] for n in dict.fromkeys(lengths)}  # n - 1 prompt tokens + 1 generated: n tokens
    count = sum(max(1, len(routes[adapter.name])) for adapter, _ in planned)
    progress = progress or RunProgress([n for _ in range(1 + count) for n in requests])  # the reference's too
    progress.say(f"--run: {', '.join(f'{a.title} ({r})' for a, r in planned)}: a small random-weight model of "
                 f"{audited.name}'s config ({small.describe()}), requests of {' and '.join(map(str, requests))} "
                 "tokens; each engine started, the transformers reference run, then each engine on each audit route")
    out = []
    with Workers(progress) as workers:
        started = {adapter.name: workers(adapter) for adapter, _ in planned}
        truth = reference(small.folder, requests, progress)
        for adapter, route_name in planned:
            worker = started[adapter.name]
            label, version, device = worker.label(route_name), worker.version, worker.device
            if not routes[adapter.name]:
                why = NotServed(f"not run: the {adapter.title} room lists no audit route")
                out.append(Measured(adapter.name, "(none)", "", label, version, device, {n: why for n in lengths}))
            for route in routes[adapter.name]:
                if route.settings is None:
                    why = NotServed(f"not run: the {adapter.title} room gives this route no settings to serve")
                    out.append(Measured(adapter.name, route.label, route.command, label, version, device,
                                        {n: why for n in lengths}))
                    continue
                got = serve_and_compare(adapter, worker, route_name, small.folder, route.settings, requests=requests,
                                        reference=truth, progress=progress)
                results = {n: r if isinstance(r, LogprobDelta) else NotServed(r) for n, r in got.items()}
                out.append(Measured(adapter.name, route.label, route.command, label, version, device, results))
    return info, out
