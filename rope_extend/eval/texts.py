"""Long local texts for perplexity evaluation (no downloads needed).

Two unrelated built-in corpora, reported separately:

* ``pydoc_topics``: the prose of the Python docs that ships with the stdlib (``pydoc_data/topics.py``,
  ~100k tokens): technical English about a programming language.
* ``debian_licenses``: the license texts every Debian/Ubuntu system carries in ``/usr/share/common-licenses``
  (package ``base-files``; ~45k tokens): legal English. Older versions of a license that is already included
  (GFDL-1.2, LGPL-2) are left out so the text repeats itself as little as possible.

Any other name is read as the path of a UTF-8 text file (``--text``).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

DEFAULT_TEXT = "pydoc_topics"
LICENSES_TEXT = "debian_licenses"
LICENSES_DIR = Path("/usr/share/common-licenses")
# Most distinct first (short lengths see the least self-repetition); symlinks (GPL -> GPL-3 ...) excluded.
LICENSE_FILES = ("Apache-2.0", "GPL-3", "MPL-2.0", "GFDL-1.3", "Artistic", "CC0-1.0", "BSD", "MPL-1.1",
                 "GPL-2", "LGPL-2.1", "GPL-1", "LGPL-3")
BUILTIN_TEXTS = (DEFAULT_TEXT, LICENSES_TEXT)


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


def license_files(names, directory: str | os.PathLike = LICENSES_DIR, *, strip: bool = True) -> tuple[str, list[str]]:
    """The license texts *names* present in *directory*, in that order, joined by blank lines (each stripped of
    surrounding whitespace when *strip*), and the names that are missing."""
    directory = Path(directory)
    present = [name for name in names if (directory / name).is_file()]
    texts = [(directory / name).read_text(encoding="utf-8", errors="replace") for name in present]
    return "\n\n".join(t.strip() if strip else t for t in texts), [n for n in names if n not in present]


def debian_licenses_text(directory: str | os.PathLike = LICENSES_DIR) -> str:
    """The Debian common license texts in a fixed order, joined by blank lines (~190k characters)."""
    text, missing = license_files(LICENSE_FILES, directory)
    if missing:
        raise FileNotFoundError(
            f"evaluation text {LICENSES_TEXT!r} needs {', '.join(missing)} in {directory} (Debian package "
            f"base-files); on other systems pass --text FILE or use {DEFAULT_TEXT!r}"
        )
    return text


def check_text(source: str | os.PathLike | None) -> None:
    """FileNotFoundError, as `load_text` would raise it, for a text that is neither built in nor a file (without
    reading anything: `eval` checks its texts before loading a model)."""
    if source is None or str(source) in (*BUILTIN_TEXTS, "default"):
        return
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"evaluation text not found: {path} (built-in texts: {', '.join(BUILTIN_TEXTS)})"
        )


def load_text(source: str | os.PathLike | None = None) -> str:
    """``None``/``"pydoc_topics"``/``"default"`` -> stdlib docs prose; ``"debian_licenses"`` -> Debian's
    license texts; anything else is a text file path."""
    if source is None or str(source) in (DEFAULT_TEXT, "default"):
        return pydoc_topics_text()
    if str(source) == LICENSES_TEXT:
        return debian_licenses_text()
    check_text(source)
    return Path(source).expanduser().read_text(encoding="utf-8", errors="replace")


def text_label(source: str | os.PathLike | None) -> str:
    if source is None or str(source) in (DEFAULT_TEXT, "default"):
        return DEFAULT_TEXT
    if str(source) in BUILTIN_TEXTS:
        return str(source)
    return Path(source).name
