"""The GPU bundle (tools/gpu_bundle.py, docs/development.md "The GPU bundle") on this CPU machine: built for this
Python, installed by its run.sh without an index into a virtualenv that holds only torch and transformers 5.17 (what
the GPU image holds), where `bench/gpu_check.py --quick` then passes: the `gpu` tests import and skip with their
reason, every bench row checks its cache and path. About 2 minutes on 2 idle cores (the virtualenv's torch install
is most of it, built once per machine and reused: `helpers.cached_venv`); it needs PyPI, as the demo model's tests
do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import cached_venv

ROOT = Path(__file__).resolve().parent.parent
IMAGE_TRANSFORMERS = "5.17.0"  # the GPU image's (/work/.library/device/KINDS.md)
# typer 0.29 requires pydantic; the GPU image's typer does not, and the image has no pydantic: the virtualenv holds
# an older typer so that it lacks pydantic too, and the bundle has to bring it
IMAGE_TYPER = "typer<0.29"


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _offline_env(**extra) -> dict:
    """This process's environment without PYTHONPATH and pip's find-links / config (no local wheel folders: what
    the install gets comes from the bundle alone)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL",
                                                            "PIP_INDEX_URL", "PIP_CONSTRAINT")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", **extra}


@pytest.fixture(scope="module")
def image_python() -> Path:
    """A virtualenv with torch (this machine's CPU build) and transformers 5.17 and what they require, nothing else:
    built once per machine (`helpers.cached_venv`, keyed by these pins; ~2 minutes on 2 idle cores), then reused."""
    torch_version = torch.__version__.split("+")[0]
    return cached_venv("gpu-image-venv", [f"torch=={torch_version}", f"transformers=={IMAGE_TRANSFORMERS}", IMAGE_TYPER],
                       "transformers")


@pytest.mark.slow
def test_bundle_installs_without_an_index_and_the_quick_check_passes(image_python, tmp_path):
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    missing = subprocess.run([image_python, "-c", "import pydantic"], capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode != 0 and "pydantic" in missing.stderr  # as on the GPU image

    bundle = tmp_path / "bundle"
    _run([sys.executable, ROOT / "tools" / "gpu_bundle.py", "--out", bundle, "--python", python_version,
          "--torch", torch.__version__.split("+")[0], "--transformers", IMAGE_TRANSFORMERS])
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = {w["file"].split("-")[0].lower() for w in manifest["wheels"]}
    assert {"rope_extend", "pydantic", "pydantic_core", "pytest"} <= names
    assert not names & {"torch", "transformers", "numpy", "tokenizers"}  # the image has them
    files = sorted(p.name for p in (bundle / "wheels").iterdir())
    assert files == sorted(w["file"] for w in manifest["wheels"])
    assert sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) < 16 * 2**20  # transfers cap at 64 MiB
    with zipfile.ZipFile(bundle / "wheels" / next(f for f in files if f.startswith("rope_extend"))) as wheel:
        assert any(n.startswith("rope_extend/eval/suites/") for n in wheel.namelist())  # package data

    site, out = tmp_path / "site", tmp_path / "check.json"
    done = _run(["bash", bundle / "run.sh", "--quick", "--out", out], cwd=ROOT,
                env=_offline_env(PYTHON=str(image_python), SITE=str(site)), timeout=900)
    record = json.loads(out.read_text())
    environment = record["environment"]
    assert environment["transformers"] == IMAGE_TRANSFORMERS and environment["python"].startswith(python_version)
    assert environment["rope_extend"].startswith(str(site))  # the bundle's wheel, not this checkout
    assert record["tests"]["rc"] == 0 and record["tests"]["counts"].get("skipped", 0) >= 1, record["tests"]
    rows = record["bench"]["rows"]
    assert record["bench"]["status"] == "done" and not [r for r in rows if "error" in r or "skipped" in r], rows
    lengths = record["bench"]["lengths"]
    for length in lengths:  # the kernel row first, then every variant
        mine = [r["variant"] for r in rows if r["length"] == length]
        assert mine[0] == "kernel: causal flex / sdpa" and len(mine) == 6, mine
    decoded = [r for r in rows if r["length"] == record["bench"]["decode_length"] and "decode_s" in r]
    assert len(decoded) == 5 and all(r["decode_s"] > 0 for r in decoded)
    layers = record["bench"]["shape"]["num_hidden_layers"]
    steps = record["bench"]["decode_steps"]
    for row in decoded:  # the method's own path in every layer of every forward (2 prefills, the steps)
        expected = {} if row["variant"] == "yarn" else {"fused": (2 + steps) * layers}
        assert row["calls"] == expected, row
    lines = [json.loads(line) for line in Path(f"{out}l").read_text().splitlines()]
    assert [line for line in lines if "variant" in line] == rows  # row by row, as they came
    assert "installed into" in done.stdout


def _gpu_bundle():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_bundle
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return gpu_bundle


