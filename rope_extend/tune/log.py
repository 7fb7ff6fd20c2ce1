"""The resumable search log: one JSON line per evaluated candidate, flushed and fsynced before the next starts.

The first line describes the run (model, target, text fingerprint, budget...). Rerunning with the same settings
reads the log back and skips every (candidate, length) already evaluated, so a killed run continues where it
stopped and ends with exactly the result of an uninterrupted run. A log written with other settings is refused
instead of being mixed in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class SearchLog:
    def __init__(self, path: str | Path | None, header: dict[str, Any], resume: bool = True):
        self.path = Path(path) if path else None
        self.header = header
        self.records: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int], dict[str, Any]] = {}
        if self.path is None:
            return
        if self.path.exists() and resume:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self._append({"kind": "run", **header})

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        parsed = []
        for n, line in enumerate(lines):
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                if n == len(lines) - 1:  # a line cut by a kill mid-write: drop it, it is re-evaluated
                    break
                raise ValueError(f"search log {self.path} line {n + 1} is not JSON; delete the file to restart") from None
        if not parsed or parsed[0].get("kind") != "run":
            raise ValueError(f"{self.path} is not a tune log (no run header); delete it or choose another -o folder")
        old = {k: v for k, v in parsed[0].items() if k != "kind"}
        if old != json.loads(json.dumps(self.header)):
            diff = sorted(k for k in set(old) | set(self.header) if old.get(k) != json.loads(json.dumps(self.header.get(k))))
            raise ValueError(
                f"{self.path} was written by a run with other settings ({', '.join(diff)} differ); "
                "rerun with the same settings to resume, or use --no-resume / another output folder to start over"
            )
        # rewrite without a possibly truncated tail so later appends start on a fresh line
        with open(self.path, "w") as fh:
            for rec in parsed:
                fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        for rec in parsed[1:]:
            if rec.get("kind") == "eval":
                self.records.append(rec)
                self._index[(rec["key"], rec["length"])] = rec

    def _append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def get(self, key: str, length: int) -> dict[str, Any] | None:
        return self._index.get((key, length))

    def add(self, record: dict[str, Any]) -> None:
        record = {"kind": "eval", **record}
        self._append(record)
        self.records.append(record)
        self._index[(record["key"], record["length"])] = record
