"""Cross-check the engine ports in rope_extend/engines against the engines' own RoPE classes, executed from their
published sources with stub infrastructure (no GPU, no engine install).

    pip download --no-deps vllm==0.33.0 sglang==0.5.23 -d /tmp/dl && unzip ... (see --help)
    python tools/check_engine_ports.py --vllm /tmp/eng/vllm033 --sglang /tmp/eng/sgl0523 \
        --llama-cpp /tmp/eng/llama_cpp_python-0.3.36/vendor/llama.cpp   # needs g++

Each argument is a folder holding the unpacked wheel (the `vllm/` or `sglang/` package directory inside it). For
every method the rope-extend config is fed through the real class (its cos/sin cache, magnitude included) and
through the port; the script prints max |Δcos|, |Δsin| per case and exits 1 unless all are identical within the parity
report's float32 tolerance.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import types
import warnings
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _CustomOp(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    @classmethod
    def register(cls, name):
        return lambda klass: klass

    def enabled(self):
        return False


class _Config:
    max_model_len = 0


def _stub_vllm(max_model_len_box: _Config) -> None:
    _module("vllm")
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm.model_executor")
    _module("vllm.model_executor.custom_op", CustomOp=_CustomOp)
    _module("vllm.model_executor.layers")
    _module("vllm.platforms", current_platform=types.SimpleNamespace(is_cuda=lambda: False, is_rocm=lambda: False, is_cpu=lambda: True))
    _module("vllm.utils")
    _module("vllm.utils.torch_utils", direct_register_custom_op=lambda *a, **k: None)
    _module("vllm._aiter_ops", rocm_aiter_ops=types.SimpleNamespace(is_triton_rotary_embed_enabled=lambda: False))
    cfg = types.SimpleNamespace(model_config=max_model_len_box)
    _module("vllm.config", get_current_vllm_config=lambda: cfg)


def _load_package(name: str, folder: Path, files: list[str]) -> dict:
    package = _module(name)
    package.__path__ = [str(folder)]
    loaded = {}
    for stem in files:
        spec = importlib.util.spec_from_file_location(f"{name}.{stem}", folder / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        loaded[stem] = module
    return loaded


def check_vllm(root: Path) -> list[tuple[str, float]]:
    import tiny

    from rope_extend import compat
    from rope_extend.engines.served import Served, compare
    from rope_extend.engines.vllm import port
    from rope_extend.plan import plan_patch

    box = _Config()
    _stub_vllm(box)
    folder = root / "vllm" / "model_executor" / "layers" / "rotary_embedding"
    mods = _load_package(
        "vllm.model_executor.layers.rotary_embedding",
        folder,
        ["common", "base", "linear_scaling_rope", "llama3_rope", "yarn_scaling_rope", "dynamic_ntk_scaling_rope",
         "phi3_long_rope_scaled_rope"],
    )
    results = []
    cases = {m: tiny.spec_kwargs(m, "llama") for m in tiny.METHODS}
    cases["yarn-truncate-false"] = {"method": "yarn", "factor": 4, "truncate": False}
    cases["yarn-mscale"] = {"method": "yarn", "factor": 4, "mscale": 0.707, "mscale_all_dim": 1.0}
    for name, spec in cases.items():
        config = tiny.make_config("llama")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = plan_patch(config, **spec)
        written = compat.portable_config_dict(config.to_dict(), plan.slots, plan.max_position_embeddings, plan.marker)
        fields, rope = port.load_config(written)
        max_pos, dim, base = fields["max_position_embeddings"], 16, rope["rope_theta"]
        for max_model_len in sorted({spec.get("factor", 1) * 32, 32}):
            box.max_model_len = int(max_model_len)
            kind = rope["rope_type"]
            if kind == "default":
                real = mods["base"].RotaryEmbedding(16, dim, max_pos, base, True, torch.float32)
            elif kind == "linear":
                real = mods["linear_scaling_rope"].LinearScalingRotaryEmbedding(16, dim, max_pos, base, True, rope["factor"], torch.float32)
            elif kind == "llama3":
                real = mods["llama3_rope"].Llama3RotaryEmbedding(
                    16, dim, max_pos, base, True, torch.float32, rope["factor"], rope["low_freq_factor"],
                    rope["high_freq_factor"], rope["original_max_position_embeddings"])
            elif kind == "yarn":
                extra = {k: v for k, v in rope.items() if k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")}
                real = mods["yarn_scaling_rope"].YaRNScalingRotaryEmbedding(
                    16, dim, rope["original_max_position_embeddings"], base, True, rope["factor"], torch.float32, **extra)
            elif kind == "dynamic":
                real = mods["dynamic_ntk_scaling_rope"].DynamicNTKScalingRotaryEmbedding(
                    16, dim, max_pos, rope.get("max_trained_positions", max_pos), base, True, rope["factor"], torch.float32)
            elif kind == "longrope":
                real = mods["phi3_long_rope_scaled_rope"].Phi3LongRoPEScaledRotaryEmbedding(
                    16, dim, max_pos, rope["original_max_position_embeddings"], base, True, torch.float32,
                    rope["short_factor"], rope["long_factor"])
            if kind == "longrope":
                cache = real.long_short_cos_sin_cache
                offset = rope["original_max_position_embeddings"] if real.use_long_rope else 0
                rows = cache.shape[0] - offset
            else:
                cache, offset, rows = real.cos_sin_cache, 0, real.cos_sin_cache.shape[0]
            n = min(rows, int(max_model_len))
            served = port.served(fields, rope, int(max_model_len), n)
            if not hasattr(served, "inv_freq"):
                results.append((f"vllm {name} max_model_len={max_model_len}: port says {served.reason}", 0.0, True))
                continue
            rows_real = cache[offset : offset + n].double()
            real_served = Served(inv_freq=None, cos=rows_real[:, : dim // 2].numpy(), sin=rows_real[:, dim // 2 :].numpy())
            delta = compare(real_served, served, n)
            label = f"vllm {name} max_model_len={max_model_len} ({rows} cache rows)"
            results.append((label, max(delta.max_cos, delta.max_sin), delta.identical))
    return results


def _sglang_base(folder: Path) -> type:
    """sglang's RotaryEmbedding with its real `_compute_inv_freq` / `_compute_cos_sin_cache` (taken from base.py's
    source) and a constructor reduced to the attributes they read (the kernels and platform checks are dropped)."""
    import ast

    tree = ast.parse((folder / "base.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RotaryEmbedding")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("_compute_inv_freq", "_compute_cos_sin_cache")]
    namespace = {"torch": torch, "Union": object}
    exec(compile(ast.Module(body=methods, type_ignores=[]), str(folder / "base.py"), "exec"), namespace)

    class RotaryEmbedding(nn.Module):
        def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, position_start=0):
            super().__init__()
            self.head_size, self.rotary_dim, self.max_position_embeddings = head_size, rotary_dim, max_position_embeddings
            self.base, self.is_neox_style, self.dtype, self.position_start = base, is_neox_style, dtype, position_start
            self._force_native = False
            self.cos_sin_cache = self._compute_cos_sin_cache()

    RotaryEmbedding._compute_inv_freq = namespace["_compute_inv_freq"]
    RotaryEmbedding._compute_cos_sin_cache = namespace["_compute_cos_sin_cache"]
    return RotaryEmbedding


def check_sglang(root: Path) -> list[tuple[str, float]]:
    import tiny

    from rope_extend import compat
    from rope_extend.engines.served import Served, compare
    from rope_extend.engines.sglang import port
    from rope_extend.plan import plan_patch

    folder = root / "sglang" / "srt" / "layers" / "rotary_embedding"
    for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.kernels"):
        _module(name)
    _module("sglang.kernels.fused_op", BaseFusedOp=nn.Module)
    _module("sglang.srt.environ", envs=types.SimpleNamespace())
    _module("sglang.srt.utils", cpu_has_amx_support=lambda: False, get_device=lambda: "cpu", is_cuda=lambda: False,
            is_hip=lambda: False, is_npu=lambda: False, is_cpu=lambda: True, get_compiler_backend=lambda: None)
    _module("sglang.srt.layers.rotary_embedding.base", RotaryEmbedding=_sglang_base(folder))
    mods = _load_package("sglang.srt.layers.rotary_embedding", folder, ["utils", "yarn", "rope_variant"])
    results = []
    cases = {m: tiny.spec_kwargs(m, "llama") for m in ("yarn", "ntk-by-parts", "dynamic", "longrope")}
    cases["yarn-attention-factor"] = {"method": "yarn", "factor": 4, "attention_factor": 1.3}
    cases["yarn-mscale"] = {"method": "yarn", "factor": 4, "mscale": 0.707, "mscale_all_dim": 1.0}
    for name, spec in cases.items():
        config = tiny.make_config("llama")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = plan_patch(config, **spec)
        written = compat.portable_config_dict(config.to_dict(), plan.slots, plan.max_position_embeddings, plan.marker)
        fields, rope = port.load_config(written)
        max_pos, dim, base, kind = fields["max_position_embeddings"], 16, rope["rope_theta"], rope["rope_type"]
        if kind == "yarn":  # factory.py: these keys only (attention_factor is not among them)
            keys = ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
            extra = {k: v for k, v in rope.items() if k in keys}
            extra["truncate"] = rope.get("truncate", True)
            real = mods["yarn"].YaRNScalingRotaryEmbedding(
                16, dim, rope["original_max_position_embeddings"], base, True, rope["factor"], torch.float32, **extra)
            cache, lengths = real.cos_sin_cache, [32, 128]
        elif kind == "dynamic":
            real = mods["rope_variant"].DynamicNTKScalingRotaryEmbedding(16, dim, max_pos, base, True, rope["factor"], torch.float32)
            cache, lengths = real.cos_sin_cache, [32, 128]
        else:  # longrope: the forward's index rule, one batch of n positions
            real = mods["rope_variant"].Phi3LongRoPEScaledRotaryEmbedding(
                16, dim, max_pos, rope["original_max_position_embeddings"], base, True, torch.float32,
                rope["short_factor"], rope["long_factor"])
            cache, lengths = real.long_short_cos_sin_cache, [32, 128]
        for n in lengths:
            positions = torch.arange(n)
            if kind == "longrope":
                k = real.original_max_position_embeddings
                positions = positions + (torch.any(positions > k).float() * k).long()
            rows = cache[positions].double()
            served = port.served(fields, rope, n)
            real_served = Served(inv_freq=None, cos=rows[:, : dim // 2].numpy(), sin=rows[:, dim // 2 :].numpy())
            delta = compare(real_served, served, n)
            results.append((f"sglang {name} n={n}", max(delta.max_cos, delta.max_sin), delta.identical))
    return results


LLAMA_CPP_HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define LLAMA_LOG_WARN(...) 0
enum { LLAMA_ROPE_SCALING_TYPE_NONE = 0, LLAMA_ROPE_SCALING_TYPE_LINEAR = 1, LLAMA_ROPE_SCALING_TYPE_YARN = 2 };
enum { LLM_ARCH_LLAMA = 0, LLM_ARCH_DEEPSEEK2 = 1 };
struct { int arch = LLM_ARCH_LLAMA; } model;
struct { float yarn_ext_factor, yarn_attn_factor, rope_freq_scale; int rope_scaling_type; } cparams;
struct { float rope_yarn_log_mul = 0.0f, rope_attn_factor; } hparams;
// ---- ggml/src/ggml.c ----
%(corr)s
// ---- ggml/src/ggml-cpu/ops.cpp ----
%(kernel)s
static void context_setup() {
// ---- src/llama-context.cpp (llama_context constructor) ----
%(context)s
}
int main(int argc, char ** argv) {
    // type ext_factor freq_scale attn_factor_cli attn_factor_key freq_base n_dims n_ctx_orig beta_fast beta_slow n_pos
    cparams.rope_scaling_type = atoi(argv[1]);
    cparams.yarn_ext_factor = atof(argv[2]);
    cparams.rope_freq_scale = atof(argv[3]);
    cparams.yarn_attn_factor = atof(argv[4]);
    hparams.rope_attn_factor = atof(argv[5]);
    float freq_base = atof(argv[6]); int n_dims = atoi(argv[7]); int n_ctx_orig = atoi(argv[8]);
    float beta_fast = atof(argv[9]), beta_slow = atof(argv[10]); int n_pos = atoi(argv[11]);
    context_setup();
    const float theta_scale = powf(freq_base, -2.0f/n_dims);
    float corr_dims[2];
    ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, corr_dims);
    float * cache = (float *) malloc(sizeof(float) * n_dims);
    for (int p = 0; p < n_pos; p++) {
        ggml_rope_cache_init(p, cparams.rope_freq_scale, NULL, corr_dims, n_dims, cparams.yarn_ext_factor,
                             cparams.yarn_attn_factor, cache, 1.0f, theta_scale);
        for (int i = 0; i < n_dims; i++) printf("%%.9g ", cache[i]);
        printf("\n");
    }
    return 0;
}
"""