def test_help_says_how_to_build_and_run_it_on_the_gpu():
    shown = _run([sys.executable, ROOT / "tools" / "gpu_bundle.py", "--help"]).stdout
    assert "python tools/gpu_bundle.py" in shown and "bash gpu-bundle/run.sh --out gpu-check.json" in shown
    assert "on the GPU machine, in a checkout of this repository with gpu-bundle/ copied into its root" in shown


def test_the_project_wheel_leaves_the_checkout_as_it_was(tmp_path):
    """setuptools builds in its source tree: the wheel is built from a copy, so no build/ or *.egg-info appears
    in (or changes in) the checkout; the wheel holds the package data."""

    def leftovers() -> dict:
        return {p.name: p.stat().st_mtime_ns for p in [*ROOT.glob("*.egg-info"), ROOT / "build"] if p.exists()}

    before = leftovers()
    (tmp_path / "work").mkdir()
    wheel = _gpu_bundle().project_wheel(tmp_path / "wheels", tmp_path / "work")
    assert leftovers() == before
    with zipfile.ZipFile(wheel) as archive:
        assert any(n.startswith("rope_extend/eval/suites/") for n in archive.namelist())


def test_model_parts_join_back_into_the_cache(tmp_path):
    """`--model`'s parts (each at most the part size) are joined by run.sh into rope-extend's cache, where
    `demo_model` finds the GGUF, and checked against SHA256SUMS: a missing part stops run.sh with exit 2 and
    leaves no file in the cache. (A 2.5-part stand-in for the 98 MB GGUF; run.sh goes on to gpu_check.py --help.)"""
    gpu_bundle = _gpu_bundle()
    source = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    source.write_bytes(os.urandom(2500))
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "requirements.txt").write_text("pip\n")  # already there: pip installs nothing, without an index
    parts = gpu_bundle.split_model(source, bundle / "model", part_bytes=1000)
    assert [p["bytes"] for p in parts] == [1000, 1000, 500]
    (bundle / "run.sh").write_text((ROOT / "tools" / "gpu_bundle_run.sh").read_text())
    cache = tmp_path / "cache"
    env = _offline_env(PYTHON=sys.executable, SITE=str(tmp_path / "site"), ROPE_EXTEND_CACHE=str(cache))
    done = _run(["bash", bundle / "run.sh", "--help"], cwd=ROOT, env=env)
    assert "joined" in done.stdout and "--budget" in done.stdout
    from rope_extend.demo_model import GGUF_NAME, GGUF_SUBDIR

    assert (cache / GGUF_SUBDIR / GGUF_NAME).read_bytes() == source.read_bytes()
    (cache / GGUF_SUBDIR / GGUF_NAME).unlink()
    (bundle / "model" / f"{source.name}.part-01").unlink()
    failed = subprocess.run(["bash", str(bundle / "run.sh"), "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True)
    assert failed.returncode == 2 and "do not join" in failed.stderr
    assert not list((cache / GGUF_SUBDIR).iterdir())


# --- the check's own guards: a row that measured something else fails ------------------------------------------------
TINY_SHAPE = dict(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_hidden_layers=2, vocab_size=256, max_position_embeddings=64, rope_theta=10000.0,
                  tie_word_embeddings=True)


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import attention_methods

    return attention_methods, attention_methods.synthetic_model(TINY_SHAPE, "cpu", torch.float32)


def test_each_row_counts_the_path_its_method_took(bench):
    """2 prefills and 2 decoding steps of 160 tokens on a 2-layer model (L = 64): self-extend's fused path in each
    layer of each forward (CPU's default), dual-chunk forced onto the passes path with its primitive's masked calls
    in the prefills (3 passes) and one decode call per layer in the steps (one softmax over the passes' slices),
    YaRN reaching neither."""
    module, model = bench
    calls = lambda spec, path: module.measure_variant(model, spec, path, 160, 2, 2, "cpu")["calls"]
    assert calls({"method": "self-extend"}, None) == {"fused": 8}
    assert calls({"method": "dual-chunk"}, "passes") == {"passes": 8, "masked": 12, "decode": 4}
    assert calls({"method": "yarn"}, None) == {}


def test_a_row_whose_cache_stays_empty_or_whose_method_is_not_reached_fails(bench, monkeypatch):
    """The cache keyword a transformers release swallows (5.17 and `cache=`) leaves the cache empty: the row fails
    naming it; so does a method whose layers take another path than the one the row names."""
    from rope_extend import compat
    from rope_extend.attention import kernels

    module, model = bench
    select = kernels.select_path
    monkeypatch.setattr(kernels, "select_path", lambda device, start, case, mapping: "general")
    with pytest.raises(module.CheckFailed, match="fused path in 2 layers expected, got {'general': 2}"):
        module.measure_variant(model, {"method": "self-extend"}, None, 160, 0, 1, "cpu")
    monkeypatch.setattr(kernels, "select_path", select)
    monkeypatch.setattr(compat, "GENERATE_CACHE_KEYWORD", "swallowed_cache")
    with pytest.raises(module.CheckFailed, match="cache holds 0 tokens after a prefill of 160.*swallowed_cache="):
        module.measure_variant(model, {"method": "yarn"}, None, 160, 0, 1, "cpu")
