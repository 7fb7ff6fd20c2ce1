"""What "verified" promises, in one function used by `patch_model` and by the checkpoint writer.

A patch is verified when (1) stock transformers, given the rewritten config, builds exactly the inverse frequencies
and attention factor rope-extend computed, AND (2) a real forward pass runs beyond the original length and agrees:
rope-extend's patched model and the stock-loaded model give the same outputs on a few tokens placed at positions
up to the target length. The forward runs on a small model of the same config with random weights, or, on the full
checkpoint path, on the real saved model against the real patched one. The small model keeps everything RoPE and
attention depend on (head_dim, the ratio of attention to KV heads, the rope fields, layer types, partial rotary,
sliding windows, attention-scaling knobs) and shrinks what they do not (width, MLP, vocabulary, experts, repeated
layers: one layer per distinct layer signature), so its rotary modules and attention are the ones the checkpoint
builds, and verifying a 70B-shaped config costs what a 135M one does. A checkpoint that would not run is never
called verified.

It depends on planning (`plan`) and the module layer (`rotary`), not on `patch`, which calls it. The `verify`
command runs this check again on a folder already written: `reverify.py`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
import warnings

import torch

from . import compat
from .errors import ModelRunError, VerificationError
from .plan import PatchPlan, verify_stock_config
from .rotary import apply_plan, find_rotary_modules

# What the small model shrinks. RoPE and attention depend on head_dim, the ratio of attention to KV heads, the rope
# fields, layer types, partial rotary, sliding windows and attention-scaling knobs; these are kept. They do not
# depend on the model's width, MLP, vocabulary, expert count or number of layers of the same type.
PROBE_VOCAB = 256
SMALL_INTERMEDIATE = 64
SMALL_EXPERTS = 4
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "top_k", "num_selected_experts")
GROUP_KEYS = ("n_group", "topk_group", "num_expert_group", "moe_n_group", "moe_topk_group")
MLP_KEYS = ("ffn_hidden_size", "d_ff", "d_inner")  # besides every *intermediate* key
# How far each attempt shrinks: (narrow width, one layer per layer signature). The first that builds, runs and
# holds the planned rotary modules and at least one attention layer is used; the last is the old, wide model.
LEVELS = ((True, True), (True, False), (False, True))
# Forward-check tolerance, relative to the largest output (|logit|) of the probe, by the dtype both models ran in.
# Verification compares like with like: the saved model reloaded by stock transformers in the dtype it was saved in,
# against the in-memory model in that same dtype, with no autocast on either side; on one device the two forwards
# are then bit-identical (measured on SmolLM2-135M on the CPU in float32, bfloat16 and float16: max abs diff 0.0).
# The tolerance is for what may legitimately differ: the reduction order of another kernel or device (a model
# trained on a GPU, reloaded on the CPU). float32: 1e-4 (~840 of its units of rounding, eps 1.2e-7); float64 1e-6;
# bfloat16 and float16: HALF_EPS_UNITS units of their rounding (torch.finfo(dtype).eps: 2**-7 for bfloat16, so
# 3.1e-2 x the output scale, 0.9 at SmolLM2's ~29; 2**-10 for float16, 3.9e-3). A real RoPE mismatch moves the
# logits at the far positions by the output scale itself (46 at scale 33.8 for issue 36's autocast probe).
RTOL = {torch.float32: 1e-4, torch.float64: 1e-6}
HALF_EPS_UNITS = 4


def output_rtol(dtype: torch.dtype) -> float:
    """The forward check's tolerance relative to the output scale for models run in `dtype` (see RTOL)."""
    if dtype in RTOL:
        return RTOL[dtype]
    return HALF_EPS_UNITS * torch.finfo(dtype).eps


