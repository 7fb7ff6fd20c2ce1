"""Long local texts for perplexity evaluation (no downloads needed)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

DEFAULT_TEXT = "pydoc_topics"


def pydoc_topics_text() -> str:
    """Prose of the Python docs shipped with the stdlib (``pydoc_data/topics.py``, ~100k tokens).

    The module is parsed (not imported) and only its string literals are kept, joined by
    blank lines in file order, so the result is stable for a given Python version.
    """
    import pydoc_data

    path = Path(pydoc_data.__file__).with_name("topics.py")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Dict)
            for node in node.values
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
    except (OSError, SyntaxError):
        strings = []
    if not strings:  # fall back to importing it
        from pydoc_data.topics import topics

        strings = list(topics.values())
    return "\n\n".join(strings)


def load_text(source: str | os.PathLike | None = None) -> str:
    """``None``/``"pydoc_topics"``/``"default"`` -> stdlib docs prose; anything else is a text file path."""
    if source is None or str(source) in (DEFAULT_TEXT, "default"):
        return pydoc_topics_text()
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"evaluation text not found: {path}")
    return path.read_text(encoding="utf-8", errors="replace")


def text_label(source: str | os.PathLike | None) -> str:
    if source is None or str(source) in (DEFAULT_TEXT, "default"):
        return DEFAULT_TEXT
    return Path(source).name
