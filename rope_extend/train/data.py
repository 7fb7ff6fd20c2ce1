"""Training data: documents -> token streams -> fixed-length windows, with PoSE position skipping.

Documents are tokenized once. Each document becomes one stream `[BOS] tokens EOS` (BOS only when the tokenizer's
own encoding starts with it, as Llama's does; SmolLM2's does not). A `--text` file is one document and must hold at
least one window of tokens. Rows of a `datasets` dataset are usually short: consecutive rows are joined into streams
of at least one window, their boundaries marked by the EOS (and BOS) tokens between them. A window never spans two
streams, so no window crosses a document boundary unmarked.

A sample is drawn by its index alone (`numpy` generator seeded with `(seed, index)`): a stream chosen in proportion
to the windows it holds, then a window of it. That makes the data order independent of the process count and of
resuming (Trainer skips the batches it already trained; sample i is the same every time).

PoSE (Zhu et al. 2023, dwzhu-pku/PoSE `train_preprocess_function_pose`): the window of W tokens is two chunks of the
text, chunk 1 = `span[0:r1]` with r1 ~ U[1, (W+1)//2], chunk 2 = the next W - r1 tokens ending at rt2 ~ U[W, S] of a
span of S <= 5W tokens; positions are `arange(W)` with chunk 2 shifted by u ~ U[0, N - W], so the relative distances
seen in training cover the target length N. Positions stay strictly increasing inside a window. The first token of
chunk 2 is not predicted (its label is -100): it does not follow chunk 1 in the text.

Every sample carries an explicit all-ones `attention_mask`: without one, transformers 5 reads a position jump as
the start of a packed sequence and makes the mask block-diagonal (chunk 2 could not see chunk 1).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

IGNORE_INDEX = -100
SPAN_WINDOWS = 5  # PoSE reads chunk 2 from the first 5 W tokens of a document (max_length = 5 * W)
OVERLAP_PROBE_CHARS = 200  # eval/train overlap: any 200-character piece of the eval text found in a training text
OVERLAP_PROBES = 400


@dataclass(frozen=True)
class Document:
    name: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass
class SourceInfo:
    """What the model card says about one input: name, characters, tokens, sha256."""

    name: str
    chars: int
    tokens: int
    sha256: str
    documents: int = 1

    def to_dict(self) -> dict:
        return {"name": self.name, "chars": self.chars, "tokens": self.tokens, "sha256": self.sha256,
                "documents": self.documents}


@dataclass
class Corpus:
    streams: list[np.ndarray]
    sources: list[SourceInfo] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return int(sum(len(s) for s in self.streams))


# --- reading ---------------------------------------------------------------------------------------------------------
def read_text_files(paths: list[str | os.PathLike]) -> list[Document]:
    """One document per file (UTF-8). A missing, unreadable or empty file is refused by name."""
    docs = []
    for path in paths:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"--text {str(path)!r} is not a file; pass a UTF-8 text file")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"--text {str(path)!r} is not UTF-8 text (byte {exc.start}); convert it first") from None
        if not text.strip():
            raise ValueError(f"--text {str(path)!r} is empty; training needs text")
        docs.append(Document(p.name, text))
    return docs


def read_dataset(name: str, split: str = "train", column: str = "text") -> tuple[str, list[Document]]:
    """Rows of a Hugging Face `datasets` dataset: a folder written by `save_to_disk`, a folder of .txt/.json(l)/
    .parquet files, or a Hub dataset id (through the datasets cache; offline when HF_DATASETS_OFFLINE=1)."""
    import datasets

    path = Path(name).expanduser()
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"--dataset {name!r} has no split {split!r} (it has {', '.join(loaded)})")
            loaded = loaded[split]
    elif path.is_dir():
        builder, files = _builder_of(path)
        loaded = datasets.load_dataset(builder, data_files=files, split=split)
    else:
        loaded = datasets.load_dataset(name, split=split)
    if column not in loaded.column_names:
        raise ValueError(f"--dataset {name!r} has no column {column!r} (columns: {', '.join(loaded.column_names)}); "
                         "pass --dataset-column")
    docs = [Document(f"{Path(name).name}[{i}]", text) for i, text in enumerate(loaded[column])
            if isinstance(text, str) and text.strip()]
    if not docs:
        raise ValueError(f"--dataset {name!r} split {split!r} has no non-empty {column!r} rows")
    return Path(name).name, docs


def _builder_of(folder: Path) -> tuple[str, list[str]]:
    kinds = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
    found: dict[str, list[str]] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.suffix in kinds:
            found.setdefault(kinds[p.suffix], []).append(str(p))
    if len(found) != 1:
        raise ValueError(f"--dataset folder {str(folder)!r} must hold files of one kind (.txt, .jsonl/.json, .parquet "
                         f"or .csv) or a save_to_disk dataset; found {', '.join(found) or 'none'}")
    return next(iter(found.items()))


def check_no_overlap(train: list[Document], heldout_text: str, heldout_name: str) -> None:
    """Refuse an eval text that shares text with a training text (held-out text is never trained on): the same
    file, or any of up to 400 evenly spaced 200-character pieces of it found verbatim in a training document."""
    flat = " ".join(heldout_text.split())
    if not flat:
        return
    digests = {d.sha256 for d in train}
    if hashlib.sha256(heldout_text.encode("utf-8")).hexdigest() in digests:
        raise ValueError(f"eval text {heldout_name!r} is one of the training texts; held-out numbers need a text "
                         "the model was not trained on")
    width = min(OVERLAP_PROBE_CHARS, len(flat))
    step = max(1, (len(flat) - width) // OVERLAP_PROBES)
    probes = [flat[i:i + width] for i in range(0, max(len(flat) - width, 0) + 1, step)][:OVERLAP_PROBES]
    for doc in train:
        body = " ".join(doc.text.split())
        for probe in probes:
            if probe in body:
                raise ValueError(f"eval text {heldout_name!r} overlaps training text {doc.name!r} (e.g. "
                                 f"{probe[:40]!r}...); held-out numbers need text the model is not trained on")


# --- tokenizing ------------------------------------------------------------------------------------------------------
def special_tokens(tokenizer) -> tuple[int | None, int | None]:
    """(BOS to prepend or None, EOS to append or None): BOS only where the tokenizer itself adds it."""
    bos = tokenizer.bos_token_id
    probe = tokenizer("a").input_ids
    adds_bos = bos is not None and len(probe) > 0 and probe[0] == bos
    return (bos if adds_bos else None), tokenizer.eos_token_id


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` without special tokens (rope-extend adds BOS/EOS itself)."""
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def build_corpus(tokenizer, groups: list[tuple[str, list[Document], bool]], window: int) -> Corpus:
    """Token streams from groups of documents `(source name, documents, each_is_a_file)`.

    A file document shorter than one window is refused; dataset rows are joined into streams of >= one window."""
    bos, eos = special_tokens(tokenizer)
    head, tail = ([bos] if bos is not None else []), ([eos] if eos is not None else [])
    streams, sources = [], []
    for source, docs, files in groups:
        count, sha = 0, hashlib.sha256()
        pending: list[int] = []
        for doc in docs:
            ids = head + encode(tokenizer, doc.text) + tail
            count += len(ids)
            sha.update(doc.text.encode("utf-8"))
            if files:
                if len(ids) < window + 1:
                    raise ValueError(f"--text {doc.name!r} has {len(ids)} tokens, fewer than one training window "
                                     f"({window} + 1); give a longer text or a smaller --window")
                streams.append(np.asarray(ids, dtype=np.int64))
                sources.append(SourceInfo(doc.name, len(doc.text), len(ids), doc.sha256))
                continue
            pending += ids
            if len(pending) >= window + 1:
                streams.append(np.asarray(pending, dtype=np.int64))
                pending = []
        if not files:
            if pending and streams:
                streams[-1] = np.concatenate([streams[-1], np.asarray(pending, dtype=np.int64)])
            elif pending:
                raise ValueError(f"--dataset {source!r} has {len(pending)} tokens, fewer than one training window "
                                 f"({window} + 1); use more rows or a smaller --window")
            sources.append(SourceInfo(source, sum(len(d.text) for d in docs), count, sha.hexdigest(), len(docs)))
    return Corpus(streams, sources)


