"""Spec validation: every bad input is a SpecError naming the field, the value and the fix."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

import rope_extend.spec as spec_module
from rope_extend import RopeSpec, SpecError, load_spec
from rope_extend.spec import parse_inline_spec, parse_set_option

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"method": "yarn", "factor": 2, "fator": 3}, "fator", ["unknown spec key", "did you mean 'factor'"]),
        ({"method": "yarnn", "factor": 2}, "method", ["unknown RoPE method", "did you mean 'yarn'"]),
        ({"method": "ntk_by_part", "factor": 2}, "method", ["did you mean 'ntk-by-parts'"]),
        ({"method": "yarn", "factor": "abc"}, "factor", ["'abc'", "number"]),
        ({"method": "yarn", "factor": float("nan")}, "factor", ["NaN"]),
        ({"method": "yarn", "factor": float("inf")}, "factor", ["infinity"]),
        ({"method": "yarn", "factor": 0.5}, "factor", [">= 1", "0.5"]),
        ({"method": "yarn", "factor": -2}, "factor", [">= 1"]),
        ({"method": "yarn", "factor": 0}, "factor", [">= 1"]),
        ({"method": "yarn", "factor": 2, "beta_fast": 1, "beta_slow": 2}, None, ["beta_fast (1.0) must be greater"]),
        ({"method": "yarn", "factor": 2, "beta_fast": 2, "beta_slow": 2}, None, ["beta_fast"]),
        (
            {"method": "yarn", "target_length": 1000, "original_max_position_embeddings": 4096},
            None,
            ["shorter than the original length 4096", "1000"],
        ),
        (
            {"method": "yarn", "factor": 2, "target_length": 10000, "original_max_position_embeddings": 4096},
            None,
            ["disagree", "give only one"],
        ),
        ({"method": "yarn"}, None, ["needs 'factor' or 'target_length'"]),
        ({"method": "linear", "factor": 2, "beta_fast": 64}, None, ["'beta_fast' does not apply to method 'linear'"]),
        ({"method": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}, None, ["high_freq_factor"]),
        ({"method": "yarn", "factor": 2, "rope_theta": -1}, "rope_theta", ["> 0"]),
        ({"method": "yarn", "factor": 2, "original_max_position_embeddings": 0}, "original_max_position_embeddings", ["positive"]),
        ({"method": "yarn", "factor": True}, "factor", ["got true (a boolean)"]),
        ({"method": "yarn", "factor": 2, "rope_theta": False}, "rope_theta", ["got false (a boolean)"]),
        ({"method": "yarn", "factor": 2, "original_max_position_embeddings": True}, "original_max_position_embeddings",
         ["a boolean"]),
        ({"method": "longrope", "factor": 2, "short_factor": []}, "short_factor", ["non-empty"]),
        ({"method": "yarn", "factor": 2, "layer_types": []}, "layer_types", ["at least one"]),
        ({"method": 7, "factor": 2}, "method", ["must be a string"]),
        ({"factor": 2}, "method", ["missing 'method'"]),
    ],
)
def test_bad_specs_raise_spec_error(kwargs, field, words):
    with pytest.raises(SpecError) as info:
        RopeSpec(**kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_factor_and_target_derive_each_other():
    assert RopeSpec(method="yarn", factor=4).resolve(8192).target_length == 32768
    spec = RopeSpec(method="yarn", target_length=12288).resolve(8192)
    assert spec.factor == 1.5 and spec.original_max_position_embeddings == 8192
    # an explicit original length in the spec wins over the model's
    assert RopeSpec(method="yarn", factor=4, original_max_position_embeddings=32768).resolve(8192).target_length == 131072
    # consistent factor + target are fine
    RopeSpec(method="yarn", factor=2, target_length=16384).resolve(8192)
    with pytest.raises(SpecError, match="disagree"):
        RopeSpec(method="yarn", factor=2, target_length=10000).resolve(8192)
    with pytest.raises(SpecError, match="shorter"):
        RopeSpec(method="yarn", target_length=4096).resolve(8192)


def test_aliases_and_normalisation():
    assert RopeSpec(method="PI", factor=2).method == "linear"
    assert RopeSpec(method="dynamic_ntk", factor=2).method == "dynamic"
    assert RopeSpec(method="Dynamic_YaRN", factor=2).method == "dynamic-yarn"


def test_yaml_roundtrip_and_overrides(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("method: yarn\nfactor: 8\nbeta_fast: 64\n")
    spec = load_spec(path)
    assert spec.factor == 8 and spec.beta_fast == 64
    assert load_spec(path, factor=4).factor == 4  # CLI flags override YAML keys
    # a target on the command line replaces the YAML factor instead of conflicting with it
    overridden = load_spec(path, target_length=20000)
    assert overridden.factor is None and overridden.target_length == 20000
    again = load_spec(yaml.safe_load(spec.to_yaml()))
    assert again == spec


@pytest.mark.parametrize(
    "text, words",
    [
        ("method: yarn\nfactor: [2\n", ["not valid YAML", "line"]),
        ("- method\n- yarn\n", ["holds a list", "not a YAML mapping", "method: yarn"]),
        ("", ["is empty", "method: yarn"]),  # issue 57: said "got NoneType"
        ("# a comment only\n", ["is empty (or only comments)"]),
        ("method: yarn\nfactor: true\n", ["'factor' has bad value True", "a boolean"]),  # issue 57: read as 1
        ("method: yarn\ntarget_length: yes\n", ["'target_length' has bad value True", "a boolean"]),
        ("factor: 2\n", ["no 'method'"]),
        ("method: yarn\nfactor: .nan\n", ["NaN"]),
        ("method: yarn\nfactor: 2\nunknown: 1\n", ["unknown spec key 'unknown'"]),
    ],
)
def test_bad_yaml_files(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    for word in words:
        assert word in str(info.value)


def test_missing_file():
    with pytest.raises(SpecError, match="does not exist"):
        load_spec("/nonexistent/spec.yaml")


def test_set_option_parsing():
    assert parse_set_option("beta_fast=64") == ("beta_fast", 64)
    assert parse_set_option("short-factor=[1, 2]") == ("short_factor", [1, 2])
    assert parse_set_option("truncate=false") == ("truncate", False)
    with pytest.raises(SpecError, match="key=value"):
        parse_set_option("beta_fast")


@pytest.mark.parametrize("value, yaml11", [("0x10", 16), ("010", 8), ("1:30", 90)])
def test_set_and_inline_spec_refuse_yaml11_numbers_alike(value, yaml11):
    """`--set` and eval's inline `--spec` read a value with one parser: a number YAML 1.1 reads otherwise (eval read
    `factor=0x10` as 16 and `010` as 8 with yaml.safe_load) is refused by both, naming the value and its 1.1 reading."""
    for parse, flag in ((lambda: parse_set_option(f"factor={value}"), "--set"),
                        (lambda: parse_inline_spec(f"method=yarn,factor={value}"), "--spec")):
        with pytest.raises(SpecError, match=f"{flag} factor={value}: '{value}' is not a plain decimal number") as info:
            parse()
        assert f"YAML 1.1 reads it as {yaml11}" in str(info.value) and info.value.field == "factor"
    assert yaml.safe_load(value) == yaml11  # the reading refused: YAML 1.1's
    assert parse_inline_spec("method=yarn,factor=16,beta-fast=64") == {"method": "yarn", "factor": 16, "beta_fast": 64}


def test_each_method_spec_class_is_built_from_its_params():
    """Every registered method's spec class holds the core fields and exactly the method's parameters (their one
    declaration, `RopeMethod.params`), in the order specs write them, typed by each `Param.kind`, floats finite."""
    from typing import Literal

    from rope_extend.methods import all_methods, all_params
    from rope_extend.spec import CORE_FIELDS, spec_class

    kinds = {float: float | None, int: int | None, bool: bool | None, list: list[float] | None}
    classes = set()
    for method in all_methods():
        cls = spec_class(method.name)
        classes.add(cls)
        assert cls.__module__ == "rope_extend.spec" and cls.__name__ == f"{type(method).__name__}Spec"
        assert getattr(spec_module, cls.__name__) is cls  # where pickle looks for it
        fields = cls.model_fields
        assert fields["method"].annotation == Literal[method.name]
        params = [name for name in fields if name not in CORE_FIELDS]
        assert params == sorted(method.params, key=list(all_params()).index)
        assert {name: fields[name].annotation for name in params} == {
            name: kinds[param.kind] for name, param in method.params.items()}
        assert all(fields[name].default is None for name in params)
        assert type(RopeSpec(method=method.name, factor=2)) is cls
    assert len(classes) == len(all_methods())
    spec = RopeSpec(method="yarn", factor=2, beta_fast=64)
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_a_parameter_is_declared_once_with_its_method():
    """A method registered with a new parameter is a spec at once: the key is accepted for it, typed and checked by
    its `Param`, refused for other methods, listed among the spec keys and written to YAML -- nothing to declare in
    spec.py."""
    from rope_extend.methods import Param, registry
    from rope_extend.methods.linear import Linear
    from rope_extend.spec import spec_keys

    class Widened(Linear):
        name = "toy-widened"
        aliases = ()
        params = {"toy_width": Param(int, None, "a toy parameter", positive=True)}

    registry.register(Widened())
    try:
        spec = RopeSpec(method="toy-widened", factor=2, toy_width=3)
        assert type(spec).__name__ == "WidenedSpec" and spec.toy_width == 3
        assert spec.to_yaml() == "method: toy-widened\nfactor: 2.0\ntoy_width: 3\n"
        assert spec_keys()[-1] == "toy_width"
        with pytest.raises(SpecError, match=r"^spec field 'toy_width' has bad value 0: must be > 0, got 0$"):
            RopeSpec(method="toy-widened", factor=2, toy_width=0)
        with pytest.raises(SpecError, match=r"'toy_width' has bad value 1.5: Input should be a valid integer"):
            RopeSpec(method="toy-widened", factor=2, toy_width=1.5)
        with pytest.raises(SpecError, match=r"parameter 'toy_width' does not apply to method 'yarn'"):
            RopeSpec(method="yarn", factor=2, toy_width=3)
    finally:
        for table in (registry._REGISTRY, registry.GGUF_RULES, registry.ADVICE):
            del table["toy-widened"]


def test_eval_parses_each_spec_once(tmp_path, monkeypatch):
    """eval's variants parse each spec once (a YAML path, a dict, an inline --spec), however often their dict,
    fingerprint and spec are read afterwards; a RopeSpec is passed through unparsed."""
    from rope_extend.eval.variants import make_variants

    path = tmp_path / "mine.yaml"
    path.write_text("method: yarn\nfactor: 4\n")
    given = [str(path), {"method": "ntk", "factor": 2}, parse_inline_spec("method=linear,factor=2"),
             load_spec(method="dynamic", factor=2)]
    calls = []
    real = spec_module.parse_spec
    monkeypatch.setattr(spec_module, "parse_spec", lambda data: calls.append(dict(data)) or real(data))
    variants = make_variants(given)
    for _ in range(2):
        for v in variants[1:]:
            v.spec_dict(), v.fingerprint, v.rope_spec()
    assert [v.name for v in variants] == ["unpatched", "mine", "ntk-x2", "linear-x2", "dynamic-x2"]
    assert [c["method"] for c in calls] == ["yarn", "ntk", "linear"]
    assert all(isinstance(v.rope_spec(), RopeSpec) for v in variants[1:])


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_are_valid(path):
    spec = load_spec(path).resolve(8192)
    assert spec.factor >= 1


def test_qwen_recipe_reproduces_published_setting():
    spec = load_spec(Path(__file__).parent.parent / "configs" / "qwen2.5-yarn-x4.yaml").resolve(32768)
    assert (spec.method, spec.factor, spec.original_max_position_embeddings, spec.target_length) == (
        "yarn",
        4.0,
        32768,
        131072,
    )


def test_expected_example_configs_exist():
    names = {p.name for p in CONFIGS}
    methods = {load_spec(p).method for p in CONFIGS}
    assert {"yarn", "ntk", "dynamic", "dynamic-yarn", "linear", "llama3"} <= methods
    assert "qwen2.5-yarn-x4.yaml" in names
