"""Synthetic long-context probes: passkey retrieval and RULER-style needle-in-a-haystack.

Every prompt is assembled from *token ids* (each segment tokenised on its own and
concatenated), so its length is exactly the requested number of tokens.  A prompt whose
fixed parts (instructions, needles, question) do not fit is an error, never truncated.

Samples are deterministic: the random state is seeded from a string that names the task,
length, depth, sample index and the user seed.

Depth is measured over the filler *before the question's guard*: at least ``MIN_FILLER_AFTER`` filler tokens
always sit between the last needle and the question, so depth 100 % is "the needle, a few sentences of filler,
then the question" and never "the needle glued to the question" (which small models answer by copying the
question's own words: a format artifact, not a retrieval failure).

Two haystacks (reported separately, like the two perplexity texts): ``filler``, the classic repeated sentences,
and real prose (``pydoc_topics``: the stdlib docs text of :mod:`.texts`, or any text file). The Debian licence
text is the tune command's held-out text; do not use it as a haystack for anything that picks parameters.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

PASSKEY_FILLER = [
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
]
PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize them. I will quiz you about the important information there."
)
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"

FILLER = "filler"  # the classic repeated passkey sentences; any other haystack name is a text (see .texts)
PROSE = "pydoc_topics"
HAYSTACKS = (FILLER, PROSE)
# Filler tokens always kept between the last needle and the question (a quarter of the filler if the prompt has
# less than four times this much).
MIN_FILLER_AFTER = 64

_NIAH_PREFIX = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards."
)
_NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
_NIAH_Q_SINGLE = (
    "What is the special magic number for {key} mentioned in the provided text? "
    "The special magic number for {key} mentioned in the provided text is"
)
_NIAH_Q_MULTI = (
    "What are all the special magic numbers for {key} mentioned in the provided text? "
    "The special magic numbers for {key} mentioned in the provided text are"
)
_VT_PREFIX = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text."
)
_VT_QUESTION = (
    "Question: Find all variables that are assigned the value {value} in the text above. "
    "Answer: According to the chain(s) of variable assignment in the text above, {n} variables "
    "are assigned the value {value}, they are:"
)

# Small fixed vocabulary for needle keys (RULER uses random English words).
_KEY_WORDS = ["apple", "river", "candle", "marble", "falcon", "garden", "harbor", "island", "jungle", "kettle", "lantern", "meadow", "needle", "orange", "pepper", "quartz", "rocket", "saddle", "timber", "umbrella", "valley", "walnut", "yellow", "zephyr", "anchor", "bishop", "cactus", "dragon", "ember", "fossil", "glacier", "hammer", "igloo", "jasmine", "koala", "lemon", "magnet", "nectar", "oyster", "pirate", "quiver", "raven", "sphinx", "tundra", "unicorn", "violet", "wizard", "xylophone", "yogurt", "zebra", "amber", "breeze", "cobalt", "dune", "echo", "fable", "grove", "helium", "ivory", "jade", "karma", "lotus"]


@dataclass
class ProbeSample:
    """One tokenised probe prompt plus what a correct answer must contain."""

    task: str
    length: int
    depth: float | None
    index: int
    input_ids: list[int]
    answers: list[str]
    needle_positions: list[int] = field(default_factory=list)  # token offset of each needle
    max_new_tokens: int = 12

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("input_ids")
        return d


def _rng(*parts) -> random.Random:
    return random.Random("|".join(str(p) for p in parts))


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class Haystack:
    """Sentence-granular filler token stream (the classic passkey sentences, or any text).

    Sentences are tokenised on demand (a long prose text costs only what a prompt uses)."""

    def __init__(self, tokenizer, sentences: list[str] | None = None, name: str = FILLER):
        self.name = name
        self._tok = tokenizer
        self._raw = [s.strip() for s in (sentences or PASSKEY_FILLER) if s.strip()]
        if not self._raw:
            raise ValueError(f"haystack {name!r} has no sentences")
        self._ids: list[list[int]] = []

    @classmethod
    def from_text(cls, tokenizer, text: str, name: str) -> Haystack:
        """A prose haystack: *text* split into sentences (after ``.``, ``!``, ``?`` and at line breaks)."""
        return cls(tokenizer, re.split(r"(?<=[.!?])\s+|\s*\n\s*", text), name=name)

    def _sentence(self, i: int) -> list[int]:
        i %= len(self._raw)
        while len(self._ids) <= i:  # leading space: sentences concatenate the way they would in running text
            self._ids.append(_encode(self._tok, " " + self._raw[len(self._ids)]))
        return self._ids[i]

    @property
    def sentences(self) -> list[list[int]]:
        return [self._sentence(i) for i in range(len(self._raw))]

    def tokens(self, n: int, offset: int = 0) -> tuple[list[int], list[int]]:
        """First *n* filler tokens (cycling) and the sentence-boundary offsets within them."""
        out: list[int] = []
        bounds = [0]
        i = offset
        while len(out) < n:
            out.extend(self._sentence(i))
            bounds.append(len(out))
            i += 1
        out = out[:n]
        bounds = [b for b in bounds if b <= n]
        if bounds[-1] != n:
            bounds.append(n)
        return out, bounds


_HAYSTACK_CACHE: dict[tuple, Haystack] = {}


def haystack(tokenizer, name: str | Haystack | None = None) -> Haystack:
    """The haystack called *name*: ``"filler"`` (default, the classic sentences), a built-in text
    (``pydoc_topics``) or a UTF-8 text file path; cached per tokenizer."""
    if isinstance(name, Haystack):
        return name
    name = name or FILLER
    key = (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), len(tokenizer), str(name))
    if key not in _HAYSTACK_CACHE:
        if name == FILLER:
            _HAYSTACK_CACHE[key] = Haystack(tokenizer)
        else:
            from .texts import load_text, text_label

            _HAYSTACK_CACHE[key] = Haystack.from_text(tokenizer, load_text(name), text_label(name))
    return _HAYSTACK_CACHE[key]


def filler_after(n_fill: int) -> int:
    """Filler tokens kept between the last needle and the question for a prompt with *n_fill* filler tokens."""
    return min(MIN_FILLER_AFTER, n_fill // 4)


def _assemble(
    tokenizer,
    task: str,
    length: int,
    head: list[int],
    needles: list[list[int]],
    depths: list[float],
    tail: list[int],
    haystack: Haystack,
) -> tuple[list[int], list[int]]:
    """Place *needles* at fractional *depths* of the filler so the prompt is exactly *length* tokens.

    Depth runs over the filler that may precede a needle: ``0`` is right after the instructions, ``1`` leaves
    :func:`filler_after` filler tokens (whole sentences) between the needle and the question."""
    fixed = len(head) + sum(len(n) for n in needles) + len(tail)
    n_fill = length - fixed
    if n_fill < 0:
        raise ValueError(
            f"{task}: prompt needs {fixed} tokens (instructions {len(head)}, needles "
            f"{sum(len(n) for n in needles)}, question {len(tail)}) but the requested length is "
            f"{length}; refusing to truncate"
        )
    filler, bounds = haystack.tokens(n_fill)
    usable = n_fill - filler_after(n_fill)
    allowed = [b for b in bounds if b <= usable]  # bounds[0] == 0 is always allowed
    order = sorted(range(len(needles)), key=lambda k: depths[k])
    cuts = []
    for k in order:
        target = depths[k] * usable
        cuts.append(min(allowed, key=lambda b: abs(b - target)))
    ids = list(head)
    positions = [0] * len(needles)
    prev = 0
    for k, cut in zip(order, sorted(cuts)):
        ids.extend(filler[prev:cut])
        positions[k] = len(ids)
        ids.extend(needles[k])
        prev = cut
    ids.extend(filler[prev:])
    ids.extend(tail)
    assert len(ids) == length, (len(ids), length)
    return ids, positions


def make_passkey(
    tokenizer, length: int, depth: float, index: int = 0, seed: int = 0, haystack: Haystack | str | None = None
) -> ProbeSample:
    """Classic passkey prompt of exactly *length* tokens with a 5-digit key at *depth* (0..1)."""
    from .perplexity import special_prefix

    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    key = str(_rng("passkey", seed, length, depth, index).randint(10000, 99999))
    head = special_prefix(tokenizer) + _encode(tokenizer, PASSKEY_PREFIX)
    needle = _encode(tokenizer, " " + PASSKEY_NEEDLE.format(key=key))
    tail = _encode(tokenizer, " " + PASSKEY_QUESTION)
    hay = _haystack_of(tokenizer, haystack)
    ids, pos = _assemble(tokenizer, "passkey", length, head, [needle], [depth], tail, hay)
    return ProbeSample("passkey", length, depth, index, ids, [key], pos, PROBES["passkey"].max_new_tokens())


def _haystack_of(tokenizer, h) -> Haystack:
    return h if isinstance(h, Haystack) else haystack(tokenizer, h)


def _value(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _var_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


def _needle_start(tokenizer, task, length, depth, index, seed, num_needles, haystack):
    """What every needle probe starts from: its seeded random state, haystack, leading special tokens and encoder."""
    from .perplexity import special_prefix

    rng = _rng(task, seed, length, depth, index, num_needles)

    def enc(s: str) -> list[int]:
        return _encode(tokenizer, " " + s)

    return rng, _haystack_of(tokenizer, haystack), special_prefix(tokenizer), enc


def make_vt(tokenizer, length: int, depth: float = 0.5, index: int = 0, seed: int = 0, num_needles: int = 4,
            haystack: Haystack | str | None = None) -> ProbeSample:
    """Variable tracking: a chain of *num_needles* assignments spread through the text; name every variable."""
    rng, hay, bos, enc = _needle_start(tokenizer, "vt", length, depth, index, seed, num_needles, haystack)
    value = str(rng.randint(10000, 99999))
    names: list[str] = []
    while len(names) < num_needles:
        n = _var_name(rng)
        if n not in names:
            names.append(n)
    stmts = [f"VAR {names[0]} = {value}."] + [
        f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, num_needles)
    ]
    depths = sorted(rng.uniform(0.0, 1.0) for _ in stmts)
    head = bos + _encode(tokenizer, _VT_PREFIX)
    tail = enc(_VT_QUESTION.format(value=value, n=num_needles))
    ids, pos = _assemble(tokenizer, "vt", length, head, [enc(s) for s in stmts], depths, tail, hay)
    return ProbeSample("vt", length, None, index, ids, names, pos, PROBES["vt"].max_new_tokens(num_needles))


def _niah(task: str, needles_of: Callable) -> Callable[..., ProbeSample]:
    """A NIAH probe: key/value needles (``needles_of(rng, keys, depth, num_needles, enc)`` gives the needles, their
    depths, the question, the answers and the depth the sample records); the answer's token budget is the
    registered probe's (`Probe.max_new_tokens`)."""

    def make(tokenizer, length: int, depth: float = 0.5, index: int = 0, seed: int = 0, num_needles: int = 4,
             haystack: Haystack | str | None = None) -> ProbeSample:
        rng, hay, bos, enc = _needle_start(tokenizer, task, length, depth, index, seed, num_needles, haystack)
        keys = rng.sample(_KEY_WORDS, k=max(num_needles, 1))
        head = bos + _encode(tokenizer, _NIAH_PREFIX.format(kind="numbers"))
        needles, depths, tail, answers, recorded = needles_of(rng, keys, depth, num_needles, enc)
        ids, pos = _assemble(tokenizer, task, length, head, needles, depths, tail, hay)
        return ProbeSample(task, length, recorded, index, ids, answers, pos, PROBES[task].max_new_tokens(num_needles))

    make.__name__ = f"make_{task}"
    return make


