"""Probe generators: exact token lengths, needle placement, determinism, no silent truncation."""

from __future__ import annotations

import pytest

from rope_extend.eval.probes import (
    NEEDLE_TASKS,
    PASSKEY_NEEDLE,
    PASSKEY_PREFIX,
    PASSKEY_QUESTION,
    ProbeSample,
    make_needle,
    make_passkey,
    make_probe,
    score,
)
from rope_extend.eval.suite import Suite, load_suite, resolve_length


@pytest.fixture(scope="module")
def tok():
    from rope_extend.eval.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.mark.parametrize("length", [200, 257, 1000, 3001])
@pytest.mark.parametrize("task", ("passkey",) + NEEDLE_TASKS)
def test_exact_token_length(tok, task, length):
    s = make_probe(tok, task, length, 0.5, num_needles=3) if task != "passkey" else make_probe(tok, task, length, 0.5)
    assert len(s.input_ids) == length
    # the answers really are in the prompt
    text = tok.decode(s.input_ids)
    for a in s.answers:
        assert a in text


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_passkey_depth(tok, depth):
    L = 2000
    s = make_passkey(tok, L, depth)
    pos = s.needle_positions[0]
    text = tok.decode(s.input_ids[pos:])
    assert text.lstrip().startswith(f"The pass key is {s.answers[0]}")
    def n(text):
        return len(tok(text, add_special_tokens=False).input_ids)

    n_needle = n(" " + PASSKEY_NEEDLE.format(key=s.answers[0]))
    head, tail = n(PASSKEY_PREFIX), n(" " + PASSKEY_QUESTION)
    filler = L - head - n_needle - tail
    # needle sits at a sentence boundary within one sentence (~10 tokens) of the requested depth
    assert abs((pos - head) - depth * filler) <= 12
    if depth == 0.0:
        assert pos == head
    if depth == 1.0:
        assert pos + n_needle + tail == L


def test_needle_depth_single_and_multikey(tok):
    for task in ("niah_single", "niah_multikey"):
        early = make_needle(tok, task, 3000, 0.1).needle_positions[0]
        late = make_needle(tok, task, 3000, 0.9).needle_positions[0]
        assert early < 0.2 * 3000 < 0.8 * 3000 < late


def test_deterministic_and_seeded(tok):
    a, b = make_passkey(tok, 500, 0.5, index=0, seed=0), make_passkey(tok, 500, 0.5, index=0, seed=0)
    assert a.input_ids == b.input_ids and a.answers == b.answers
    keys = {make_passkey(tok, 500, 0.5, index=i, seed=0).answers[0] for i in range(8)}
    assert len(keys) > 1
    assert len(a.answers[0]) == 5 and a.answers[0].isdigit()
    m = make_needle(tok, "niah_multikey", 800, 0.5, num_needles=4)
    text = tok.decode(m.input_ids)
    assert text.count("One of the special magic numbers for") == 4  # 1 target + 3 distractors


def test_too_short_raises_with_numbers(tok):
    with pytest.raises(ValueError, match=r"prompt needs \d+ tokens .* requested length is 40"):
        make_passkey(tok, 40, 0.5)
    with pytest.raises(ValueError, match="refusing to truncate"):
        make_needle(tok, "niah_multivalue", 100, num_needles=8)
    with pytest.raises(ValueError):
        make_passkey(tok, 500, 1.5)
    with pytest.raises(ValueError):
        make_needle(tok, "nope", 500)


def test_scoring():
    s = ProbeSample("passkey", 10, 0.5, 0, [], ["12345"])
    assert score(s, " 12345. Remember it.") == 1.0
    assert score(s, " 54321 or 12345") == 0.0
    assert score(s, "no idea") == 0.0
    mv = ProbeSample("niah_multivalue", 10, None, 0, [], ["1111111", "2222222"])
    assert score(mv, ": 1111111, 3333333") == 0.5
    vt = ProbeSample("vt", 10, None, 0, [], ["ABCDE", "FGHIJ"])
    assert score(vt, " ABCDE, FGHIJ") == 1.0


def test_suite_expansion():
    assert resolve_length("2x", 8192) == 16384
    assert resolve_length("1.25x", 8192) == 10240
    assert resolve_length("4k", 8192) == 4096
    s = Suite.from_dict({
        "short_context": [1024, 99999],
        "perplexity": {"lengths": ["2x"]},
        "passkey": {"lengths": [3000], "depths": [0.0, 1.0], "samples": 2},
        "needle": {"tasks": ["niah_single", "vt"], "lengths": ["1x"], "depths": [0.5]},
    })
    cases = s.cases(2048)
    ppl = [c.length for c in cases if c.kind == "perplexity"]
    assert ppl == [1024, 4096]  # short context merged in (99999 > window dropped)
    pk = [c for c in cases if c.kind == "passkey"]
    assert len(pk) == 2 * 2 * 2
    ids = [c.case_id for c in cases]
    assert len(ids) == len(set(ids))
    assert {c.kind for c in cases} == {"perplexity", "passkey", "niah_single", "vt"}
    with pytest.raises(ValueError):
        Suite.from_dict({"perplexty": {}})
    # the short-context check cannot be switched off
    only_long = Suite.from_dict({"short_context": [], "perplexity": {"lengths": ["2x"]}}).cases(8192)
    assert [c.length for c in only_long] == [2048, 16384]


@pytest.mark.parametrize("name", ["quick", "full", "smoke"])
def test_bundled_suites_load(name):
    s = load_suite(name)
    assert s.name == name
    cases = s.cases(8192)
    assert any(c.length <= 8192 for c in cases)  # short-context regression always present


def test_prefix_plan_reuses_exactly_the_tokens_before_each_needle(tok):
    """Passkey prompts of several lengths share the instructions and the filler stream up to their needle: run
    deepest needle first, each reuses everything before its own needle (the longest prefix it can share)."""
    from rope_extend.eval.probes import prefix_plan

    samples = [make_passkey(tok, L, d, index=i) for L in (300, 500) for d in (0.0, 0.5, 1.0) for i in range(2)]
    plan = prefix_plan(samples)
    assert sorted(i for i, _ in plan) == list(range(len(samples)))
    positions = [samples[i].needle_positions[0] for i, _ in plan]
    assert positions == sorted(positions, reverse=True)
    assert plan[0][1] == 0
    for (i, reused), (j, _) in zip(plan[1:], plan):
        prev, cur = samples[j].input_ids, samples[i].input_ids
        assert cur[:reused] == prev[:reused]  # the cache holds exactly these tokens
        assert cur[reused] != prev[reused]  # and no more
        assert reused >= samples[i].needle_positions[0]  # nothing before the needle is recomputed


def test_generate_fills_the_cache_it_is_given(tok):
    """The shared-prefix path really hands generate the cache (in transformers 4.x and 5.x alike)."""
    from transformers import DynamicCache

    from rope_extend.eval.probes import run_probe
    from rope_extend.eval.tiny import tiny_llama

    sample = make_passkey(tok, 200, 0.5)
    cache = DynamicCache()
    run_probe(tiny_llama(max_position_embeddings=256), tok, sample, cache)
    assert cache.get_seq_length() >= len(sample.input_ids)
