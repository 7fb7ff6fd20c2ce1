"""Evaluation suites: a validated model of the suite YAML and its expansion into resumable cases.

Suite YAML (see ``eval/suites/*.yaml``)::

    name: quick
    description: what the suite is for
    smoke: true                    # a plumbing/smoke test: the report header says its numbers are not evidence
    seed: 0                        # picks the probes' keys; another seed is other cases (ids end in /seed<N>)
    short_context: [2048]          # always evaluated: lengths inside the original window
    perplexity:
      texts: [pydoc_topics, debian_licenses]   # built-in corpora or UTF-8 file paths; each reported separately
      lengths: [2048, 8192, "2x"]  # ints, "<k>x" = k * original window, "<k>k" = k * 1024
      bucket_size: 1024            # loss-by-position buckets
      chunk_size: 1024             # positions per lm_head call (memory only)
      block_size: 128              # contiguous token blocks for the bootstrap interval
    passkey:
      lengths: ["1.5x", "2x"]
      depths: [0.0, 0.25, 0.5, 0.75, 1.0]   # over the filler before the question's guard (see eval.probes)
      samples: 2                   # samples per (length, depth): here 10 per length and haystack
      haystacks: [filler, pydoc_topics]     # classic repeated sentences / real prose; each reported separately
      ceiling: true                # also run the unpatched model on the same prompt format at the window
    needle:
      tasks: [niah_single, niah_multikey, niah_multivalue, vt]
      lengths: [4096, 12288]
      depths: [0.5]
      samples: 1
      num_needles: 4
    entropy:                       # mean attention entropy per layer (eager attention: n x n per layer)
      lengths: [1024, 4096]
      queries: 128

An unknown or misspelled key is an error that names it. ``short_context`` lengths (clipped to the original
window; never empty -- it falls back to ``min(2048, window)``) are merged into every section so short-context
regressions always show up in the report.

``ceiling`` (probe sections, on by default): when a section has lengths beyond the original window, the unpatched
model also answers the same prompt format (every depth and haystack) at exactly the window; the report reads each
beyond-window cell against that inside-window ceiling and flags the depths whose format fails there.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import RopeExtendError, yaml_error_detail
from .probes import SECTIONS, get_probe, probe_names
from .texts import DEFAULT_TEXT, text_label

SUITES_DIR = Path(__file__).parent / "suites"  # -> eval/suites (symlink in the repo, copied into wheels)


class SuiteError(RopeExtendError, ValueError):
    """A suite file or dict is invalid (unknown key, bad length or depth, unknown task)."""


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


def _check_length(x):
    try:
        value = resolve_length(x, 1)
    except (TypeError, ValueError):
        raise ValueError(f"length {x!r} is not an int, '<k>x' (times the original window) or '<k>k'") from None
    if value <= 0 and not (isinstance(x, str) and x.strip().lower().endswith("x")):
        raise ValueError(f"length {x!r} must be positive")
    return x


Length = Annotated[int | str, BeforeValidator(_check_length)]
Depth = Annotated[float, Field(ge=0.0, le=1.0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerplexitySection(_Model):
    texts: list[str] = Field(default_factory=lambda: [DEFAULT_TEXT], min_length=1)
    lengths: list[Length] = Field(default_factory=list)
    bucket_size: int = Field(1024, gt=0)
    chunk_size: int = Field(1024, gt=0)
    block_size: int = Field(128, gt=0)
    start: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _single_text(cls, data):
        """``text: X`` (one corpus) is shorthand for ``texts: [X]``."""
        if isinstance(data, dict) and "text" in data:
            if "texts" in data:
                raise ValueError("give either 'text' or 'texts', not both")
            data = {k: v for k, v in data.items() if k != "text"} | {"texts": [data["text"]]}
        return data


def _check_haystacks(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"haystacks {names} repeat a name")
    return names


Haystacks = Annotated[list[str], Field(min_length=1), AfterValidator(_check_haystacks)]


class PasskeySection(_Model):
    lengths: list[Length] = Field(default_factory=list)
    depths: list[Depth] = Field(default_factory=lambda: [0.5], min_length=1)
    samples: int = Field(1, ge=1)
    haystacks: Haystacks = Field(default_factory=lambda: ["filler"])
    ceiling: bool = True

    @property
    def tasks(self) -> tuple[str, ...]:
        return probe_names("passkey")


class NeedleSection(_Model):
    tasks: list[str] = Field(default_factory=lambda: ["niah_single"], min_length=1)
    lengths: list[Length] = Field(default_factory=list)
    depths: list[Depth] = Field(default_factory=lambda: [0.5], min_length=1)
    samples: int = Field(1, ge=1)
    num_needles: int = Field(4, ge=1)
    haystacks: Haystacks = Field(default_factory=lambda: ["filler"])
    ceiling: bool = True

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks):
        for t in tasks:
            if t not in probe_names("needle"):
                raise ValueError(f"unknown needle task {t!r}; expected one of {', '.join(probe_names('needle'))}")
        return tasks


class EntropySection(_Model):
    lengths: list[Length] = Field(default_factory=list)
    queries: int = Field(128, gt=0)
    text: str | None = None


@dataclass
class Case:
    """One unit of work; ``case_id`` is stable across runs (used for resuming)."""

    kind: str  # "perplexity" | "passkey" | "entropy" | needle task name
    length: int
    depth: float | None = None
    index: int = 0
    params: dict = field(default_factory=dict)
    seed: int = 0  # the suite's seed: it picks a probe's keys, so prompts of other seeds are other cases

    @property
    def case_id(self) -> str:
        parts = [self.kind]
        if self.kind == "perplexity":
            parts.append(text_label(self.params.get("text")))
        elif self.is_probe:  # probe ids name their haystack (ids of the old probe format had none: never reused)
            parts.append(text_label(self.params.get("haystack", "filler")))
        parts.append(f"L{self.length}")
        if self.depth is not None:
            parts.append(f"d{self.depth:g}")
        if self.kind not in ("perplexity", "entropy"):
            parts.append(f"s{self.index}")
            if self.seed:  # seed 0 keeps the ids of runs made before seeds were part of them
                parts.append(f"seed{self.seed}")
        return "/".join(parts)

    @property
    def is_probe(self) -> bool:
        return self.kind not in ("perplexity", "entropy")

    @property
    def ceiling_only(self) -> bool:
        """An inside-window ceiling case: run on the unpatched model only."""
        return bool(self.params.get("ceiling"))

    @property
    def haystack(self) -> str | None:
        return text_label(self.params.get("haystack", "filler")) if self.is_probe else None


class Suite(_Model):
    name: str = "custom"
    description: str = ""
    smoke: bool = False
    seed: int = 0
    short_context: list[Length] = Field(default_factory=lambda: [2048])
    perplexity: PerplexitySection | None = None
    passkey: PasskeySection | None = None
    needle: NeedleSection | None = None
    entropy: EntropySection | None = None
    source: str | None = Field(None, exclude=True)  # where it was loaded from (not part of the suite)

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> Suite:
        if not isinstance(d, dict):
            raise SuiteError(f"suite {source or ''} must be a mapping of keys, got {type(d).__name__}")
        try:
            return cls.model_validate({**d, "source": source})
        except ValidationError as exc:
            raise SuiteError(_explain(exc, source)) from None

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    def texts(self) -> list[str]:
        """Every text the suite reads: perplexity texts, the entropy text, probe haystacks other than the filler."""
        names = [*(self.perplexity.texts if self.perplexity else ()), *([self.entropy.text] if self.entropy and
                                                                         self.entropy.text else [])]
        names += [h for section in SECTIONS if (p := getattr(self, section)) for h in p.haystacks if h != "filler"]
        return list(dict.fromkeys(names))

    def with_texts(self, texts: list[str]) -> Suite:
        """The same suite with its perplexity (and entropy) texts replaced, e.g. by ``--text FILE``."""
        update = {}
        if self.perplexity is not None:
            update["perplexity"] = self.perplexity.model_copy(update={"texts": list(texts)})
        if self.entropy is not None:
            update["entropy"] = self.entropy.model_copy(update={"text": texts[0]})
        return self.model_copy(update=update)

    def cases(self, original_length: int) -> list[Case]:
        """All cases, cheapest first within each section (short lengths first)."""
        short = sorted({resolve_length(x, original_length) for x in self.short_context})
        short = [s for s in short if s <= original_length]
        if not short:  # the short-context regression check is always part of a report
            short = [min(2048, original_length)]
        out: list[Case] = []
        if p := self.perplexity:
            params = {"bucket_size": p.bucket_size, "chunk_size": p.chunk_size, "block_size": p.block_size,
                      "start": p.start}
            for text in p.texts:
                out += [Case("perplexity", L, params={"text": text, **params})
                        for L in _lengths(p.lengths, original_length, short)]
        for p in (getattr(self, section) for section in SECTIONS):
            for t in p.tasks if p else ():
                probe = get_probe(t)
                # probes whose needles sit at random depths get as many prompts per length as the others
                depths, samples = ([None], p.samples * len(p.depths)) if probe.spread else (p.depths, p.samples)
                params = {"num_needles": p.num_needles} if probe.needles else {}
                for h in p.haystacks:
                    for L, ceiling in _probe_lengths(p, original_length, short):
                        out += [Case(t, L, d, i, params | {"haystack": h} | ceiling, seed=self.seed)
                                for i in range(samples) for d in depths]
        if p := self.entropy:
            params = {"queries": p.queries} | ({"text": p.text} if p.text else {})
            out += [Case("entropy", L, params=dict(params)) for L in _lengths(p.lengths, original_length, short)]
        return out


def _probe_lengths(section, original_length: int, short: list[int]) -> list[tuple[int, dict]]:
    """``(length, extra params)`` of a probe section: its lengths, then the inside-window ceiling (the window
    itself, unpatched model only) when a length lies beyond the window and the window is not already a length."""
    lengths = _lengths(section.lengths, original_length, short)
    out = [(L, {}) for L in lengths]
    if section.ceiling and max(lengths) > original_length and original_length not in lengths:
        out.append((original_length, {"ceiling": True}))
        out.sort(key=lambda x: x[0])
    return out


def _lengths(raw, original_length: int, short: list[int]) -> list[int]:
    vals = {resolve_length(x, original_length) for x in raw} | set(short)
    return sorted(v for v in vals if v > 0)


def _explain(exc: ValidationError, source: str | None) -> str:
    """One readable line: every problem, an unknown key with the closest allowed key; the keys a section allows
    are listed once per section, after its unknown keys."""
    where = f"suite {source}" if source else "suite"
    problems = []
    unknown: dict[str, tuple[list[str], list[str]]] = {}  # section ("" for the top) -> (its unknown keys, allowed)
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            model: type[BaseModel] = Suite
            for part in err["loc"][:-1]:
                ann = model.model_fields[str(part)].annotation
                model = next(a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel))
            allowed = [k for k in model.model_fields if k != "source"]
            close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
            section = ".".join(str(x) for x in err["loc"][:-1])
            if section not in unknown:
                unknown[section] = ([], allowed)
                problems.append(section)  # placeholder: the section's words go where its first unknown key was
            unknown[section][0].append(f"{loc!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{loc}: {msg} (got {err.get('input')!r})")
    for section, (keys, allowed) in unknown.items():
        words = (f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(keys)}: "
                 f"{section or 'a suite'} allows {', '.join(allowed)}")
        problems[problems.index(section)] = words
    return f"{where} is invalid: " + "; ".join(problems)


def load_suite(suite: str | os.PathLike | dict | Suite) -> Suite:
    """A ``Suite`` from a Suite, a dict, a YAML path, or a bundled suite name (``quick``, ``full``, ``paper``)."""
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
            raise FileNotFoundError(f"suite {str(suite)!r} not found: not a file and not a bundled suite "
                                    f"(bundled: {', '.join(avail)})")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise SuiteError(f"suite {str(path)!r} is not valid YAML{yaml_error_detail(exc)}; quote a value that "
                             "holds ': ' (description: \"a: b\")") from None
    bundled = path.parent.resolve() == SUITES_DIR.resolve()
    return Suite.from_dict(data, source=f"eval/suites/{path.name}" if bundled else str(path))
