"""Suites are validated models (unknown keys named), expand into the promised samples, and plan into jobs that
share a forward only where the numbers cannot change."""

from __future__ import annotations

import pytest

from rope_extend.eval.jobs import length_independent, plan_jobs
from rope_extend.eval.suite import SUITES_DIR, Suite, SuiteError, load_suite
from rope_extend.eval.variants import make_variants


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        ({"passkey": {"sampels": 3}}, "unknown key 'passkey.sampels' (did you mean 'samples'?"),
        ({"perplxity": {}}, "unknown key 'perplxity' (did you mean 'perplexity'?"),
        ({"needle": {"tasks": ["niah_single"], "deps": [0.5]}}, "unknown key 'needle.deps' (did you mean 'depths'?"),
        ({"passkey": {"lengths": ["abc"]}}, "length 'abc' is not an int"),
        ({"passkey": {"depths": [1.5]}}, "passkey.depths.0: Input should be less than or equal to 1"),
        ({"needle": {"tasks": ["niah"]}}, "unknown needle task 'niah'"),
        ({"perplexity": {"text": "a", "texts": ["b"]}}, "either 'text' or 'texts'"),
        ({"passkey": {"samples": 0}}, "passkey.samples"),
    ],
)
def test_invalid_suites_name_the_problem(suite, message):
    with pytest.raises(SuiteError, match=None) as info:
        Suite.from_dict(suite)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_bad_suite_file_lists_the_allowed_keys_once(tmp_path):
    """issue 66 item 7: three misspelt keys in one section repeated the section's allowed keys three times. One line:
    each unknown key with its closest allowed key, then what its section allows, once per section."""
    path = tmp_path / "s.yaml"
    path.write_text("perplexity:\n  lenghts: [1024]\n  bucket: 64\n  chunk: 64\npasskey:\n  depth: [0.5]\nfoo: 1\n")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message == (
        f"suite {path} is invalid: unknown keys 'perplexity.lenghts' (did you mean 'lengths'?), 'perplexity.bucket' "
        "(did you mean 'bucket_size'?), 'perplexity.chunk' (did you mean 'chunk_size'?): perplexity allows texts, "
        "lengths, bucket_size, chunk_size, block_size, start; unknown key 'passkey.depth' (did you mean 'depths'?): "
        "passkey allows lengths, depths, samples, haystacks, ceiling; unknown key 'foo': a suite allows name, "
        "description, smoke, seed, short_context, perplexity, passkey, needle, entropy")
    assert message.count("block_size") == 1 and "\n" not in message


def test_suite_file_errors_name_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\npasskey:\n  lenghts: [1024]\n")
    with pytest.raises(SuiteError, match=rf"suite {path} is invalid: unknown key 'passkey.lenghts'"):
        load_suite(path)
    with pytest.raises(FileNotFoundError, match="bundled: .*paper"):
        load_suite("no-such-suite")
    path.write_text("name: s\ndescription: the ceiling of x: the unpatched model\n")
    with pytest.raises(SuiteError, match=rf"suite '{path}' is not valid YAML at line 2, column 30: mapping values"):
        load_suite(path)


def test_defaults_and_text_shorthand():
    s = Suite.from_dict({"perplexity": {"text": "my.txt", "lengths": [512]}})
    assert s.perplexity.texts == ["my.txt"] and s.perplexity.block_size == 128
    assert s.with_texts(["a", "b"]).perplexity.texts == ["a", "b"]
    assert s.perplexity.texts == ["my.txt"]  # frozen: with_texts made a copy
    ids = [c.case_id for c in s.cases(256)]
    assert ids == ["perplexity/my.txt/L256", "perplexity/my.txt/L512"]