def check_llama_cpp(root: Path) -> list[tuple[str, float, bool]]:
    """Compile llama.cpp's own RoPE kernel (ops.cpp, ggml.c) and its context-setup block (llama-context.cpp),
    cut verbatim from the sources, and compare with the port for the flags the hints print."""
    import subprocess
    import tempfile

    import numpy as np
    import tiny

    from rope_extend.engines.hint import ORIGINAL
    from rope_extend.engines.llama_cpp import port
    from rope_extend.engines.served import Served, compare
    from rope_extend.engines.serving import engine_hints
    from rope_extend.plan import plan_patch

    ggml = (root / "ggml" / "src" / "ggml.c").read_text()
    ops = (root / "ggml" / "src" / "ggml-cpu" / "ops.cpp").read_text()
    ctx = (root / "src" / "llama-context.cpp").read_text()
    corr = ggml[ggml.index("static float ggml_rope_yarn_corr_dim(") : ggml.index("// ggml_rope_back")]
    kernel = ops[ops.index("static float rope_yarn_ramp(") : ops.index("static void ggml_mrope_cache_init(")]
    context = ctx[ctx.index("    if (cparams.yarn_ext_factor < 0.0f) {") : ctx.index("    if (cparams.pooling_type")]
    source = LLAMA_CPP_HARNESS % {"corr": corr, "kernel": kernel, "context": context}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rope.cpp").write_text(source)
        subprocess.run(["g++", "-O0", "-o", f"{tmp}/rope", f"{tmp}/rope.cpp"], check=True)
        results = []
        cases = {
            "ntk-by-parts": {"method": "ntk-by-parts", "factor": 4},
            "old-ntk-by-parts-hint": {"method": "ntk-by-parts", "factor": 4},
            "yarn": {"method": "yarn", "factor": 4},
            "yarn-betas-attention": {"method": "yarn", "factor": 4, "beta_fast": 64, "beta_slow": 2, "attention_factor": 1.3},
            "linear": {"method": "linear", "factor": 4},
            "ntk": {"method": "ntk", "factor": 4},
        }
        for name, spec in cases.items():
            config = tiny.make_config("llama")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = plan_patch(config, **spec)
            original = config.to_dict()
            hint = next(h for h in engine_hints(plan, "OUT") if h.engine == "llama.cpp")
            flags = hint.route(ORIGINAL).settings.flags
            if name == "old-ntk-by-parts-hint":  # what rope-extend printed before issue 10: the flag is ignored
                flags = "-c 128 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32 --yarn-attn-factor 0.878249"
            meta = port.convert(original)
            n = 128
            served = port.served(meta, flags, n)
            params = port.parse_flags(flags)
            kv = params["override_kv"].get("llama.rope.scaling.attn_factor", 1.0)
            scaling = {"none": 0, "linear": 1, "yarn": 2}[params.get("rope_scaling_type", "linear")]
            args = [scaling, params.get("yarn_ext_factor", -1.0), params.get("rope_freq_scale", 1.0),
                    params.get("yarn_attn_factor", 1.0), kv, params.get("rope_freq_base", meta["rope.freq_base"]),
                    meta["rope.dimension_count"], params.get("yarn_orig_ctx", meta["context_length"]),
                    params.get("yarn_beta_fast", 32.0), params.get("yarn_beta_slow", 1.0), n]
            out = subprocess.run([f"{tmp}/rope", *map(str, args)], capture_output=True, text=True, check=True).stdout
            cache = np.array([[float(v) for v in line.split()] for line in out.strip().splitlines()])
            real = Served(inv_freq=None, cos=cache[:, 0::2], sin=cache[:, 1::2])  # interleaved (cos, sin) pairs
            delta = compare(real, served, n)
            label = f"llama.cpp {name}: {flags} (magnitude {served.magnitude:.6f})"
            results.append((label, max(delta.max_cos, delta.max_sin), delta.identical))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", type=Path, help="folder with the unpacked vllm 0.33.0 wheel")
    parser.add_argument("--sglang", type=Path, help="folder with the unpacked sglang 0.5.23 wheel")
    parser.add_argument("--llama-cpp", type=Path, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist")
    args = parser.parse_args()
    results = (check_vllm(args.vllm) if args.vllm else []) + (check_sglang(args.sglang) if args.sglang else [])
    results += check_llama_cpp(args.llama_cpp) if args.llama_cpp else []
    failed = 0
    for label, delta, identical in results:
        print(f"{'same' if identical else 'DIFF'}  {delta:10.2e}  {label}")
        failed += not identical
    print(f"{len(results) - failed}/{len(results)} identical within float32 tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
