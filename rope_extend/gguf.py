"""GGUF in and out: read a GGUF's RoPE facts and rewrite its metadata so llama.cpp serves a rope-extend spec.

What llama.cpp reads, checked in the source vendored in ``llama-cpp-python`` 0.3.36 (``vendor/llama.cpp``):

- ``src/llama-model.cpp`` (``load_hparams``, every architecture): ``<arch>.context_length`` (n_ctx_train),
  ``<arch>.rope.freq_base`` (default 10000), ``<arch>.rope.scaling.type`` (default "linear"),
  ``<arch>.rope.scaling.factor`` (freq_scale = 1/factor), ``<arch>.rope.scaling.original_context_length``
  (n_ctx_orig_yarn, default n_ctx_train), ``<arch>.rope.scaling.attn_factor`` (rope_attn_factor, default 1),
  ``<arch>.rope.dimension_count``. The YaRN ``yarn_beta_fast``/``yarn_beta_slow``/``yarn_attn_factor`` keys are
  read only by a few architectures (grok, mistral3...), not by ``llama`` (``src/models/llama.cpp``), which instead
  loads the optional per-dimension ``rope_freqs.weight`` tensor (n_rot/2 floats, shared by all layers).
- ``src/llama-context.cpp``: with YaRN (ext_factor != 0) the context sets
  ``yarn_attn_factor = get_mscale(s) / (1 + 0.1 ln s)`` (= 1) and multiplies it by ``rope.scaling.attn_factor``.
- ``ggml/src/ggml-cpu/ops.cpp`` (``rope_yarn``, ``ggml_rope_cache_init``): theta_extrap = θ_i / freq_factors[i];
  theta = freq_scale·theta_extrap·(1 - ramp·ext) + theta_extrap·ramp·ext, ramp over floor/ceil'ed correction dims
  (``ggml.c: ggml_rope_yarn_corr_dims``, β_fast 32, β_slow 1); cos/sin × attn_factor × (1 + 0.1 ln s) when ext != 0.

So the served attention factor is ``attn_factor_key × (1 + 0.1 ln s)`` for yarn, and ``attn_factor_key`` otherwise.
llama.cpp's room ports that math once (`rope_extend.engines.llama_cpp.port`, float32 as ggml computes it: the port
the parity report runs); `plan_gguf` checks the keys it plans reproduce the spec's inverse frequencies and attention
factor with it, up to the target length, before writing anything.

Tensors are never loaded: the header is parsed and rewritten here (the ``gguf`` package supplies the type tables),
untouched metadata records are copied byte for byte, and the data section is copied from SOURCE with
``copy_file_range`` (holes of sparse files stay holes), so memory stays O(metadata).
OUT is written to a temporary file beside it (`.OUT.<pid>.*.tmp`) and renamed into place; SOURCE is opened
read-only. A writer killed outright (SIGKILL) leaves its hidden temp file; the next write to OUT deletes temp files
whose writer no longer runs.
"""

from __future__ import annotations

import errno
import glob
import math
import os
import shlex
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import AlreadyScaledError, CheckpointError, SpecError, UnsupportedModelError, VerificationError
from .outputs import check_replaceable
from .spec import RopeSpec, load_spec
from .terminal import shell_path

ROPE_FREQS = "rope_freqs.weight"
LLAMACPP_SOURCE = "llama.cpp as vendored in llama-cpp-python 0.3.36"

# Architectures whose RoPE keys and rope_freqs tensor were checked in the vendored llama.cpp source (module
# docstring) and measured with the real llama-perplexity (tests/test_gguf_llamacpp.py).
VERIFIED_ARCHITECTURES = ("llama",)

_COPY_CHUNK = 64 << 20


def _require_gguf():
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - gguf is in the gguf/eval/dev extras
        raise ImportError("reading or writing GGUF files needs the gguf package: pip install 'rope-extend[gguf]'") from exc
    return gguf