def probe_inputs(plan: PatchPlan, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Six tokens at positions 0, 1, L-1, L, N-2 and N-1 (L original, N target length): relative distances from 1 to
    N-1 go through every rotary frequency, the last tokens are beyond the original window, and N-1 makes dynamic
    methods compute their scale at the target length, where stock loaders' static equivalent (dynamic-yarn ->
    yarn) must agree. (The caller keeps the KV cache on: transformers 5 reads position jumps without a cache as
    packed sequences and would mask the tokens from each other.)"""
    original, target = plan.spec.original_max_position_embeddings, plan.spec.target_length
    positions = sorted({0, 1, max(original - 1, 0), min(original, target - 1), max(target - 2, 0), target - 1})
    low = min(3, vocab_size - 1)
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(low, vocab_size, (1, len(positions)), generator=generator)
    return ids, torch.tensor([positions], dtype=torch.long)


@torch.no_grad()
def probe_outputs(model, plan: PatchPlan, *, original_only: bool = False) -> torch.Tensor:
    """The model's outputs (logits, or last hidden states for a base model) on the probe, as float32 on CPU.
    `original_only`: only the probe's positions inside the original window (an unpatched model's own range)."""
    vocab = int(getattr(compat.text_config(model.config), "vocab_size", None) or PROBE_VOCAB)
    ids, positions = probe_inputs(plan, vocab)
    if original_only:
        inside = positions[0] < plan.spec.original_max_position_embeddings
        ids, positions = ids[:, inside], positions[:, inside]
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    try:
        output = model(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=True)
    except Exception as exc:  # whatever the modeling code raises: the model cannot run
        which = "the unpatched" if original_only else "the patched"
        raise ModelRunError(_cannot_run(model.config, exc, which)) from None
    values = getattr(output, "logits", None)
    if values is None:
        values = output.last_hidden_state
    values = values.detach().float().cpu()
    if not torch.isfinite(values).all():
        raise VerificationError(
            f"a forward pass at positions up to {plan.spec.target_length - 1} gives non-finite outputs (NaN or "
            "infinity); the patched RoPE does not run in this model"
        )
    return values


def _cannot_run(config, exc: Exception, which: str = "the patched") -> str:
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    hint = ""
    text = compat.text_config(config)
    factor = getattr(text, "partial_rotary_factor", None)
    with contextlib.suppress(Exception):  # best effort: this only words the hint
        for params in compat.read_slots(text).values():  # 5.x moves it into rope_parameters
            factor = params.get("partial_rotary_factor", factor)
    if factor not in (None, 1, 1.0):
        hint = (f"; the config sets partial_rotary_factor {factor}, which {text.model_type}'s attention does not "
                "apply to every head dimension: remove the key from config.json if the model does not use it")
    return f"{which} model cannot run a forward pass ({type(exc).__name__}: {reason}){hint}"




def _layer_lists(config) -> tuple[int | None, dict[str, list], dict[str, list], dict[int, dict]]:
    """num_hidden_layers; the per-layer lists (layer_types, mlp_layer_types, no_rope_layers, ...); the lists of layer
    indices (attn_layer_indices, mlp_only_layers, ...); and the per-layer overrides of a heterogeneous config
    (transformers 5: per-layer head_dim, KV heads...)."""
    count = config.__dict__.get("num_hidden_layers")
    if not isinstance(count, int) or count < 1:
        return None, {}, {}, {}
    lists, indices = {}, {}
    for key, value in vars(config).items():
        if not isinstance(value, list) or key.startswith("_") or "token" in key:
            continue
        if len(value) == count:
            lists[key] = value
        elif ("layer" in key or "idx" in key or "ids" in key or "indices" in key) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < count for v in value
        ):
            indices[key] = value
    spec = config.__dict__.get("_heterogeneity_spec")
    overrides = copy.deepcopy(getattr(spec, "per_layer_overrides", None) or {})
    return count, lists, indices, overrides


def _layer_sections(config, count: int) -> dict[str, int]:
    """Layer counts that split the stack into consecutive sections, in the config's order (Dory's n_input_layers,
    n_recurrent_layers, n_output_layers: they sum to num_hidden_layers and its forward slices the layers by them)."""
    counts = {key: value for key, value in vars(config).items()
              if key.endswith("_layers") and key != "num_hidden_layers" and not key.startswith("_")
              and isinstance(value, int) and not isinstance(value, bool) and value >= 0}
    return counts if len(counts) > 1 and sum(counts.values()) == count else {}


def _keep_one_layer_per_signature(small) -> None:
    """One layer for each distinct combination of per-layer settings (e.g. one sliding, one full attention) in each
    section of the stack (see `_layer_sections`), so the small model runs the real one's forward structure."""
    count, lists, indices, overrides = _layer_lists(small)
    if count is None:
        return
    sections = _layer_sections(small, count)
    section_of = [name for name, size in sections.items() for _ in range(size)] or [None] * count
    seen, kept = set(), []
    for index in range(count):
        signature = (
            tuple(repr(value[index]) for value in lists.values())
            + tuple(index in value for value in indices.values())
            + (repr(sorted(overrides.get(index, {}).items())), section_of[index])
        )
        if signature not in seen:
            seen.add(signature)
            kept.append(index)
    if len(kept) == count:
        return
    heterogeneous = "_heterogeneity_spec" in small.__dict__
    small.__dict__.pop("_heterogeneity_spec", None)
    for key, value in lists.items():
        small.__dict__[key] = [value[index] for index in kept]
    for key, value in indices.items():
        small.__dict__[key] = [new for new, old in enumerate(kept) if old in value]
    small.num_hidden_layers = len(kept)
    for name in sections:
        setattr(small, name, sum(section_of[index] == name for index in kept))
    shared = small.__dict__.get("num_kv_shared_layers")
    if isinstance(shared, int) and shared:  # KV sharing across the dropped layers: every kept layer computes its own
        small.num_kv_shared_layers = 0
    if heterogeneous:
        small.per_layer_config = {new: overrides[old] for new, old in enumerate(kept) if old in overrides}


