"""Probe generators: exact token lengths, needle placement, determinism, no silent truncation."""

from __future__ import annotations

import pytest

from rope_extend.eval.probes import (
    HAYSTACKS,
    MIN_FILLER_AFTER,
    PASSKEY_FILLER,
    PASSKEY_NEEDLE,
    PASSKEY_PREFIX,
    PASSKEY_QUESTION,
    ProbeSample,
    make_needle,
    make_passkey,
    make_probe,
    probe_names,
    score,
)
from rope_extend.eval.suite import Suite, load_suite, resolve_length


@pytest.fixture(scope="module")
def tok():
    from rope_extend.eval.toy_models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.mark.parametrize("length", [200, 257, 1000, 3001])
@pytest.mark.parametrize("task", probe_names())
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
    # depth runs over the filler that may precede the needle: all of it but the guard kept before the question;
    # the needle sits at a sentence boundary within one sentence (~10 tokens) of the requested depth
    assert abs((pos - head) - depth * (filler - MIN_FILLER_AFTER)) <= 12
    after = L - tail - (pos + n_needle)  # filler between the needle and the question
    assert after >= MIN_FILLER_AFTER
    if depth == 0.0:
        assert pos == head
    if depth == 1.0:
        assert after < MIN_FILLER_AFTER + 12  # as deep as the guard allows
        between = tok.decode(s.input_ids[pos + n_needle:L - tail])
        sentences = [x.strip() + "." for x in between.split(".") if x.strip()]
        # whole filler sentences, nothing else (the filler stream's last sentence may be cut to fit the length)
        assert len(sentences) >= 3 and set(sentences[:-1]) <= set(PASSKEY_FILLER)


@pytest.mark.parametrize("task", probe_names())
@pytest.mark.parametrize("hay", HAYSTACKS)
def test_filler_always_separates_the_last_needle_from_the_question(tok, task, hay):
    """At every depth (1.0 included) and on both haystacks, the question follows at least MIN_FILLER_AFTER filler
    tokens, never a needle (the old probe glued the depth-100 % needle to the question: a format artifact)."""
    for depth in (0.0, 0.5, 1.0):
        if task == "passkey":
            s = make_passkey(tok, 1500, depth, haystack=hay)
        else:
            s = make_needle(tok, task, 1500, depth, num_needles=3, haystack=hay)
        needle_ends = []
        for p in s.needle_positions:  # each needle ends where its answer-bearing sentence ends
            text = tok.decode(s.input_ids[p:])
            first = text.split(".")[0] + "."
            needle_ends.append(p + n_tokens(tok, first))
        question = _question_start(tok, s)
        assert question - max(needle_ends) >= MIN_FILLER_AFTER, (task, hay, depth)


def n_tokens(tok, text):
    """Tokens *text* takes when it follows a space (how probe segments are encoded), rounded down to a token
    boundary of the prompt."""
    return len(tok(" " + text.strip(), add_special_tokens=False).input_ids) - 1


def _question_start(tok, s):
    """Token index where the question begins, found by decoding (independent of the probe's bookkeeping)."""
    marker = "What is the" if s.task == "passkey" else ("Question:" if s.task == "vt" else "What are" if
                                                         s.task == "niah_multivalue" else "What is the special")
    for i in range(len(s.input_ids) - 1, -1, -1):
        if tok.decode(s.input_ids[i:]).lstrip().startswith(marker):
            return i
    raise AssertionError("question not found")


def test_prose_haystack_is_the_docs_text_and_differs_from_the_filler(tok):
    from rope_extend.eval.texts import pydoc_topics_text

    prose = make_passkey(tok, 1200, 0.5, haystack="pydoc_topics")
    classic = make_passkey(tok, 1200, 0.5)
    assert len(prose.input_ids) == 1200 and prose.answers == classic.answers  # same key: paired across haystacks
    text = tok.decode(prose.input_ids)
    assert "The grass is green." not in text
    words = pydoc_topics_text().split()[:40]  # the prose starts at the beginning of the docs text
    assert " ".join(words[:20]) in " ".join(text.split())
    with pytest.raises(FileNotFoundError, match="evaluation text not found"):
        make_passkey(tok, 1200, 0.5, haystack="/no/such/haystack.txt")


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
    # 2 lengths x 2 depths x 2 samples, plus the inside-window ceiling (at the window, unpatched model only)
    assert len(pk) == 2 * 2 * 2 + 2 * 2
    ceiling = [c for c in pk if c.ceiling_only]
    assert {c.length for c in ceiling} == {2048} and len(ceiling) == 4
    assert {c.haystack for c in pk} == {"filler"}
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
    from rope_extend.eval.toy_models import tiny_llama

    sample = make_passkey(tok, 200, 0.5)
    cache = DynamicCache()
    run_probe(tiny_llama(max_position_embeddings=256), tok, sample, cache)
    assert cache.get_seq_length() >= len(sample.input_ids)


def _rec(variant, length, depth, index, score, haystack="filler", kind="passkey"):
    return {"variant": variant, "kind": kind, "length": length, "depth": depth, "index": index,
            "haystack": haystack, "original_length": 1000, "metrics": {"score": score},
            "case_id": f"{kind}/{haystack}/L{length}/d{depth:g}/s{index}"}


def test_report_reads_beyond_window_cells_against_the_flagged_ceiling():
    """A depth the unpatched model fails inside its own window is flagged and left out of the valid-depth count;
    haystacks are separate rows and never pooled; a missing ceiling is said, not assumed."""
    from rope_extend.eval.report import beyond_window_table, ceiling_table, ceilings, probe_table

    recs = []
    for h, fail_at in (("filler", 1.0), ("pydoc_topics", None)):
        for d in (0.0, 0.5, 1.0):
            for i in range(2):
                recs.append(_rec("unpatched", 1000, d, i, 0.0 if d == fail_at else 1.0, h))  # the ceiling
                recs.append(_rec("unpatched", 500, d, i, 1.0, h))
                recs.append(_rec("yarn-x2", 2000, d, i, 1.0 if (d == 0.5 or (d == 1.0 and i == 0)) else 0.0, h))
    recs.append(_rec("yarn-x2", 2000, 0.5, 0, 1.0, "other"))  # a haystack without a ceiling
    c = ceilings(recs)
    assert c["passkey/filler"]["flagged"] == [1.0] and c["passkey/filler"]["length"] == 1000
    assert c["passkey/pydoc_topics"]["flagged"] == []
    table = beyond_window_table(recs)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    # filler: 3/6 over all depths (d=0.5 twice, d=1.0 once); over the valid depths 0 and 0.5: 2/4 (Wilson 95 %
    # by hand: 3/6 -> 0.5 +- 0.312, 2/4 -> 0.5 +- 0.350)
    assert "4/6" in rows["passkey/filler"] and "flagged: 100%" in rows["passkey/filler"]
    assert "0.50 [0.19, 0.81] 3/6; valid depths 0.50 [0.15, 0.85] 2/4" in rows["passkey/filler"]
    assert "flagged: none" in rows["passkey/pydoc_topics"] and "valid depths" not in rows["passkey/pydoc_topics"]
    assert "0.50 [0.19, 0.81] 3/6" in rows["passkey/pydoc_topics"]
    assert "not measured" in rows["passkey/other"]
    ceil = ceiling_table(recs)
    assert "| passkey/filler | 100% | 2/2 | 0/2 |" in ceil and "| passkey/pydoc_topics | 100% | 2/2 | 2/2 |" in ceil
    assert "passkey/filler" in probe_table(recs) and "passkey/pydoc_topics" in probe_table(recs)
