"""Evaluation suites (YAML) and their expansion into individual, resumable cases.

Suite YAML (see ``eval/suites/*.yaml``)::

    name: quick
    seed: 0
    short_context: [2048]          # always evaluated: lengths inside the original window
    perplexity:
      text: pydoc_topics           # or a path to any UTF-8 text file
      lengths: [2048, 8192, "2x"]  # ints, or "<k>x" = k * original window
      bucket_size: 1024
      chunk_size: 1024
    passkey:
      lengths: [4096, "1.5x"]
      depths: [0.1, 0.5, 0.9]
      samples: 1                   # samples per (length, depth)
    needle:
      tasks: [niah_single, niah_multikey, niah_multivalue, vt]
      lengths: [4096, 12288]
      depths: [0.5]
      samples: 1
      num_needles: 4
    entropy:                       # mean attention entropy per layer (eager attention: n x n per layer)
      lengths: [1024, 4096]
      queries: 128                 # entropy of the last 128 query rows (they see ~n keys)

Lengths given as ``"<k>x"`` are resolved against the unpatched model's original context
window.  ``short_context`` lengths (clipped to the original window; never empty -- it falls
back to ``min(2048, window)``) are merged into every section so short-context regressions
always show up in the report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SUITES_DIR = Path(__file__).parent / "suites"  # -> eval/suites (symlink in the repo, copied into wheels)


@dataclass
class Case:
    """One unit of work; ``case_id`` is stable across runs (used for resuming)."""

    kind: str  # "perplexity" | "passkey" | "entropy" | needle task name
    length: int
    depth: float | None = None
    index: int = 0
    params: dict = field(default_factory=dict)

    @property
    def case_id(self) -> str:
        parts = [self.kind, f"L{self.length}"]
        if self.depth is not None:
            parts.append(f"d{self.depth:g}")
        if self.kind not in ("perplexity", "entropy"):
            parts.append(f"s{self.index}")
        return "/".join(parts)


@dataclass
class Suite:
    name: str = "custom"
    seed: int = 0
    short_context: list = field(default_factory=lambda: [2048])
    perplexity: dict | None = None
    passkey: dict | None = None
    needle: dict | None = None
    entropy: dict | None = None
    source: str | None = None

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> Suite:
        known = {"name", "seed", "short_context", "perplexity", "passkey", "needle", "entropy", "description"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown suite keys: {sorted(unknown)}")
        return cls(
            name=str(d.get("name", "custom")),
            seed=int(d.get("seed", 0)),
            short_context=list(d.get("short_context", [2048]) or []),
            perplexity=d.get("perplexity"),
            passkey=d.get("passkey"),
            needle=d.get("needle"),
            entropy=d.get("entropy"),
            source=source,
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "seed": self.seed,
            "short_context": self.short_context,
            "perplexity": self.perplexity,
            "passkey": self.passkey,
            "needle": self.needle,
            "entropy": self.entropy,
        }

    def cases(self, original_length: int) -> list[Case]:
        """All cases, cheapest first within each section (short lengths first)."""
        short = sorted({resolve_length(x, original_length) for x in self.short_context})
        short = [s for s in short if s <= original_length]
        if not short:  # the short-context regression check is always part of a report
            short = [min(2048, original_length)]
        out: list[Case] = []
        if self.perplexity:
            p = self.perplexity
            lengths = _lengths(p.get("lengths", []), original_length, short)
            params = {k: p[k] for k in ("text", "bucket_size", "chunk_size", "start") if k in p}
            out += [Case("perplexity", L, params=params) for L in lengths]
        if self.passkey:
            p = self.passkey
            lengths = _lengths(p.get("lengths", []), original_length, short)
            for L in lengths:
                for d in p.get("depths", [0.5]):
                    for i in range(int(p.get("samples", 1))):
                        out.append(Case("passkey", L, float(d), i))
        if self.needle:
            p = self.needle
            from .probes import NEEDLE_TASKS

            tasks = p.get("tasks", ["niah_single"])
            for t in tasks:
                if t not in NEEDLE_TASKS:
                    raise ValueError(f"unknown needle task {t!r}; expected one of {NEEDLE_TASKS}")
            lengths = _lengths(p.get("lengths", []), original_length, short)
            params = {k: p[k] for k in ("num_needles",) if k in p}
            for t in tasks:
                depths = [None] if t in ("niah_multivalue", "vt") else p.get("depths", [0.5])
                for L in lengths:
                    for d in depths:
                        for i in range(int(p.get("samples", 1))):
                            out.append(Case(t, L, None if d is None else float(d), i, dict(params)))
        if self.entropy:
            p = self.entropy
            lengths = _lengths(p.get("lengths", []), original_length, short)
            params = {k: p[k] for k in ("text", "queries") if k in p}
            out += [Case("entropy", L, params=params) for L in lengths]
        return out


def resolve_length(x, original_length: int) -> int:
    """``4096`` -> 4096; ``"2x"`` -> 2 * original_length; ``"8k"`` -> 8192."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return int(x)
    s = str(x).strip().lower()
    if s.endswith("x"):
        return round(float(s[:-1]) * original_length)
    if s.endswith("k"):
        return round(float(s[:-1]) * 1024)
    return int(s)


def _lengths(raw, original_length: int, short: list[int]) -> list[int]:
    vals = {resolve_length(x, original_length) for x in raw} | set(short)
    return sorted(v for v in vals if v > 0)


def load_suite(suite: str | os.PathLike | dict | Suite) -> Suite:
    """A ``Suite`` from a Suite, a dict, a YAML path, or a bundled suite name (``quick``, ``full``)."""
    if isinstance(suite, Suite):
        return suite
    if isinstance(suite, dict):
        return Suite.from_dict(suite)
    path = Path(suite).expanduser()
    if not path.is_file():
        cand = SUITES_DIR / f"{suite}.yaml"
        if cand.is_file():
            path = cand
        else:
            avail = sorted(p.stem for p in SUITES_DIR.glob("*.yaml")) if SUITES_DIR.is_dir() else []
            raise FileNotFoundError(f"suite {suite!r} not found (bundled suites: {avail})")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    return Suite.from_dict(data, source=str(path))
