"""The GGUF file format, as rope-extend reads and rewrites it: the header parsed into records kept as their raw
bytes, records packed, and the data section copied in the kernel.

Tensors are never loaded: the header is parsed and rewritten here (the ``gguf`` package supplies the type tables),
untouched metadata records are copied byte for byte, and the data section is copied from SOURCE with
``copy_file_range`` (holes of sparse files stay holes), so memory stays O(metadata).
"""

from __future__ import annotations

import errno
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

COPY_CHUNK = 64 << 20


def require_gguf():
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - gguf is in the gguf/eval/dev extras
        raise ImportError("reading or writing GGUF files needs the gguf package: pip install 'rope-extend[gguf]'") from exc
    return gguf


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
class KV:
    key: str
    vtype: int
    value: Any  # decoded scalars, strings and short arrays; None for long arrays (kept raw)
    raw: bytes  # the whole record: key, type, value


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section
    raw: bytes

    @property
    def nbytes(self) -> int:
        gguf = require_gguf()
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):
            raise ValueError(
                f"tensor {self.name!r} has ggml type {self.ggml_type}, which the installed gguf package "
                f"{gguf_version()} does not know (a newer quantization?): upgrade it with pip install -U gguf"
            ) from None
        return math.prod(self.dims) // block * size


@dataclass(frozen=True)
class Header:
    version: int
    kvs: dict[str, KV]
    tensors: list[TensorInfo]
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


SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
SHORT_ARRAY = 4096


def gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def read_header(path: Path) -> Header:
    import mmap

    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist; give the path of a .gguf file")
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            header = parse_header(mm, size)
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


def parse_header(mm, size: int) -> Header:
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
        if vtype in SCALAR_FORMATS:
            fmt = "<" + SCALAR_FORMATS[vtype]
            return (struct.unpack_from(fmt, mm, pos)[0] if decode else None), pos + struct.calcsize(fmt)
        if vtype == STRING:
            if decode:
                return string(pos)
            (n,) = struct.unpack_from("<Q", mm, pos)
            return None, pos + 8 + n
        if vtype == ARRAY:
            sub, count = struct.unpack_from("<IQ", mm, pos)
            pos += 12
            decode = decode and count <= SHORT_ARRAY
            if sub in SCALAR_FORMATS and not decode:
                return None, pos + count * struct.calcsize("<" + SCALAR_FORMATS[sub])
            items = []
            for _ in range(count):
                item, pos = value(sub, pos, decode)
                items.append(item)
            return (items if decode else None), pos
        raise ValueError(f"unknown GGUF value type {vtype}")

    kvs: dict[str, KV] = {}
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", mm, pos)
        val, pos = value(vtype, pos + 4, True)
        kvs[key] = KV(key, vtype, val, bytes(mm[start:pos]))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", mm, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        tensors.append(TensorInfo(name, tuple(dims), ggml_type, offset, bytes(mm[start:pos])))
    alignment = int(kvs["general.alignment"].value) if "general.alignment" in kvs else 32
    header = Header(version, kvs, tensors, alignment, pad(pos, alignment), size)
    if tensors and header.data_start + header.data_end > size:  # without tensors there is no data section
        raise ValueError(f"tensor data ends at {header.data_start + header.data_end} but the file has {size} bytes")
    return header


def pack_kv(key: str, vtype: int, value: Any) -> bytes:
    """One metadata record in GGUF's little-endian layout: key (u64 length + UTF-8), type (u32), value."""
    name = key.encode("utf-8")
    record = struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype)
    if vtype == STRING:
        data = str(value).encode("utf-8")
        return record + struct.pack("<Q", len(data)) + data
    fmt = SCALAR_FORMATS[vtype]
    return record + struct.pack("<" + fmt, float(value) if fmt in "fd" else (bool(value) if fmt == "?" else int(value)))


def new_type(name: str, value: Any) -> int:
    gguf = require_gguf()
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


def copy_range(src_fd: int, dst_fd: int, src_off: int, dst_off: int, nbytes: int) -> int:
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
        copied += copy_extent(src_fd, dst_fd, data, dst_off + (data - src_off), hole - data)
        pos = hole
    return copied


def copy_extent(src_fd: int, dst_fd: int, src_off: int, dst_off: int, n: int) -> int:
    done = 0
    while done < n:
        step = min(COPY_CHUNK, n - done)
        try:
            got = os.copy_file_range(src_fd, dst_fd, step, src_off + done, dst_off + done)
        except (AttributeError, OSError):
            buf = os.pread(src_fd, step, src_off + done)
            got = os.pwrite(dst_fd, buf, dst_off + done)
        if got <= 0:
            raise OSError(f"short copy at offset {src_off + done} of the source GGUF (truncated file?)")
        done += got
    return done