@pytest.mark.parametrize("path", sorted(SUITES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_suites_load(path):
    assert load_suite(path.stem).cases(8192)


def _per_length(cases, kind):
    out = {}
    for c in cases:
        if c.kind == kind:
            out.setdefault(c.length, []).append(c)
    return out


def test_paper_and_full_sample_enough_and_spread_depths():
    L = 8192
    for name in ("paper", "full"):
        suite = load_suite(name)
        assert not suite.smoke
        cases = suite.cases(L)
        texts = {c.params["text"] for c in cases if c.kind == "perplexity"}
        assert texts == {"pydoc_topics", "debian_licenses"}
        kinds = {"passkey"} | set(suite.needle.tasks if suite.needle else [])
        for kind in kinds:
            cells = _per_length(cases, kind)
            assert {int(1.5 * L), 2 * L} <= set(cells), (name, kind)
            for length, cell in cells.items():
                assert len(cell) >= 10, (name, kind, length)
                assert len({c.case_id for c in cell}) == len(cell)
                depths = {c.depth for c in cell}
                if depths != {None}:
                    assert min(depths) == 0.0 and max(depths) == 1.0
    assert load_suite("quick").smoke and load_suite("smoke").smoke


def test_plan_shares_one_forward_only_for_length_independent_variants():
    """Perplexity lengths share a forward only on static variants; probe prompts share a KV prefix across lengths
    on static variants and within one length on dynamic ones (one scale per fixed-length request)."""
    suite = Suite.from_dict({"short_context": [256], "perplexity": {"texts": ["a", "b"], "lengths": [384, "2x"]},
                             "passkey": {"lengths": [300], "depths": [0.0, 1.0], "samples": 2}})
    cases = suite.cases(256)
    variants = make_variants([{"method": "yarn", "factor": 2}, {"method": "dynamic-yarn", "factor": 2},
                              {"method": "dynamic", "factor": 2}])
    assert [length_independent(v) for v in variants] == [True, True, False, False]
    jobs = plan_jobs(cases, variants, set())
    by_variant = {}
    for j in jobs:
        by_variant.setdefault(j.variant.name, []).append(j)
    for name in ("unpatched", "yarn-x2"):
        ppl = [j for j in by_variant[name] if j.kind == "perplexity"]
        assert [(len(j.cases), j.length) for j in ppl] == [(3, 512), (3, 512)]  # one forward per text
        probes = [j for j in by_variant[name] if j.kind == "passkey"]
        assert [(j.length, len(j.cases)) for j in probes] == [(300, 8)]  # one KV prefix tree for the task
    for name in ("dynamic-yarn-x2", "dynamic-x2"):
        ppl = [j for j in by_variant[name] if j.kind == "perplexity"]
        assert sorted(j.length for j in ppl) == [256, 256, 384, 384, 512, 512]  # one forward per length
        assert all(len(j.cases) == 1 for j in ppl)
        probes = [j for j in by_variant[name] if j.kind == "passkey"]  # a KV prefix only within one length
        assert sorted((j.length, len(j.cases)) for j in probes) == [(256, 4), (300, 4)]
        assert all(len({c.length for c in j.cases}) == 1 for j in probes)
    unshared = plan_jobs(cases, variants, set(), share=False)
    assert sum(len(j.cases) for j in unshared) == sum(len(j.cases) for j in jobs) == len(cases) * 4
    assert all(len(j.cases) == 1 for j in unshared)

    # finished cases are not planned again; a partly finished text still gets one forward for the rest
    v = variants[1]
    done = {(v.name, v.fingerprint, c.case_id) for c in cases if c.case_id in ("perplexity/a/L256", "passkey/filler/L300/d0/s0")}
    again = [j for j in plan_jobs(cases, variants[1:2], done)]
    assert sum(len(j.cases) for j in again) == len(cases) - 2
    assert [len(j.cases) for j in again if j.kind == "perplexity"] == [2, 3]


def test_interleaved_plan_goes_round_by_round():
    suite = Suite.from_dict({"short_context": [256], "perplexity": {"lengths": [256]},
                             "passkey": {"lengths": [300], "depths": [0.0, 0.5, 1.0], "samples": 2}})
    variants = make_variants([{"method": "yarn", "factor": 2}])
    jobs = plan_jobs(suite.cases(256), variants, set(), interleave=True)
    order = [(j.round, j.kind, j.length, j.variant.name) for j in jobs]
    assert order == [
        (0, "perplexity", 256, "unpatched"), (0, "perplexity", 256, "yarn-x2"),
        (0, "passkey", 300, "unpatched"), (0, "passkey", 300, "yarn-x2"),
        (3, "passkey", 300, "unpatched"), (3, "passkey", 300, "yarn-x2"),
    ]  # after each round every variant has the same prompts
    # the prompts of one sample index (all depths and lengths) form one job sharing a KV prefix
    assert {len(j.cases) for j in jobs if j.kind == "passkey"} == {6}


def test_ceiling_cases_run_on_the_unpatched_model_only_and_haystacks_get_their_own_jobs():
    """Beyond-window probe sections add the same prompts at the window for the unpatched model (the ceiling);
    an interleaved plan has one job per haystack and sample index, round by round across variants."""
    suite = Suite.from_dict({"short_context": [], "passkey": {"lengths": ["2x"], "depths": [0.0, 1.0], "samples": 2,
                                                               "haystacks": ["filler", "pydoc_topics"]}})
    cases = suite.cases(4096)  # the short-context check falls back to 2048 (inside the window, every variant)
    assert sorted({(c.length, c.ceiling_only) for c in cases}) == [(2048, False), (4096, True), (8192, False)]
    assert len([c for c in cases if c.ceiling_only]) == 2 * 2 * 2  # depths x samples x haystacks
    assert len({c.case_id for c in cases}) == len(cases)  # the haystack is part of every probe case id
    variants = make_variants([{"method": "yarn", "factor": 2}])
    jobs = plan_jobs(cases, variants, set(), interleave=True)
    assert not any(c.ceiling_only for j in jobs if j.variant.name == "yarn-x2" for c in j.cases)
    assert sum(c.ceiling_only for j in jobs for c in j.cases) == 8
    assert all(len({c.haystack for c in j.cases}) == 1 and len({c.index for c in j.cases}) == 1 for j in jobs)
    order = [(j.round, j.variant.name, j.cases[0].haystack) for j in jobs]
    assert order[:4] == [(0, "unpatched", "filler"), (0, "unpatched", "pydoc_topics"),
                         (0, "yarn-x2", "filler"), (0, "yarn-x2", "pydoc_topics")]
    off = Suite.from_dict({"passkey": {"lengths": ["2x"], "ceiling": False}}).cases(4096)
    assert not any(c.ceiling_only for c in off)
    inside = Suite.from_dict({"passkey": {"lengths": ["1x", "2x"]}}).cases(256)  # the window is already a length
    assert not any(c.ceiling_only for c in inside)
    with pytest.raises(SuiteError, match="repeat"):
        Suite.from_dict({"passkey": {"haystacks": ["filler", "filler"]}})