def _single(rng, keys, depth, num_needles, enc):
    """One key/value needle at *depth*; answer the value."""
    key, value = keys[0], _value(rng)
    return [enc(_NIAH_NEEDLE.format(key=key, value=value))], [depth], enc(_NIAH_Q_SINGLE.format(key=key)), [value], depth


def _multikey(rng, keys, depth, num_needles, enc):
    """*num_needles* needles with distinct keys (the others are distractors); the queried one sits at *depth*."""
    values = [_value(rng) for _ in keys]
    needles = [enc(_NIAH_NEEDLE.format(key=k, value=v)) for k, v in zip(keys, values)]
    depths = [depth] + [rng.uniform(0.0, 1.0) for _ in keys[1:]]
    return needles, depths, enc(_NIAH_Q_SINGLE.format(key=keys[0])), [values[0]], depth


def _multivalue(rng, keys, depth, num_needles, enc):
    """*num_needles* values for the same key, spread at random depths; all must be recalled."""
    key = keys[0]
    values: list[str] = []
    while len(values) < num_needles:
        v = _value(rng)
        if v not in values:
            values.append(v)
    needles = [enc(_NIAH_NEEDLE.format(key=key, value=v)) for v in values]
    depths = [rng.uniform(0.0, 1.0) for _ in values]
    return needles, depths, enc(_NIAH_Q_MULTI.format(key=key)), values, None