# -- reading ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GGUFInfo:
    """RoPE-relevant facts of a GGUF file (what ``rope-extend show`` prints for a .gguf)."""

    path: Path
    architecture: str
    name: str | None
    context_length: int | None
    freq_base: float
    rope_dim: int
    head_count: int | None
    embedding_length: int | None
    scaling: dict[str, Any]  # every <arch>.rope.scaling.* key, without the prefix
    rope_freqs: list[float] | None  # the rope_freqs.weight tensor, if present
    tensor_count: int
    file_type: int | None
    file_size: int

    @property
    def scaling_type(self) -> str:
        return str(self.scaling.get("type", "none" if not self.scaling else "linear"))

    @property
    def is_scaled(self) -> bool:
        factor = float(self.scaling.get("factor", 0.0) or 0.0)
        return self.rope_freqs is not None or self.scaling_type not in ("none", "linear") or factor not in (0.0, 1.0)

    @property
    def original_context_length(self) -> int | None:
        return int(self.scaling.get("original_context_length", self.context_length or 0)) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.name,
            "context_length": self.context_length,
            "freq_base": self.freq_base,
            "rope_dim": self.rope_dim,
            "head_count": self.head_count,
            "embedding_length": self.embedding_length,
            "scaling": dict(self.scaling),
            "rope_freqs": None if self.rope_freqs is None else f"[{len(self.rope_freqs)} factors]",
            "tensor_count": self.tensor_count,
            "file_type": self.file_type,
            "file_size": self.file_size,
        }


