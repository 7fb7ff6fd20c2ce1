"""Docs generated from the registry: the method table in docs/methods.md and `rope-extend methods`.

`python -m rope_extend.methods.docs docs/methods.md` rewrites the table between the markers;
tests/test_readme.py fails when the page is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .registry import ALIASES, all_methods

START, END = "<!-- methods-table:start -->", "<!-- methods-table:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def method_table() -> str:
    """The markdown method table, one row per registered method."""
    rows = [
        "| method | inverse frequencies | attention factor | parameters (defaults) | use when | paper |",
        "|---|---|---|---|---|---|",
    ]
    for method in all_methods():
        aliases = sorted(alias for alias, name in ALIASES.items() if name == method.name)
        name = f"`{method.name}`" + (f" ({', '.join(aliases)})" if aliases else "")
        if method.dynamic:
            name += ", dynamic"
        rows.append(
            f"| {name} | `{_cell(method.formula)}` | `{_cell(method.attention)}` | {_cell(method.param_doc())} | "
            f"{_cell(method.use_when)} | [link]({method.paper}) |"
        )
    return "\n".join(rows)


def replace_between_markers(text: str, body: str, start: str = START, end: str = END) -> str:
    """`text` with everything between the start and end markers replaced by `body`."""
    if start not in text or end not in text:
        raise ValueError(f"markers {start} / {end} not found; add them where the generated text belongs")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/methods.md")
    path.write_text(replace_between_markers(path.read_text(), method_table()))
    print(f"updated the method table in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