def first_number(sample: ProbeSample, output: str) -> float:
    """1.0/0.0: the first number in the output must be the answer."""
    nums = re.findall(r"\d+", output)
    return float(bool(nums) and nums[0] == sample.answers[0])


def recall(pattern: str) -> Callable[[ProbeSample, str], float]:
    """The fraction of the answers found in the output (the tokens matching *pattern*)."""

    def score(sample: ProbeSample, output: str) -> float:
        found = set(re.findall(pattern, output))
        return sum(a in found for a in sample.answers) / len(sample.answers)

    return score


# ---------------------------------------------------------------- the probes, registered once


@dataclass(frozen=True)
class Probe:
    """A probe task: the one place that names it. Its cases (`eval.suite`), prompts (`make_probe`), scoring
    (`score`), lm-eval data (`eval.lm_tasks`) and place in an interleaved run (`eval.jobs`) read it from here.

    section: the suite section that asks for it (``passkey`` or ``needle``: its tasks, lengths, depths, samples);
    make: ``(tokenizer, length, depth, index=, seed=, haystack=, [num_needles=]) -> ProbeSample``;
    spread: its needles sit at random depths (one depth-less case per sample, as many per length as the others);
    needles: it takes ``num_needles`` (the section's ``num_needles``);
    answer_tokens: the new tokens greedy decoding gets for one answer (a 5-digit key: 8; a 7-digit number and its
    punctuation: 12; a 5-letter variable name: 8), times ``num_needles`` where *per_needle* (every needle is an
    answer). `max_new_tokens` is the one budget every route uses: eval's own prompts, a run engine's requests and
    the lm-eval tasks (each doc carries it; ``eval/tasks/utils.ProbeTask`` gives it to lm-eval per prompt)."""

    name: str
    section: str
    make: Callable[..., ProbeSample]
    score: Callable[[ProbeSample, str], float]
    answer_tokens: int
    spread: bool = False
    needles: bool = False
    per_needle: bool = False

    def max_new_tokens(self, num_needles: int = 1) -> int:
        """The answer's token budget for a prompt with *num_needles* needles."""
        return self.answer_tokens * (num_needles if self.per_needle else 1)