def _narrow(small) -> None:
    """Fewest heads with the same attention-to-KV ratio, the same explicit head_dim, and the width they span."""
    if "_heterogeneity_spec" in small.__dict__:
        return  # per-layer head counts and head_dim: keep the widths
    heads, hidden = getattr(small, "num_attention_heads", None), getattr(small, "hidden_size", None)
    kv = getattr(small, "num_key_value_heads", None) or heads
    if not all(isinstance(v, int) and v > 0 for v in (heads, hidden, kv)) or heads % kv:
        return
    head_dim = getattr(small, "head_dim", None)
    head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else hidden // heads
    group = heads // kv
    if hasattr(small, "num_key_value_heads"):
        small.num_key_value_heads = 1
    small.num_attention_heads = group
    small.head_dim = head_dim
    small.hidden_size = group * head_dim


def _shrink_vocab_mlp_experts(small) -> None:
    vocab = int(getattr(small, "vocab_size", PROBE_VOCAB) or PROBE_VOCAB)
    small.vocab_size = min(vocab, PROBE_VOCAB)
    for key, value in list(vars(small).items()):
        if key.endswith("_token_id"):
            if isinstance(value, int) and value >= small.vocab_size:
                setattr(small, key, 0)  # (some config classes want an int; the probe's tokens start at 3)
            elif isinstance(value, list) and any(isinstance(v, int) and v >= small.vocab_size for v in value):
                setattr(small, key, [v for v in value if v < small.vocab_size] or None)
        elif key.startswith("vocab_size_") and isinstance(value, int) and not isinstance(value, bool):
            setattr(small, key, min(value, small.vocab_size))  # per-layer input tables (Gemma 3n's, Gemma 4's PLE)
        elif "intermediate" in key or key in MLP_KEYS:
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(small, key, min(value, SMALL_INTERMEDIATE))
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                setattr(small, key, [min(v, SMALL_INTERMEDIATE) for v in value])
    experts = None
    for key in EXPERT_KEYS:
        value = small.__dict__.get(key)
        if isinstance(value, int) and value > SMALL_EXPERTS:
            setattr(small, key, SMALL_EXPERTS)
            experts = SMALL_EXPERTS
    if experts is not None:
        for key in TOP_K_KEYS:
            value = small.__dict__.get(key)
            if isinstance(value, int) and value > experts:
                setattr(small, key, experts)
        for key in GROUP_KEYS:
            if isinstance(small.__dict__.get(key), int):
                setattr(small, key, 1)


