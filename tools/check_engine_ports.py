"""Cross-check the engine ports in rope_extend/engines against the engines' own RoPE classes, executed from their
published sources with stub infrastructure (no GPU, no engine install).

    pip download --no-deps vllm==0.33.0 sglang==0.5.23 -d /tmp/dl && unzip ... (see --help)
    python tools/check_engine_ports.py --vllm /tmp/eng/vllm033 --sglang /tmp/eng/sgl0523

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
    from rope_extend.engines import vllm as port
    from rope_extend.engines.served import Served, compare
    from rope_extend.patch import plan_patch

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
    from rope_extend.engines import sglang as port
    from rope_extend.engines.served import Served, compare
    from rope_extend.patch import plan_patch

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", type=Path, help="folder with the unpacked vllm 0.33.0 wheel")
    parser.add_argument("--sglang", type=Path, help="folder with the unpacked sglang 0.5.23 wheel")
    args = parser.parse_args()
    results = (check_vllm(args.vllm) if args.vllm else []) + (check_sglang(args.sglang) if args.sglang else [])
    failed = 0
    for label, delta, identical in results:
        print(f"{'same' if identical else 'DIFF'}  {delta:10.2e}  {label}")
        failed += not identical
    print(f"{len(results) - failed}/{len(results)} identical within float32 tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