PROBES: dict[str, Probe] = {}
SECTIONS = ("passkey", "needle")  # the suite's probe sections, in run order


def register_probe(probe: Probe) -> Probe:
    """Register *probe* under its name (once)."""
    if probe.name in PROBES:
        raise ValueError(f"probe {probe.name!r} is already registered; pick another name")
    if probe.section not in SECTIONS:
        raise ValueError(f"probe {probe.name!r}: section {probe.section!r} is not one of {', '.join(SECTIONS)}")
    PROBES[probe.name] = probe
    return probe


def probe_names(section: str | None = None) -> tuple[str, ...]:
    """The registered probes (of one suite section), in registration order."""
    return tuple(name for name, p in PROBES.items() if section in (None, p.section))


def get_probe(name: str) -> Probe:
    if name not in PROBES:
        raise ValueError(f"unknown probe task {name!r}; expected one of {', '.join(PROBES)}")
    return PROBES[name]


register_probe(Probe("passkey", "passkey", make_passkey, first_number, answer_tokens=8))
register_probe(Probe("niah_single", "needle", _niah("niah_single", _single), first_number, answer_tokens=12,
                     needles=True))
register_probe(Probe("niah_multikey", "needle", _niah("niah_multikey", _multikey), first_number, answer_tokens=12,
                     needles=True))