# --- sampling --------------------------------------------------------------------------------------------------------
def pose_sample(ids: np.ndarray, window: int, target: int, rng: np.random.Generator) -> dict:
    """One PoSE window from a span `ids` (len >= window): two chunks, positions spanning up to `target`."""
    span = ids[: SPAN_WINDOWS * window]
    size = len(span)
    r1 = int(rng.integers(1, (window + 1) // 2 + 1))  # chunk 1 = span[0:r1]
    rt2 = int(rng.integers(window, size + 1))  # chunk 2 ends at rt2 (PoSE: randint(lt1 + len_chunk, len_input))
    lt2 = rt2 - (window - r1)
    input_ids = np.concatenate([span[:r1], span[lt2:rt2]])
    skip = int(rng.integers(0, target - window + 1))  # PoSE: rt ~ U[0, N - W], lt = 0
    positions = np.arange(window, dtype=np.int64)
    positions[r1:] += skip
    labels = input_ids.copy()
    labels[r1] = IGNORE_INDEX  # chunk 2's first token does not follow chunk 1 in the text
    return {"input_ids": input_ids, "position_ids": positions, "labels": labels}


def full_sample(ids: np.ndarray, window: int) -> dict:
    return {"input_ids": ids[:window].copy(), "position_ids": np.arange(window, dtype=np.int64),
            "labels": ids[:window].copy()}


class WindowDataset:
    """`n` training windows drawn from `corpus` (a map-style torch dataset: `len`, `__getitem__`).

    `window` tokens per sample; with `target > window` PoSE positions spanning `target`, else plain windows."""

    def __init__(self, corpus: Corpus, window: int, target: int, n: int, seed: int):
        if not corpus.streams:
            raise ValueError("no training text: pass --text FILE (repeatable) or --dataset")
        self.corpus, self.window, self.target, self.n, self.seed = corpus, int(window), int(target), int(n), int(seed)
        self.pose = self.target > self.window
        # windows each stream offers: span starts for PoSE (span of up to 5 W), window starts otherwise
        starts = [max(len(s) - self.window, 0) + 1 for s in corpus.streams]
        self.weights = np.asarray(starts, dtype=np.float64) / float(sum(starts))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        import torch

        if not 0 <= index < self.n:
            raise IndexError(index)
        rng = np.random.default_rng([self.seed, int(index)])
        stream = self.corpus.streams[int(rng.choice(len(self.corpus.streams), p=self.weights))]
        start = int(rng.integers(0, len(stream) - self.window + 1))
        if self.pose:
            sample = pose_sample(stream[start:], self.window, self.target, rng)
        else:
            sample = full_sample(stream[start:], self.window)
        out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample.items()}
        out["attention_mask"] = torch.ones(self.window, dtype=torch.long)  # explicit: never "packed sequences"
        return out


def collate(samples: list[dict]) -> dict:
    """Stack equal-length samples (no padding: SDPA keeps its fast path)."""
    import torch

    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}