def is_gguf(path: str | os.PathLike) -> bool:
    """True for an existing file that starts with the GGUF magic (or any path ending in .gguf)."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


# The header is parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per metadata item
# (~650 bytes each; 245k items = 160 MB for the demo's 49k-token vocabulary). Parsing keeps each key/value and tensor
# info record as its raw bytes (copied unchanged into OUT) and decodes only scalars, strings and short arrays.
@dataclass(frozen=True)
class _KV:
    key: str
    vtype: int
    value: Any  # decoded scalars, strings and short arrays; None for long arrays (kept raw)
    raw: bytes  # the whole record: key, type, value


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section
    raw: bytes

    @property
    def nbytes(self) -> int:
        gguf = _require_gguf()
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):
            raise ValueError(
                f"tensor {self.name!r} has ggml type {self.ggml_type}, which the installed gguf package "
                f"{_gguf_version()} does not know (a newer quantization?): upgrade it with pip install -U gguf"
            ) from None
        return math.prod(self.dims) // block * size


@dataclass(frozen=True)
class _Header:
    version: int
    kvs: dict[str, _KV]
    tensors: list[_TensorInfo]
    alignment: int
    data_start: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None or kv.value is None else kv.value

    @property
    def data_end(self) -> int:
        """End of the last tensor, relative to the data section."""
        return max((t.offset + t.nbytes for t in self.tensors), default=0)


_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SHORT_ARRAY = 4096


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def _remove_stale_temps(out: Path) -> None:
    """Delete temp files of OUT (`.OUT.<pid>.*.tmp`) left by writers that no longer run (killed with SIGKILL,
    power loss): their pid is in the name. A live writer's file is left alone."""
    for path in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        pid = path.name[len(out.name) + 2 :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            pass


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _read_header(path: Path) -> _Header:
    import mmap

    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist; give the path of a .gguf file")
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            header = _parse_header(mm, size)
    except (struct.error, ValueError, IndexError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(f"{str(path)!r} is not a readable GGUF file ({exc}); re-download or re-convert it") from exc
    if not header.tensors:  # complete as it is: nothing to re-download
        vocab = any(key.startswith("tokenizer.") for key in header.kvs)
        what = ("a vocab-only GGUF: a tokenizer (tokenizer.* metadata) and no tensor, as llama.cpp's "
                "ggml-vocab-*.gguf files and `convert_hf_to_gguf.py --vocab-only` write" if vocab
                else "a GGUF with no tensor")
        raise CheckpointError(f"{str(path)!r} is {what}, so it holds no model; give the GGUF of the model itself "
                              "(with its weights)")
    return header


def _parse_header(mm, size: int) -> _Header:
    if mm[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    (version,) = struct.unpack_from("<I", mm, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (big-endian or too old); rope-extend reads little-endian v2/v3")
    n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
    pos = 24

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", mm, pos)
        return bytes(mm[pos + 8 : pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def value(vtype: int, pos: int, decode: bool) -> tuple[Any, int]:
        if vtype in _SCALAR_FORMATS:
            fmt = "<" + _SCALAR_FORMATS[vtype]
            return (struct.unpack_from(fmt, mm, pos)[0] if decode else None), pos + struct.calcsize(fmt)
        if vtype == _STRING:
            if decode:
                return string(pos)
            (n,) = struct.unpack_from("<Q", mm, pos)
            return None, pos + 8 + n
        if vtype == _ARRAY:
            sub, count = struct.unpack_from("<IQ", mm, pos)
            pos += 12
            decode = decode and count <= _SHORT_ARRAY
            if sub in _SCALAR_FORMATS and not decode:
                return None, pos + count * struct.calcsize("<" + _SCALAR_FORMATS[sub])
            items = []
            for _ in range(count):
                item, pos = value(sub, pos, decode)
                items.append(item)
            return (items if decode else None), pos
        raise ValueError(f"unknown GGUF value type {vtype}")

    kvs: dict[str, _KV] = {}
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", mm, pos)
        val, pos = value(vtype, pos + 4, True)
        kvs[key] = _KV(key, vtype, val, bytes(mm[start:pos]))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", mm, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        tensors.append(_TensorInfo(name, tuple(dims), ggml_type, offset, bytes(mm[start:pos])))
    alignment = int(kvs["general.alignment"].value) if "general.alignment" in kvs else 32
    header = _Header(version, kvs, tensors, alignment, _pad(pos, alignment), size)
    if tensors and header.data_start + header.data_end > size:  # without tensors there is no data section
        raise ValueError(f"tensor data ends at {header.data_start + header.data_end} but the file has {size} bytes")
    return header


def read_gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """The RoPE facts of a GGUF file (header only; tensor data is not read)."""
    path = Path(path)
    return _info(_read_header(path), path)


def read_metadata(path: str | os.PathLike, key: str) -> Any:
    """One metadata value of a GGUF file (e.g. `general.license`), or None when the file has no such key."""
    return _read_header(Path(path)).get(key)


def _info(header: _Header, path: Path) -> GGUFInfo:
    arch = header.get("general.architecture")
    if not arch:
        raise CheckpointError(f"{str(path)!r} has no general.architecture key; it is not a model GGUF")
    head_count = header.get(f"{arch}.attention.head_count")
    if isinstance(head_count, list):  # per-layer arrays: RoPE only needs one value
        head_count = head_count[0]
    embedding = header.get(f"{arch}.embedding_length")
    key_length = header.get(f"{arch}.attention.key_length")
    head_dim = key_length or (embedding // head_count if embedding and head_count else None)
    rope_dim = header.get(f"{arch}.rope.dimension_count", head_dim)
    prefix = f"{arch}.rope.scaling."
    scaling = {k[len(prefix):]: kv.value for k, kv in header.kvs.items() if k.startswith(prefix)}
    rope_freqs = None
    for t in header.tensors:
        if t.name == ROPE_FREQS and t.ggml_type == 0:  # F32
            with open(path, "rb") as fh:
                fh.seek(header.data_start + t.offset)
                rope_freqs = np.frombuffer(fh.read(t.nbytes), dtype="<f4").astype(float).tolist()
        elif t.name == ROPE_FREQS:
            rope_freqs = []  # present but not F32: still "scaled"
    return GGUFInfo(
        path=path,
        architecture=str(arch),
        name=header.get("general.name"),
        context_length=header.get(f"{arch}.context_length"),
        freq_base=float(header.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_dim=int(rope_dim) if rope_dim else 0,
        head_count=head_count,
        embedding_length=embedding,
        scaling=scaling,
        rope_freqs=rope_freqs,
        tensor_count=len(header.tensors),
        file_type=header.get("general.file_type"),
        file_size=header.file_size,
    )


def hf_config_of(info: GGUFInfo):
    """A transformers config carrying the GGUF's RoPE (for ``rope-extend inspect model.gguf``)."""
    from transformers import LlamaConfig

    if not info.head_count or not info.embedding_length:
        raise CheckpointError(f"{str(info.path)!r} lacks {info.architecture}.attention.head_count/embedding_length")
    scaling = None
    if info.scaling_type == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": float(info.scaling.get("factor", 1.0)),
            "original_max_position_embeddings": int(info.original_context_length or 0),
        }
    elif info.scaling_type == "linear" and float(info.scaling.get("factor", 0) or 0) > 1:
        scaling = {"rope_type": "linear", "factor": float(info.scaling["factor"])}
    config = LlamaConfig(
        hidden_size=info.embedding_length,
        num_attention_heads=info.head_count,
        head_dim=info.rope_dim,
        max_position_embeddings=info.context_length or 2048,
        rope_theta=info.freq_base,
        rope_scaling=scaling,
        num_hidden_layers=1,
        intermediate_size=4,
        vocab_size=8,
    )
    return config


# -- the GGUF plan (per-method keys come from the method's `GgufRules`) -------------------------------------------
@dataclass
class GGUFPlan:
    """What `write_gguf` writes: key -> value (None deletes the key), an optional rope_freqs tensor, warnings; with
    `plan_gguf_file`, the SOURCE file they are written over (its path and parsed header)."""

    spec: RopeSpec
    keys: dict[str, Any]
    rope_freqs: np.ndarray | None
    inv_freq: np.ndarray
    attention_factor: float
    warnings: list[str] = field(default_factory=list)
    source: Path | None = None
    header: _Header | None = field(default=None, repr=False)


def plan_gguf_file(source: str | os.PathLike, spec: RopeSpec) -> GGUFPlan:
    """SOURCE's header read (never its tensors) and the one plan of `spec` on it, ready for `write_gguf`."""
    _require_gguf()  # the type tables, before anything is read
    source = Path(source)
    header = _read_header(source)
    return replace(plan_gguf(_info(header, source), spec), source=source, header=header)


def plan_gguf(info: GGUFInfo, spec: RopeSpec) -> GGUFPlan:
    """Resolve *spec* against the GGUF's RoPE and compute the metadata to write, checked with llama.cpp's math."""
    from .methods import RopeContext, get_method, gguf_rules

    if info.architecture not in VERIFIED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {info.architecture!r} is not supported: rope-extend verified the RoPE keys of "
            f"{', '.join(VERIFIED_ARCHITECTURES)} only ({LLAMACPP_SOURCE}); patch the Hugging Face checkpoint and "
            "convert it with llama.cpp's convert_hf_to_gguf.py instead"
        )
    if info.is_scaled:
        raise AlreadyScaledError(
            f"{str(info.path)!r} already carries RoPE scaling (rope.scaling.type={info.scaling_type!r}, "
            f"factor={info.scaling.get('factor', '-')}, rope_freqs={'yes' if info.rope_freqs is not None else 'no'}); "
            "stacking a second scheme would be silent double scaling: patch the original, unscaled GGUF"
        )
    if not info.context_length or info.rope_dim <= 0 or info.rope_dim % 2:
        raise CheckpointError(
            f"{str(info.path)!r} has no usable {info.architecture}.context_length / rope.dimension_count "
            f"({info.context_length}, {info.rope_dim}); the file is incomplete"
        )
    if spec.rope_theta is not None:
        raise SpecError(
            f"rope_theta={spec.rope_theta:g} in the spec: a GGUF's base is its rope.freq_base "
            f"({info.freq_base:g}); remove rope_theta",
            field="rope_theta",
            value=spec.rope_theta,
        )
    spec = spec.resolve(int(info.context_length))
    method = get_method(spec.method)
    ctx = RopeContext(
        rotary_dim=info.rope_dim,
        base=info.freq_base,
        original_max_position_embeddings=int(spec.original_max_position_embeddings),
        factor=float(spec.factor),
        params=spec.method_params(),
        seq_len=int(spec.target_length) if method.dynamic else None,  # longrope: the long factors
    )
    inv_freq, attention_factor = _compute(method, ctx)
    rel_keys, factors, warnings = gguf_rules(method).rope(spec, info.freq_base, info.rope_dim, inv_freq,
                                                          attention_factor)
    arch = info.architecture
    keys = {f"{arch}.{k}": v for k, v in rel_keys.items()}
    keys[f"{arch}.context_length"] = int(spec.target_length)
    plan = GGUFPlan(spec, keys, factors, inv_freq, attention_factor, warnings)
    _verify_plan(info, plan)
    return plan


def _compute(method, ctx) -> tuple[np.ndarray, float]:
    inv_freq, attention_factor = method.compute(ctx)
    return inv_freq.detach().cpu().double().numpy(), float(attention_factor)


def _verify_plan(info: GGUFInfo, plan: GGUFPlan) -> None:
    """The planned metadata, read back through llama.cpp's port (`engines.llama_cpp.port`, the one the parity report
    runs), must give the spec's RoPE up to the target length, within the float32 tolerance every engine row uses."""
    import torch

    from .engines.llama_cpp.port import served as llama_cpp_served
    from .engines.served import Served, compare

    arch = info.architecture
    meta: dict[str, Any] = {"context_length": info.context_length, "rope.dimension_count": info.rope_dim,
                            "rope.freq_base": info.freq_base}
    meta.update({f"rope.scaling.{key}": value for key, value in info.scaling.items()})
    meta.update({key[len(arch) + 1:]: value for key, value in plan.keys.items()})
    if plan.rope_freqs is not None:
        meta["rope_freqs"] = plan.rope_freqs
    n = int(plan.spec.target_length)
    served = llama_cpp_served(meta, "", n, arch=arch)
    delta = compare(served, Served(torch.from_numpy(np.asarray(plan.inv_freq, dtype=np.float64)),
                                   plan.attention_factor), n)
    if not delta.identical:
        raise VerificationError(
            f"the GGUF keys planned for {plan.spec.method} would make llama.cpp serve different RoPE (max |Δcos| "
            f"{delta.max_cos:.2e}, |Δsin| {delta.max_sin:.2e} over {n} positions, worst at rotary frequency "
            f"{delta.worst_dim}; magnitude {served.magnitude:.6f} vs {plan.attention_factor:.6f}); this is a "
            "rope-extend bug, please report it with the spec"
        )


# -- writing ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GGUFPatchResult:
    out: Path
    plan: GGUFPlan
    written_keys: dict[str, Any]
    added_tensors: list[str]
    bytes_copied: int


def check_gguf_name(out: Path, example: str) -> None:
    """A .gguf SOURCE writes one GGUF file: OUT must be a file name ending in .gguf, not a folder (`-o out.bin` or
    `-o newdir/`, whose slash the path drops, would have become a GGUF file of that name). `example`: a file name
    for OUT inside a folder."""
    if out.is_dir() and not out.is_symlink():
        raise CheckpointError(f"OUT {str(out)!r} is a folder, but a .gguf SOURCE writes one GGUF file; name the file: "
                              f"-o {shlex.quote(str(out / example))}")
    if out.suffix.lower() == ".gguf":
        return
    if out.suffix:
        fix = f"-o {shlex.quote(str(out.with_suffix('.gguf')))}"
    else:
        fix = f"-o {shlex.quote(str(out) + '.gguf')}, or -o {shlex.quote(str(out / example))} for a file in a folder"
    raise CheckpointError(f"OUT {str(out)!r} does not end in .gguf, but a .gguf SOURCE writes one GGUF file; name "
                          f"it so: {fix}")


def patch_gguf(
    source: str | os.PathLike,
    spec: RopeSpec | dict | str,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> GGUFPatchResult:
    """Write OUT: SOURCE with its RoPE metadata rewritten for *spec* (see the module docstring).

    The Python API's edge: `spec` is parsed and planned on SOURCE once (`plan_gguf_file`), then `write_gguf`
    executes the plan."""
    return write_gguf(plan_gguf_file(source, load_spec(spec)), out, overwrite=overwrite, on_step=on_step)


def write_gguf(plan: GGUFPlan, out: str | os.PathLike, *, overwrite: bool = False,
               on_step: Callable[[str], None] | None = None) -> GGUFPatchResult:
    """Execute `plan` (from `plan_gguf_file`): write OUT, its SOURCE with the planned RoPE metadata.

    Every other metadata record and tensor info is copied byte for byte, tensors keep their offsets, and the data
    section is copied in the kernel; a rope_freqs tensor (llama3, longrope) is appended after the last tensor.
    """
    gguf = _require_gguf()
    source, header, out = plan.source, plan.header, Path(out)
    if source is None or header is None:
        raise ValueError("write_gguf executes a plan of a GGUF file: make it with plan_gguf_file(source, spec)")
    check_gguf_name(out, f"{source.stem}-{plan.spec.method}-x{plan.spec.factor:g}.gguf")
    if out.exists():
        if out.resolve() == source.resolve() or (out.is_file() and os.path.samefile(out, source)):
            raise CheckpointError(f"OUT {str(out)!r} is SOURCE; rope-extend never modifies its source: pick another path")
        check_replaceable(out, "gguf")  # only a GGUF file is ever replaced
        if not overwrite:
            raise CheckpointError(f"OUT {str(out)!r} exists; pass overwrite=True (--overwrite) or pick another path")
    if on_step:
        on_step(f"writing {out}")

    pending = dict(plan.keys)
    kv_records = []
    for key, kv in header.kvs.items():
        if key in pending:
            new = pending.pop(key)
            if new is not None:
                vtype = kv.vtype if kv.vtype in _SCALAR_FORMATS or kv.vtype == _STRING else _new_type(key, new)
                kv_records.append(_pack_kv(key, vtype, new))
        else:
            kv_records.append(kv.raw)
    kv_records += [_pack_kv(key, _new_type(key, value), value) for key, value in pending.items() if value is not None]
    ti_records = [t.raw for t in header.tensors]
    src_end = header.data_end
    extra = b""
    if plan.rope_freqs is not None:
        extra = np.ascontiguousarray(plan.rope_freqs, dtype="<f4").tobytes()
        name = ROPE_FREQS.encode()
        ti_records.append(
            struct.pack("<Q", len(name)) + name
            + struct.pack("<IQIQ", 1, len(plan.rope_freqs), int(gguf.GGMLQuantizationType.F32), _pad(src_end, header.alignment))
        )  # fmt: skip
    head = b"GGUF" + struct.pack("<IQQ", header.version, len(ti_records), len(kv_records))
    meta = head + b"".join(kv_records) + b"".join(ti_records)
    data_start = _pad(len(meta), header.alignment)

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp", dir=out.parent)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600; OUT gets the usual permissions
        os.pwrite(fd, meta + bytes(data_start - len(meta)), 0)
        with open(source, "rb") as src:
            copied = _copy_range(src.fileno(), fd, header.data_start, data_start, src_end)
        end = src_end
        if extra:
            end = _pad(src_end, header.alignment)
            os.pwrite(fd, extra, data_start + end)
            end += len(extra)
        os.ftruncate(fd, data_start + _pad(end, header.alignment))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, out)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return GGUFPatchResult(out, plan, dict(plan.keys), [ROPE_FREQS] if extra else [], copied)


def _pack_kv(key: str, vtype: int, value: Any) -> bytes:
    """One metadata record in GGUF's little-endian layout: key (u64 length + UTF-8), type (u32), value."""
    name = key.encode("utf-8")
    record = struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype)
    if vtype == _STRING:
        data = str(value).encode("utf-8")
        return record + struct.pack("<Q", len(data)) + data
    fmt = _SCALAR_FORMATS[vtype]
    return record + struct.pack("<" + fmt, float(value) if fmt in "fd" else (bool(value) if fmt == "?" else int(value)))


def _new_type(name: str, value: Any) -> int:
    gguf = _require_gguf()
    t = gguf.GGUFValueType
    if isinstance(value, str):
        return int(t.STRING)
    if isinstance(value, bool):
        return int(t.BOOL)
    if isinstance(value, int):
        return int(t.UINT32)
    if isinstance(value, float):
        return int(t.FLOAT32)
    raise TypeError(f"no GGUF type for {name}={value!r}")


def _copy_range(src_fd: int, dst_fd: int, src_off: int, dst_off: int, nbytes: int) -> int:
    """Copy src[src_off:src_off+nbytes] to dst at dst_off in the kernel, skipping holes; returns bytes copied."""
    end, pos, copied = src_off + nbytes, src_off, 0
    while pos < end:
        try:
            data = os.lseek(src_fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            data = pos  # SEEK_DATA unsupported: copy everything
        if data >= end:
            break
        try:
            hole = min(os.lseek(src_fd, data, os.SEEK_HOLE), end)
        except OSError:
            hole = end
        copied += _copy_extent(src_fd, dst_fd, data, dst_off + (data - src_off), hole - data)
        pos = hole
    return copied


def _copy_extent(src_fd: int, dst_fd: int, src_off: int, dst_off: int, n: int) -> int:
    done = 0
    while done < n:
        step = min(_COPY_CHUNK, n - done)
        try:
            got = os.copy_file_range(src_fd, dst_fd, step, src_off + done, dst_off + done)
        except (AttributeError, OSError):
            buf = os.pread(src_fd, step, src_off + done)
            got = os.pwrite(dst_fd, buf, dst_off + done)
        if got <= 0:
            raise OSError(f"short copy at offset {src_off + done} of the source GGUF (truncated file?)")
        done += got
    return done


# -- text for the CLI ------------------------------------------------------------------------------------------------
def info_lines(info: GGUFInfo) -> list[str]:
    """`rope-extend show model.gguf`."""
    scaling = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.scaling.items())
    lines = [
        f"GGUF {info.path} ({info.architecture}, {info.name or 'unnamed'}, {info.tensor_count} tensors, "
        f"{info.file_size / 1e6:.1f} MB)",
        f"context_length: {info.context_length}",
        f"rope.freq_base: {info.freq_base:.9g}",
        f"rope.dimension_count: {info.rope_dim}",
        f"rope.scaling: {scaling or 'none'}",
        f"rope_freqs tensor: {f'{len(info.rope_freqs)} factors' if info.rope_freqs is not None else 'none'}",
    ]
    if info.architecture not in VERIFIED_ARCHITECTURES:
        lines.append(f"note: rope-extend cannot patch {info.architecture!r} GGUFs (verified: {', '.join(VERIFIED_ARCHITECTURES)})")
    elif info.is_scaled:
        lines.append("existing scheme: scaled (patch the original, unscaled GGUF instead)")
    else:
        lines.append("existing scheme: none (plain RoPE)")
    return lines


def result_lines(result: GGUFPatchResult) -> list[str]:
    """`rope-extend patch model.gguf ...`: what was written and how to run it."""
    plan = result.plan
    spec = plan.spec
    keys = ", ".join(f"{k}={v:.9g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.written_keys.items())
    lines = [
        f"wrote {shell_path(result.out)} ({result.bytes_copied / 1e6:.1f} MB of tensors copied"
        f"{', added ' + ', '.join(result.added_tensors) if result.added_tensors else ''})",
        f"{spec.method} x{spec.factor:g}: {spec.original_max_position_embeddings} -> {spec.target_length} tokens, "
        f"attention factor {plan.attention_factor:.6f}",
        f"metadata: {keys}",
        f"checked with rope-extend's port of the RoPE math of {LLAMACPP_SOURCE} (not llama.cpp itself); llama.cpp "
        "needs no RoPE flags for it",
        f"output: {shell_path(result.out)}",
        f"serve:  llama-server -m {shlex.quote(str(result.out))} -c {spec.target_length}",
    ]
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines
