"""A GGUF plan executed: OUT written as SOURCE with the planned RoPE metadata, atomically.

OUT is written to a temporary file beside it (`.OUT.<pid>.*.tmp`) and renamed into place; SOURCE is opened
read-only. A writer killed outright (SIGKILL) leaves its hidden temp file; the next write to OUT deletes temp files
whose writer no longer runs.
"""

from __future__ import annotations

import glob
import os
import shlex
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..outputs import check_replaceable
from ..spec import RopeSpec, load_spec
from ..terminal import shell_path
from .binary import SCALAR_FORMATS, STRING, Header, copy_range, new_type, pack_kv, pad, require_gguf
from .info import LLAMACPP_SOURCE, ROPE_FREQS
from .plan import GGUFPlan, plan_gguf_file


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
    source, header, out = plan.source, plan.header, Path(out)
    if source is None or header is None:
        raise ValueError("write_gguf executes a plan of a GGUF file: make it with plan_gguf_file(source, spec)")
    _check_out(plan, out, overwrite)
    if on_step:
        on_step(f"writing {out}")
    meta, extra = _metadata(plan)
    copied = _write_atomically(source, header, out, meta, extra)
    return GGUFPatchResult(out, plan, dict(plan.keys), [ROPE_FREQS] if extra else [], copied)


def _check_out(plan: GGUFPlan, out: Path, overwrite: bool) -> None:
    """OUT names a GGUF file that is not SOURCE, and replaces only a GGUF, with `overwrite`."""
    source = plan.source
    check_gguf_name(out, f"{source.stem}-{plan.spec.method}-x{plan.spec.factor:g}.gguf")
    if out.exists():
        if out.resolve() == source.resolve() or (out.is_file() and os.path.samefile(out, source)):
            raise CheckpointError(f"OUT {str(out)!r} is SOURCE; rope-extend never modifies its source: pick another path")
        check_replaceable(out, "gguf")  # only a GGUF file is ever replaced
        if not overwrite:
            raise CheckpointError(f"OUT {str(out)!r} exists; pass overwrite=True (--overwrite) or pick another path")


def _metadata(plan: GGUFPlan) -> tuple[bytes, bytes]:
    """(OUT's header: SOURCE's records with the planned keys set, added or deleted, and the rope_freqs tensor's info
    when the plan adds one; the rope_freqs tensor's bytes, or b"")."""
    gguf, header = require_gguf(), plan.header
    pending = dict(plan.keys)
    kv_records = []
    for key, kv in header.kvs.items():
        if key in pending:
            new = pending.pop(key)
            if new is not None:
                vtype = kv.vtype if kv.vtype in SCALAR_FORMATS or kv.vtype == STRING else new_type(key, new)
                kv_records.append(pack_kv(key, vtype, new))
        else:
            kv_records.append(kv.raw)
    kv_records += [pack_kv(key, new_type(key, value), value) for key, value in pending.items() if value is not None]
    ti_records = [t.raw for t in header.tensors]
    extra = b""
    if plan.rope_freqs is not None:
        extra = np.ascontiguousarray(plan.rope_freqs, dtype="<f4").tobytes()
        name = ROPE_FREQS.encode()
        ti_records.append(
            struct.pack("<Q", len(name)) + name
            + struct.pack("<IQIQ", 1, len(plan.rope_freqs), int(gguf.GGMLQuantizationType.F32), pad(header.data_end, header.alignment))
        )  # fmt: skip
    head = b"GGUF" + struct.pack("<IQQ", header.version, len(ti_records), len(kv_records))
    return head + b"".join(kv_records) + b"".join(ti_records), extra


def _write_atomically(source: Path, header: Header, out: Path, meta: bytes, extra: bytes) -> int:
    """OUT written in a temporary file beside it (`meta`, SOURCE's data section, `extra` after it) and renamed into
    place; the bytes of tensors copied."""
    data_start = pad(len(meta), header.alignment)
    src_end = header.data_end
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
            copied = copy_range(src.fileno(), fd, header.data_start, data_start, src_end)
        end = src_end
        if extra:
            end = pad(src_end, header.alignment)
            os.pwrite(fd, extra, data_start + end)
            end += len(extra)
        os.ftruncate(fd, data_start + pad(end, header.alignment))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, out)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return copied


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
