"""Tiny random models of every RoPE architecture we support, built in memory (hidden 64, 4 heads, 2 layers).

`ORIGINAL` is their max_position_embeddings, so a sequence of FACTOR * ORIGINAL tokens runs beyond the original
window. `stock_logits` runs checkpoints through stock transformers in a fresh process that cannot import
rope_extend.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from rope_extend.compat import TRANSFORMERS_V5

ORIGINAL = 32
FACTOR = 4
SEQ = FACTOR * ORIGINAL
VOCAB = 128
COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    max_position_embeddings=ORIGINAL,
    head_dim=16,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

ARCHS: dict[str, dict] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {},
    "gemma3_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "rope_theta": 100000.0,
    },
    "phi3": {"original_max_position_embeddings": ORIGINAL},
    "gpt_neox": {"partial_rotary_factor": 0.5, "rotary_pct": 0.5, "use_parallel_residual": True},
    "olmo2": {},
    "granite": {},
    # explicit head_dim (32) != hidden_size / heads (16), as in Mistral-Nemo
    "llama_head_dim": {"model_type": "llama", "head_dim": 32},
}

METHODS = ["linear", "ntk", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope"]

# Phi-3's config class accepts only rope_type longrope (both transformers lines validate it), so rope-extend must
# refuse these methods on it with an UnsupportedModelError instead of writing a checkpoint that does not load.
REFUSED = {("phi3", m) for m in ("linear", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3")}
# 4.x OLMo configs accept only {type: linear|dynamic, factor} in rope_scaling.
REFUSED_4X_ONLY = {("olmo2", m) for m in ("ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope")}
if not TRANSFORMERS_V5:
    REFUSED |= REFUSED_4X_ONLY
# What one of the two lines refuses: a checkpoint for both lines cannot carry these.
REFUSED_ANY_LINE = REFUSED | REFUSED_4X_ONLY


def make_config(arch: str):
    extra = dict(ARCHS[arch])
    model_type = extra.pop("model_type", arch)
    kwargs = {**COMMON, **extra}
    if model_type == "gemma3_text":
        kwargs.pop("rope_theta")
        kwargs["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        kwargs["rope_local_base_freq"] = 10000.0
        kwargs["rope_theta"] = 100000.0
    config = AutoConfig.for_model(model_type, **kwargs)
    return config


def make_model(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(arch), attn_implementation="eager")
    return model.eval().float()


def rotary_dim(arch: str) -> int:
    extra = ARCHS[arch]
    head_dim = extra.get("head_dim", COMMON["head_dim"])
    return int(head_dim * extra.get("partial_rotary_factor", 1.0))


def spec_kwargs(method: str, arch: str, factor: float = FACTOR) -> dict:
    kwargs = {"method": method, "factor": factor}
    if method == "longrope":
        half = rotary_dim(arch) // 2
        kwargs["short_factor"] = [1.0 + 0.1 * i for i in range(half)]
        kwargs["long_factor"] = [1.0 + (factor - 1.0) * (i + 1) / half for i in range(half)]
    return kwargs


def input_ids(seq: int = SEQ, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, seq), generator=generator)


STOCK_SCRIPT = textwrap.dedent(
    """
    import sys, json, importlib.abc
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "rope_extend" or name.startswith("rope_extend."):
                raise ImportError("rope_extend must not be importable in the stock-loader process")
    sys.meta_path.insert(0, _Block())
    import torch, transformers
    from transformers import AutoModelForCausalLM
    jobs = json.load(open(sys.argv[1]))
    for job in jobs:
        model = AutoModelForCausalLM.from_pretrained(job["path"], attn_implementation="eager", dtype=torch.float32).eval()
        ids = torch.tensor(job["ids"])
        with torch.no_grad():
            logits = model(ids).logits
        torch.save(logits, job["out"])
    assert "rope_extend" not in sys.modules
    print("stock-ok", transformers.__version__)
    """
)


def stock_logits(jobs: list[tuple[Path, torch.Tensor]], workdir: Path, python: str | None = None) -> list[torch.Tensor]:
    """Logits of each checkpoint computed by stock transformers in a fresh process without rope_extend."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = [
        {"path": str(path), "ids": ids.tolist(), "out": str(workdir / f"logits_{i}.pt")}
        for i, (path, ids) in enumerate(jobs)
    ]
    jobs_file = workdir / "jobs.json"
    jobs_file.write_text(json.dumps(spec))
    script = workdir / "stock.py"
    script.write_text(STOCK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [python or sys.executable, "-I", str(script), str(jobs_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(workdir),
    )
    assert result.returncode == 0 and "stock-ok" in result.stdout, result.stderr[-4000:]
    return [torch.load(job["out"]) for job in spec]


def checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (to prove SOURCE is byte-identical after a run)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def make_multimodal_model(seed: int = 0):
    """A tiny LLaVA (CLIP vision tower + the tiny llama as its nested text config): a multimodal-style config."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=16)
    config = LlavaConfig(text_config=make_config("llama"), vision_config=vision, image_token_index=5)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config).eval().float()


# --- the zoo: every causal-LM type in the running transformers' registry whose modeling code has a rotary embedding
ZOO_ORIGINAL = 32  # max_position_embeddings of the zoo's tiny configs
ZOO_FACTOR = 2
ZOO_SEQ = ZOO_ORIGINAL * 3 // 2  # logits on 1.5 L tokens
ZOO_INIT = 0.2  # transformers' 0.02 leaves some tiny models' logits beyond L unmoved by YaRN (< 1e-4)
ZOO_TEXT = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, vocab_size=VOCAB,
    max_position_embeddings=ZOO_ORIGINAL, initializer_range=ZOO_INIT, tie_word_embeddings=False,
    num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2,
    n_group=1, topk_group=1, bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=8,
    qk_rope_head_dim=16, qk_nope_head_dim=16, qk_head_dim=32, v_head_dim=16, kv_lora_rank=32, q_lora_rank=32,
    num_kv_shared_layers=0, kv_channels=16, vocab_size_per_layer_input=VOCAB,
)
SCALING_KEYS = ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "mscale", "mscale_all_dim",
                "truncate", "type")
ZOO_OTHER = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, vocab_size=VOCAB, initializer_range=ZOO_INIT)


def zoo_types() -> list[str]:
    """Causal-LM model types of the installed transformers whose modeling module defines a rotary embedding."""
    import importlib.util

    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        module = model_type_to_module_name(model_type)
        try:
            spec = importlib.util.find_spec(f"transformers.models.{module}.modeling_{module}")
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            continue  # a registry name without modeling code in this release (remote code only)
        source = Path(spec.origin).read_text(encoding="utf-8")
        if "RotaryEmbedding" in source or "inv_freq" in source:
            found.append(model_type)
    return sorted(found)


# Per-type settings a tiny config of the type needs (hybrid layouts whose attention layers are given by index...).
ZOO_FIXUPS: dict[str, dict] = {
    "bamba": {"num_hidden_layers": 2, "attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16},
    "falcon_h1": {"num_hidden_layers": 1, "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16},
    "recurrent_gemma": {"num_hidden_layers": 2, "block_types": ["recurrent", "attention"], "lru_width": 64},
    "zamba2": {"layers_block_type": ["mamba", "hybrid"], "mamba_headdim": 16, "n_mamba_heads": 8,
               "attention_head_dim": 16, "num_attention_heads": 4, "use_mem_rope": True},
    "deepseek_v4": {"head_dim": 128},
    "mimo_v2_flash": {"head_dim": 48},
    # byte latent transformer: four sub-transformers of one layer each (the defaults allocate several GB)
    "blt": {"encoder_hash_byte_group_vocab": 64, "encoder_hash_byte_group_nb_functions": 1,
            "encoder_hash_byte_group_size": [3], "vocab_size": 260,
            **{f"{part}_config": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "intermediate_size": 64, "num_hidden_layers": 1, "max_position_embeddings": 32,
                                  "initializer_range": ZOO_INIT,
                                  **({"vocab_size": 260} if part != "global" else {}),
                                  **({"hidden_size_global": 64} if part in ("encoder", "decoder") else {})}
               for part in ("patcher", "encoder", "decoder", "global")}},
    "xlnet": {"d_head": 16, "d_model": 64, "n_head": 4},  # 4.x checks d_head against its own d_model // n_head
    "zaya": {"num_experts_per_tok": 1},
    # types whose class defaults do not build a model at all (a size or a RoPE slot the checkpoints always set)
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}, "d_model": 64, "n_heads": 4, "n_layers": 2,
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}},
    "dots1": {"n_shared_experts": 1},
    # input / recurrent (looped) / output layer split of 8 / rest / 8 layers by default: one layer each
    "dory": {"num_hidden_layers": 3, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
             "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1},
    # Granite 4.0-H's default is NoPE (position_embedding_type None: refused, see test_patch); its RoPE variant:
    "granitemoehybrid": {"num_hidden_layers": 2, "layer_types": ["mamba", "attention"], "mamba_n_heads": 8,
                         "mamba_d_head": 16, "position_embedding_type": "rope"},
    "lfm2_moe": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # (5.25) kv_source_layers holds layer indices, not per-layer settings: one sliding and one indexed (indexer)
    # layer, each with its own K/V; the indexer sized for 4 heads over 2 KV heads and 48 tokens
    "kolibri1_1": {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "indexed_attention"],
                   "index_layers": [1], "kv_source_layers": [0, 1], "mlp_only_layers": [0], "index_num_heads": 2,
                   "index_topk": 8, "index_pool_size": 32, "index_compression": 4, "index_num_local_tokens": 4,
                   "index_num_sink_tokens": 2},
    "qwen4_exp": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                  "indexer_compress_ratio": 4},
}
ZOO_FIXUPS["qwen4_exp_text"] = ZOO_FIXUPS["qwen4_exp"]
# The same for sub-configs (vision, audio) of multimodal types: sub-config key -> values.
ZOO_SUB_FIXUPS: dict[str, dict[str, dict]] = {
    # a dense one-layer vision tower (the default's per-layer expert pyramid names layers 25-41), adapters to 64
    "dots3_note": {"vision_config": {"pyramid_num_routed": [-1], "adapter_in_dim": 32, "adapter_out_dim": 64},
                   "audio_config": {"adapter_input_size": 32, "adapter_out_dim": 64}},
    # its text model is the top-level config; a one-block conformer audio encoder (1024 channels by default)
    "phi4_multimodal": {"vision_config": {}, "audio_config": {"num_blocks": 1, "ext_pw_out_channel": 32,
                                                              "depthwise_separable_out_channel": 32,
                                                              "nemo_conv_channels": 32}},
}
if not TRANSFORMERS_V5:
    # 4.x's Mllama rotary module reads rope_scaling["rope_type"], None by default (its checkpoints ship llama3).
    ZOO_FIXUPS["mllama"] = {"rope_scaling": {"rope_type": "default"}}
    # 4.x's LongCat-Flash config maps none of num_hidden_layers / intermediate_size / num_experts_per_tok to its
    # own names (5.x does): the sizes 5.x gets, instead of 28 layers of 12288-wide FFNs (177M weights, 6 minutes)
    ZOO_FIXUPS["longcat_flash"] = {"num_layers": 1, "ffn_hidden_size": 64, "expert_ffn_hidden_size": 32,
                                   "moe_topk": 2}


def _known(config, values: dict) -> dict:
    names = set(vars(config)) | set(getattr(config, "attribute_map", {}))
    return {key: value for key, value in values.items() if key in names}


def _kept_layers(config) -> dict:
    """num_hidden_layers and the per-layer lists for one layer of each distinct per-layer setting."""
    count = config.__dict__.get("num_hidden_layers")
    lists = {k: v for k, v in vars(config).items()
             if isinstance(v, list) and isinstance(count, int) and len(v) == count and "token" not in k}
    if not lists:
        return {"num_hidden_layers": 2}
    seen, kept = set(), []
    for index in range(count):
        signature = tuple(repr(value[index]) for value in lists.values())
        if signature not in seen:
            seen.add(signature)
            kept.append(index)
    out = {key: [value[i] for i in kept] for key, value in lists.items()}
    out["num_hidden_layers"] = len(kept)
    for key in list(out):  # per-layer sizes given as lists (Gemma 3n's intermediate_size)
        if "intermediate" in key:
            out[key] = [min(v, ZOO_TEXT["intermediate_size"]) for v in out[key]]
    return out


def _plain_rope(config) -> dict:
    """Unscaled RoPE with the type's own base (a class default like Llama 3.1's llama3 x8 would make the
    comparison a re-derivation): transformers' YaRN is then applied to exactly this RoPE on both sides."""
    if not TRANSFORMERS_V5:
        scaling = getattr(config, "rope_scaling", None)
        if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type")) in SCALED_TYPES:
            return {"rope_scaling": None}
        return {}
    params = copy.deepcopy(config.__dict__.get("rope_parameters"))
    if not isinstance(params, dict):
        return {}
    nested = bool(params) and all(isinstance(v, dict) for v in params.values())
    for slot in (params.values() if nested else [params]):
        original = "original_max_position_embeddings" in slot
        if slot.get("rope_type", "default") in SCALED_TYPES:
            slot["rope_type"] = "default"
            for key in SCALING_KEYS:
                slot.pop(key, None)
        if original:  # read by some attention code (Ministral 3's llama_4_scaling_beta)
            slot["original_max_position_embeddings"] = ZOO_ORIGINAL
    return {"rope_parameters": params}


SCALED_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


def zoo_config(model_type: str):
    """A tiny random config of `model_type`, built by its config class from small values (so derived sizes
    follow): hidden 64, 4 heads over 2 KV heads of 16, one layer per distinct per-layer setting, vocabulary 128,
    4 experts, unscaled RoPE with the type's base, other sub-models (vision, audio) one small layer."""
    default = AutoConfig.for_model(model_type)
    text = default.get_text_config() if hasattr(default, "get_text_config") else default
    values = {**_known(text, ZOO_TEXT), **_kept_layers(text), **_plain_rope(text), **ZOO_FIXUPS.get(model_type, {})}
    if "kv_lora_rank" in vars(text):  # multi-head latent attention: as many KV heads as heads
        values["num_key_value_heads"] = values["num_attention_heads"]
    sub_fixups = ZOO_SUB_FIXUPS.get(model_type, {})
    subs = {}
    for key, sub in vars(default).items():
        if sub is None and key in sub_fixups:  # 4.x Phi-4-multimodal's __init__ builds its vision default and drops it
            sub = type(default).sub_configs[key]()
        if sub is text:
            subs[key] = values
        elif hasattr(sub, "to_dict") and hasattr(sub, "model_type") and (text is not default or key in sub_fixups):
            subs[key] = {**_known(sub, ZOO_OTHER), **sub_fixups.get(key, {})}
    if text is default:  # the text model is the top-level config; its other sub-models are shrunk where listed
        return AutoConfig.for_model(model_type, **values, **subs)
    return AutoConfig.for_model(model_type, **subs, **_known(default, {"initializer_range": ZOO_INIT}))


def zoo_model(model_type: str, seed: int = 0):
    torch.manual_seed(seed)
    config = zoo_config(model_type)
    if not TRANSFORMERS_V5:  # 4.x maps some composite types' causal LM to a text-only class (Llama 4, Emu3)
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        if not isinstance(config, cls.config_class) and hasattr(config, "get_text_config"):
            return cls._from_config(config.get_text_config(), attn_implementation="eager").eval().float()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval().float()


# Open problems, reviewed: type -> what fails. The test expects each to still fail (xfail) and fails when one works,
# so a fix shows up; they are counted and listed in docs/architectures.md, never claimed supported or refused.
ZOO_OPEN: dict[str, str] = {}


def _imports(*names: str) -> bool:
    import importlib

    try:
        for name in names:
            importlib.import_module(name)
    except Exception:  # not installed, or a torchvision built for another torch (its ops fail to register)
        return False
    return True


if not _imports("timm", "torchvision"):
    # checked on 2026-12-04: with torch 2.14.1, torchvision 0.29.1 and timm 1.0.31 in a separate environment
    # (transformers 5.25.0) gemma3n is exact versus its own YaRN x2; see docs/architectures.md
    ZOO_OPEN["gemma3n"] = (
        "its vision tower is a timm model (TimmWrapper) and timm needs torchvision, which does not import here (the "
        "CPU torch 2.13.0 has no matching CPU torchvision build); exact with torch 2.14.1 + torchvision 0.29.1 + "
        "timm 1.0.31; its text model gemma3n_text is exact"
    )

# Open types the test does not even build (none now; the test stays able to skip a type that allocates GBs).
ZOO_NOT_ATTEMPTED: set[str] = set()
# Reviewed refusals: model type -> (what the one-line error must say, why that is right).
ZOO_REFUSED: dict[str, tuple[str, str]] = {
    "phi3": ("reject method 'yarn'", "its config class accepts only longrope (use --method longrope)"),
    "phi4_multimodal": ("reject method 'yarn'", "Phi-3 family: its config class accepts only longrope"),
    "phimoe": ("reject method 'yarn'", "Phi-3 family: its config class accepts only longrope"),
    # proportional RoPE reads only rope_theta and a factor dividing every frequency: the message names
    # --method linear or --method ntk, both exact (test_matrix.test_proportional_*)
    **{t: ("use --method linear or --method ntk", "full-attention layers use proportional RoPE, which has no YaRN "
           "form; linear and ntk are exact") for t in ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text",
                                                      "lfm3")},
    "codegen": ("fixed sin/cos table", "rotates with a fixed table built from n_positions, no RoPE config"),
    "gptj": ("fixed sin/cos table", "rotates with a fixed table built from n_positions, no RoPE config"),
    "xlnet": ("Transformer-XL relative", "relative sinusoidal encodings, not RoPE"),
    "inkling2_text": ("relative position bias", "only its vision tower rotates (2-D axial RoPE)"),
    # NoPE full attention (rope_parameters["full_attention"] is None); ergo is new in 5.25
    **{t: ("match none of the model's RoPE layer types", "full-attention layers are NoPE; sliding ones rotate: the "
           "message names layer_types: [sliding_attention], exact with it (ZOO_LAYER_TYPES)") for t in ("beam", "ergo")},
    "zaya": ("match none of the model's RoPE layer types", "its layer types are hybrid/hybrid_sliding, not "
             "full_attention: the message names layer_types: [hybrid]"),
    "recurrent_gemma": ("no max_position_embeddings", "its config has no length to extend from"),
    "deepseek_v4": ("use e.g. layer_types: [compress]", "its rope_parameters are keyed by rope labels, main (sliding "
                    "layers) and compress (compressed-attention layers, where its checkpoints put YaRN), not "
                    "full_attention; with layer_types: [compress] it is exact (ZOO_LAYER_TYPES)"),
    **({} if TRANSFORMERS_V5 else {
        **{t: ("reject method 'yarn'", "4.x OLMo configs accept only {type: linear|dynamic, factor}")
           for t in ("olmo", "olmo2")},
        "dbrx": ("reads no rope_scaling", "no transformers 4.x reference: its 4.x modeling code builds RoPE from "
                 "attn_config.rope_theta alone (5.x extends it, exact above)"),
        "nemotron": ("reads no rope_scaling", "no transformers 4.x reference: its 4.x rotary module hard-codes the "
                     "default RoPE (5.x extends it, exact above)"),
        "llama4_text": ("applies llama3 scaling whenever rope_scaling is set", "4.x's Llama 4 rotary module uses "
                        "llama3 scaling for any rope_scaling (5.x reads the type, exact above)"),
        "llama4": ("applies llama3 scaling whenever rope_scaling is set", "as llama4_text (4.x's causal LM of "
                   "Llama 4 is its text model)"),
        "phimoe": ("no rotary-embedding module with an `inv_freq` buffer", "4.x's Phi-MoE rotary module recomputes "
                   "its frequencies from the config in every forward (and its config accepts only longrope)"),
    }),
    "blt": ("four sub-models", "byte latent transformer: its RoPE lives in four sub-models' configs, each with its "
            "own length (bytes or patches); the top-level config has none to extend"),
    "dots3_note": ("match none of the model's RoPE layer types", "as dots3_note_text (its text model)"),
    "dots3_note_text": ("match none of the model's RoPE layer types", "its layer types are indexed_attention/"
                        "sliding_attention: the message names layer_types: [indexed_attention], exact with it "
                        "(ZOO_LAYER_TYPES)"),
}
# Refused types whose one-line message names the layer_types that would work: each is asserted exact with them.
ZOO_LAYER_TYPES: dict[str, list[str]] = {"deepseek_v4": ["compress"], "dots3_note_text": ["indexed_attention"],
                                         "beam": ["sliding_attention"], "ergo": ["sliding_attention"]}