def small_config(config, narrow: bool = True, per_signature: bool = True):
    """The same text config, shrunk where RoPE and attention do not look (see LEVELS); the rope fields, head_dim,
    head ratio, layer types, sliding windows and attention-scaling knobs are untouched."""
    small = copy.deepcopy(compat.text_config(config))
    if per_signature:
        _keep_one_layer_per_signature(small)
    _shrink_vocab_mlp_experts(small)
    if narrow:
        _narrow(small)
    return small


def _base_model_class(config):
    """The base (no head) model class of a config: AutoModel's, or for the text config of a multimodal model that
    AutoModel does not map (Emu3, Mllama), the model class of the same modeling module built on that config."""
    from transformers import AutoModel

    with contextlib.suppress(KeyError, ValueError):
        return AutoModel._model_mapping[type(config)]
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and getattr(obj, "config_class", None) is type(config)]
    bases = [cls for cls in classes if "For" not in cls.__name__] or classes
    if not bases:
        raise ValueError(f"no model class of {type(config).__name__} in {module.__name__}")
    return bases[0]


def _small_model(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cls = _base_model_class(config)
            with compat.without_zero3_init():  # a small copy this process checks alone, never partitioned
                return cls._from_config(config, attn_implementation="eager").float().eval()
        except Exception as exc:
            reason = " ".join(str(exc).split())[:200]
            raise ModelRunError(
                f"stock transformers cannot build a {getattr(config, 'model_type', '?')} model from the patched "
                f"config ({type(exc).__name__}: {reason}), so the patch cannot be verified; --no-verify "
                "(patch_model(..., verify=False)) skips the check"
            ) from None


def _small_run(source_config, stock_config, plan: PatchPlan):
    """(rope-extend's patched small model's outputs, the stock-built small model, its outputs), same weights."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config advice about the small copies is noise here
    try:
        for number, (narrow, per_signature) in enumerate(LEVELS):
            last = number == len(LEVELS) - 1
            try:
                patched, stock = _build_pair(small_config(source_config, narrow, per_signature),
                                             small_config(stock_config, narrow, per_signature), plan)
                _check_modules(stock, plan)
                if not last and not _has_attention(stock):
                    continue
                return probe_outputs(patched, plan), stock, probe_outputs(stock, plan)
            except VerificationError:
                if last:
                    raise
            except Exception as exc:  # a shrunk config the modeling code rejects: try a wider one
                if last:
                    raise ModelRunError(_cannot_run(source_config, exc)) from None
        raise AssertionError("unreachable")
    finally:
        hf_logging.set_verbosity(verbosity)


def run_unpatched(config, plan: PatchPlan) -> torch.Tensor:
    """What "the model runs before patching" means: a small random-weight model of `config` exactly as it is (its
    RoPE untouched, built as verification builds the patched one, seed 0) runs the probe's positions inside the
    original window; its outputs, or ModelRunError. The model the installed transformers builds is what is asked,
    not a rule about which fields its modeling code applies."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        for number, (narrow, per_signature) in enumerate(LEVELS):
            last = number == len(LEVELS) - 1
            state = torch.random.get_rng_state()
            try:
                torch.manual_seed(0)
                model = _small_model(small_config(config, narrow, per_signature))
                if not last and not _has_attention(model):
                    continue
                return probe_outputs(model, plan, original_only=True)
            except Exception as exc:  # a shrunk config the modeling code rejects: try a wider one
                if last and isinstance(exc, ModelRunError):
                    raise
                if last:
                    raise ModelRunError(_cannot_run(config, exc, "the unpatched")) from None
            finally:
                torch.random.set_rng_state(state)
        raise AssertionError("unreachable")
    finally:
        hf_logging.set_verbosity(verbosity)


def _has_attention(model) -> bool:
    return any(type(module).__name__.endswith("Attention") for module in model.modules())


def _build_pair(small_source, small_stock, plan: PatchPlan):
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        patched = _small_model(small_source)
    finally:
        torch.random.set_rng_state(state)
    weights = patched.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_plan(patched, plan)
    stock = _small_model(small_stock)
    missing, unexpected = stock.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise VerificationError(
            f"the stock-loaded config builds a different model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return patched, stock


def _check_modules(model, plan: PatchPlan) -> None:
    """The rotary modules of a stock-loaded model hold the planned frequencies and attention factor."""
    for name, module, _ in find_rotary_modules(model):
        for slot, prefix in compat.module_slots(name, module, plan.slots):
            if slot not in plan.targets:
                continue
            want, attention = plan.expected_stock(slot)
            got = getattr(module, f"{prefix}inv_freq").float().cpu()
            if got.shape != want.shape or not torch.allclose(got, want.float().cpu(), rtol=1e-6, atol=0):
                raise VerificationError(f"{name}: the saved model rebuilds different inv_freq for {slot or 'all layers'}")
            got_attention = float(getattr(module, f"{prefix}attention_scaling", 1.0))
            if not math.isclose(got_attention, attention, rel_tol=1e-6):
                raise VerificationError(f"{name}: the saved model rebuilds a different attention factor")


def _compare(patched: torch.Tensor, stock: torch.Tensor, plan: PatchPlan, dtype: torch.dtype, what: str) -> None:
    if patched.shape != stock.shape:
        raise VerificationError(f"{what}: output shapes differ ({tuple(patched.shape)} vs {tuple(stock.shape)})")
    scale = max(float(patched.abs().max()), 1e-6)
    diff = float((patched - stock).abs().max())
    rtol = output_rtol(dtype)
    if diff > rtol * scale:
        raise VerificationError(
            f"{what}: stock transformers and rope-extend's patched model disagree beyond the original length "
            f"(max abs diff {diff:.3g} at positions up to {plan.spec.target_length - 1}, output scale {scale:.3g}; "
            f"{str(dtype).removeprefix('torch.')} allows {rtol:.2g} x the scale = {rtol * scale:.3g})"
        )


def model_dtype(model) -> torch.dtype:
    """The dtype a model's forward runs in: its floating-point parameters' (the first one's)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def verify_plan(
    plan: PatchPlan,
    *,
    source_config,
    stock_config=None,
    patched_outputs: torch.Tensor | None = None,
    stock_model=None,
    patched_dtype: torch.dtype | None = None,
) -> None:
    """Raise VerificationError unless the plan is verified (see the module docstring).

    `source_config`: the (unpatched) config the plan was made from. `stock_config`: what stock transformers loads
    from the written config.json (default: rebuilt in memory from the plan). With `stock_model` (the saved model
    loaded by stock transformers) and `patched_outputs` (`probe_outputs` of rope-extend's patched real model), the
    forward check runs on the real models; otherwise on a small random-weight model of the same config.
    `patched_dtype`: the dtype `patched_outputs` were computed in (default: the stock model's); the two must be the
    same, since the check compares like with like at that dtype's tolerance (`output_rtol`).
    """
    if stock_config is None:
        stock_config = compat.stock_config(compat.text_config(source_config), plan.slots,
                                           plan.max_position_embeddings, plan.marker)
    verify_stock_config(compat.text_config(stock_config), plan)
    if stock_model is not None:
        _check_modules(stock_model, plan)
        if patched_outputs is not None:
            dtype = model_dtype(stock_model)
            if patched_dtype is not None and patched_dtype != dtype:
                raise VerificationError(
                    f"saved model: stock transformers reloads it in {str(dtype).removeprefix('torch.')} but the "
                    f"model it was saved from ran in {str(patched_dtype).removeprefix('torch.')}, so their outputs "
                    "cannot be compared like with like; save and reload in one dtype (config.json's dtype)"
                )
            _compare(patched_outputs, probe_outputs(stock_model, plan), plan, dtype, "saved model")
            return
    patched_small, stock, stock_small = _small_run(source_config, stock_config, plan)
    _compare(patched_small, stock_small, plan, torch.float32, "small model of this config")


# --- the tokenizer and chat templates ------------------------------------------------------------------------------
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tiktoken.model")
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
              "chat_template.json")
TEMPLATE_DIR = "additional_chat_templates"  # transformers >= 4.54: one .jinja file per named template


def verify_tokenizer(folder) -> None:
    """Raise VerificationError unless the tokenizer and chat templates in `folder` load as a user's would: each
    tokenizer JSON file parses, `AutoTokenizer.from_pretrained(folder)` loads, and every chat template (in
    tokenizer_config.json's `chat_template`, chat_template.jinja, chat_template.json, additional_chat_templates/)
    compiles as `apply_chat_template` compiles it. A folder without a vocabulary file passes (a model may ship no
    tokenizer);
    a tokenizer whose class is remote code is not run (nothing is trusted by default), nor is one whose library
    (sentencepiece, tiktoken) is not installed here: a missing library is this machine's, not the file's."""
    import json
    from pathlib import Path

    root = Path(folder)
    for name in JSON_FILES:
        path = root / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise VerificationError(f"{name} is not valid JSON ({_one_line(exc)}), so the tokenizer does not "
                                        "load; restore it from SOURCE or re-download it") from None
    for name, template in _chat_templates(root):
        try:
            compat.compile_chat_template(template)
        except ImportError:  # jinja2 missing or too old here: apply_chat_template could not run either way
            continue
        except Exception as exc:  # jinja2's TemplateSyntaxError and friends
            line = getattr(exc, "lineno", None)
            raise VerificationError(f"the chat template in {name} does not compile ({type(exc).__name__}"
                                    f"{f' on line {line}' if line else ''}: {_one_line(exc)}), so "
                                    "apply_chat_template fails; fix the template") from None
    if any((root / name).is_file() for name in VOCABULARY_FILES) and not _remote_tokenizer(root):
        _load_tokenizer(root)


def _chat_templates(root) -> list[tuple[str, str]]:
    """(where, template) for every chat template transformers would read from `root`."""
    found = []
    config = root / "tokenizer_config.json"
    if config.is_file():
        value = _json_object(config).get("chat_template")
        if isinstance(value, str):
            found.append(("tokenizer_config.json", value))
        elif isinstance(value, list):  # [{"name": ..., "template": ...}]
            found += [(f"tokenizer_config.json ({item.get('name')})", item["template"]) for item in value
                      if isinstance(item, dict) and isinstance(item.get("template"), str)]
    if (root / "chat_template.jinja").is_file():
        found.append(("chat_template.jinja", (root / "chat_template.jinja").read_text(encoding="utf-8")))
    if (root / "chat_template.json").is_file():
        value = _json_object(root / "chat_template.json")
        if isinstance(value.get("chat_template"), str):
            found.append(("chat_template.json", value["chat_template"]))
    if (root / TEMPLATE_DIR).is_dir():
        found += [(f"{TEMPLATE_DIR}/{path.name}", path.read_text(encoding="utf-8"))
                  for path in sorted((root / TEMPLATE_DIR).glob("*.jinja"))]
    return found


def _json_object(path) -> dict:
    import json

    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _remote_tokenizer(root) -> bool:
    config = root / "tokenizer_config.json"
    if not config.is_file():
        return False
    auto_map = _json_object(config).get("auto_map")
    return isinstance(auto_map, (dict, list)) and "AutoTokenizer" in str(auto_map)


def _load_tokenizer(root) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            AutoTokenizer.from_pretrained(root)
    except ImportError:  # a tokenizer library this machine lacks
        return
    except Exception as exc:  # whatever the tokenizer classes raise on a file they cannot read
        reason = _one_line(exc).replace(str(root), "OUT")  # never the temporary folder's name
        raise VerificationError(f"the tokenizer does not load (AutoTokenizer.from_pretrained: {type(exc).__name__}: "
                                f"{reason}); restore the tokenizer files from SOURCE or re-download them"
                                ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