register_probe(Probe("niah_multivalue", "needle", _niah("niah_multivalue", _multivalue), recall(r"\d+"),
                     answer_tokens=12, spread=True, needles=True, per_needle=True))
register_probe(Probe("vt", "needle", make_vt, recall(r"[A-Z]{5}"), answer_tokens=8, spread=True, needles=True,
                     per_needle=True))

def make_needle(
    tokenizer,
    task: str,
    length: int,
    depth: float = 0.5,
    index: int = 0,
    seed: int = 0,
    num_needles: int = 4,
    haystack: Haystack | str | None = None,
) -> ProbeSample:
    """RULER-style probe of exactly *length* tokens: ``niah_single``, ``niah_multikey``, ``niah_multivalue`` or
    ``vt`` (see each probe's builder)."""
    if task not in probe_names("needle"):
        raise ValueError(f"unknown needle task {task!r}; expected one of {probe_names('needle')}")
    return PROBES[task].make(tokenizer, length, depth, index=index, seed=seed, num_needles=num_needles,
                             haystack=haystack)


def make_probe(tokenizer, task: str, length: int, depth: float = 0.5, index: int = 0, seed: int = 0, **kw):
    probe = get_probe(task)
    if not probe.needles:
        kw.pop("num_needles", None)
    return probe.make(tokenizer, length, depth, index=index, seed=seed, **kw)


def score(sample: ProbeSample, output: str) -> float:
    """1.0/0.0 for single-answer probes (first number in the output must match);
    recall fraction for multi-value and variable-tracking probes."""
    return get_probe(sample.task).score(sample, output)


def generate(model, tokenizer, sample: ProbeSample, cache=None) -> str:
    """Greedy continuation of the probe prompt (new tokens only, decoded).

    ``cache``: a ``DynamicCache`` already holding a prefix of the prompt; only the rest is prefilled.
    """
    import torch

    from .. import compat

    device = next(model.parameters()).device
    ids = torch.tensor([sample.input_ids], device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    extra = {} if cache is None else {compat.GENERATE_CACHE_KEYWORD: cache, "use_cache": True}
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=sample.max_new_tokens,
            do_sample=False,
            num_beams=1,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=pad,
            **extra,
        )
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def run_probe(model, tokenizer, sample: ProbeSample, cache=None) -> dict:
    out = generate(model, tokenizer, sample, cache)
    return {"score": score(sample, out), "output": out, "answers": sample.answers}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def run_probes_sharing_prefix(model, tokenizer, samples: list[ProbeSample]) -> list[dict]:
    """Results of :func:`run_probe` for each sample, prefilling what prompts share only once.

    Prompts of one length share the instructions and the filler up to the first needle. They are run deepest
    needle first, each reusing the previous prompt's KV cache cut back to the tokens both have in common, so
    a prompt only prefills from its needle on. Exact when the cached prefix was computed with the frequencies
    the next prompt would use: always for static RoPE; for a dynamic method only among prompts of one length
    (consistent mode fixes the scale per request from its length). The caller decides (`eval.jobs`).
    """
    from transformers import DynamicCache

    results: list[dict | None] = [None] * len(samples)
    cache = None
    for i, reused in prefix_plan(samples):
        if reused == 0:
            cache = DynamicCache()
        else:  # keep the common tokens
            remove = cache.get_seq_length() - reused
            if remove > 0:
                cache.crop(-remove)  # a negative count removes tokens in transformers 4.x and 5.x alike
        results[i] = run_probe(model, tokenizer, samples[i], cache)
    return results  # type: ignore[return-value]


def prefix_plan(samples: list[ProbeSample]) -> list[tuple[int, int]]:
    """``(sample index, prompt tokens reused from the previous prompt's cache)`` in run order: deepest needle
    first; at least one prompt token is always left to prefill."""
    order = sorted(range(len(samples)), key=lambda i: -min(samples[i].needle_positions or [0]))
    plan, prev = [], None
    for i in order:
        ids = samples[i].input_ids
        reused = 0 if prev is None else min(_common_prefix(prev, ids), len(ids) - 1)
        plan.append((i, reused))
        prev = ids
    return plan