def zoo_reference(config, slot: str = "full_attention", method: str = "yarn"):
    """transformers' own YaRN (or `method`) x ZOO_FACTOR for this config: the same config with its (full-attention,
    or `slot`) RoPE set to that method (yarn from ZOO_ORIGINAL), written the way a user would (rope_parameters in 5.x,
    rope_scaling in 4.x)."""
    data = config.to_dict()
    text = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    scaling = {"rope_type": method, "factor": float(ZOO_FACTOR)}
    if method == "yarn":
        scaling["original_max_position_embeddings"] = ZOO_ORIGINAL
    if TRANSFORMERS_V5:
        params = text["rope_parameters"]
        if isinstance(params.get(slot), dict):
            params[slot] = {**params[slot], **scaling}
        else:
            params.update(scaling)
    else:
        text["rope_scaling"] = scaling
    text["max_position_embeddings"] = ZOO_ORIGINAL * ZOO_FACTOR
    data.pop("transformers_version", None)
    return type(config).from_dict(data)


DOCS_BEGIN = "<!-- BEGIN GENERATED: tests/test_matrix.py::test_architectures_page_is_current -->"
DOCS_END = "<!-- END GENERATED -->"


def zoo_table(outcomes: dict[str, str]) -> str:
    """The generated part of docs/architectures.md from {model_type: "exact" | "refused" | "unbuilt"}, grouped by
    family (the letters of transformers' modeling module name: gemma, gemma2, gemma3n -> gemma)."""
    import re

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    families: dict[str, dict[str, list[str]]] = {}
    for model_type in sorted(outcomes):
        name = re.match(r"[a-z]+", model_type_to_module_name(model_type)).group()  # gemma3n -> gemma
        family = families.setdefault(name, {"exact": [], "refused": [], "unbuilt": []})
        family[outcomes[model_type]].append(model_type)
    counts = {kind: sum(outcomes[t] == kind for t in outcomes) for kind in ("exact", "refused", "unbuilt")}
    import transformers

    lines = [
        f"transformers {transformers.__version__}: **{len(outcomes)}** causal-LM types whose modeling code has a "
        f"rotary embedding, in {len(families)} families: **{counts['exact']} exact**, **{counts['refused']} "
        f"refused** with a one-line reason, {counts['unbuilt']} open (tests/tiny.py::ZOO_OPEN).",
        "",
        "| family | exact versus transformers' own YaRN x2 | refused: why |",
        "|---|---|---|",
    ]
    for family, kinds in sorted(families.items()):
        refused = "; ".join([f"`{t}`: {ZOO_REFUSED[t][1]}" for t in kinds["refused"]]
                            + [f"`{t}`: open, {ZOO_OPEN[t]}" for t in kinds["unbuilt"]])
        exact = ", ".join(f"`{t}`" for t in kinds["exact"])
        lines.append(f"| {family} | {exact} | {refused} |")
    return "\n".join(lines) + "\n"
