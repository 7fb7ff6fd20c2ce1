"""Bad input (table-driven, CLI and API), SIGKILL during write, property-based fuzzing, security defaults."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import signal
import time
import warnings
from pathlib import Path

import pytest
import tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rope_extend import (
    AlreadyScaledError,
    CheckpointError,
    RopeSpec,
    SpecError,
    UnsupportedModelError,
    load_spec,
    plan_patch,
)
from rope_extend.checkpoint import patch_checkpoint, verify_output
from rope_extend.cli import run
from rope_extend.compat import portable_config_dict, read_slots
from rope_extend.plan import verify_stock_config

# CI runs a fixed sequence of examples (a red CI must mean a regression); locally hypothesis explores freely.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


checksums = tiny.checksums


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pristine") / "src"
    tiny.make_model("llama").save_pretrained(folder)
    return folder


def copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# --- bad input, table-driven ---------------------------------------------------------------------------------------
def _yaml(tmp, text):
    path = tmp / "spec.yaml"
    path.write_text(text)
    return ["--config", str(path)]


def _edit_config(src, **changes):
    data = json.loads((src / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (src / "config.json").write_text(json.dumps(data))


def _shard_index(src):
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}}))


def _truncate(src):
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])


def _gpt2(src):
    from transformers import AutoConfig, AutoModelForCausalLM

    for p in list(src.iterdir()):
        p.unlink()
    AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64)).save_pretrained(src)


def _already_scaled(src):
    _edit_config(src, rope_scaling={"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 32}, rope_parameters=None)


YARN = ["--method", "yarn", "--factor", "2"]
# (id, extra CLI args (callable on tmp), source mutation, words in the error line, exception of the Python API)
CASES = [
    ("yaml-malformed", lambda t: _yaml(t, "method: yarn\nfactor: [2\n"), None, ["not valid YAML"], SpecError),
    ("yaml-not-mapping", lambda t: _yaml(t, "- yarn\n"), None, ["YAML mapping"], SpecError),
    ("yaml-unknown-key", lambda t: _yaml(t, "method: yarn\nfactor: 2\nfacto: 3\n"), None, ["unknown spec key 'facto'"], SpecError),
    ("yaml-missing-file", lambda t: ["--config", str(t / "nope.yaml")], None, ["does not exist"], SpecError),
    ("yaml-no-method", lambda t: _yaml(t, "factor: 2\n"), None, ["no 'method'"], SpecError),
    ("unknown-method", lambda t: ["--method", "yarm", "--factor", "2"], None, ["did you mean 'yarn'"], SpecError),
    ("negative-factor", lambda t: ["--method", "yarn", "--factor", "-2"], None, [">= 1"], SpecError),
    ("zero-factor", lambda t: ["--method", "yarn", "--factor", "0"], None, [">= 1"], SpecError),
    ("nan-factor", lambda t: ["--method", "yarn", "--factor", "nan"], None, ["NaN"], SpecError),
    ("inf-factor", lambda t: ["--method", "yarn", "--factor", "inf"], None, ["infinity"], SpecError),
    ("text-factor", lambda t: ["--method", "yarn", "--set", "factor=two"], None, ["'two'"], SpecError),
    ("target-too-short", lambda t: ["--method", "yarn", "--target-length", "16"], None, ["shorter than the original length 32"], SpecError),
    ("factor-target-disagree", lambda t: _yaml(t, "method: yarn\nfactor: 2\ntarget_length: 100\n"), None, ["disagree"], SpecError),
    ("betas-inverted", lambda t: YARN + ["--set", "beta_fast=1", "--set", "beta_slow=8"], None, ["beta_fast"], SpecError),
    ("param-wrong-method", lambda t: ["--method", "linear", "--factor", "2", "--set", "beta_fast=64"], None, ["does not apply"], SpecError),
    ("longrope-no-lists", lambda t: ["--method", "longrope", "--factor", "2"], None, ["short_factor"], SpecError),
    ("layer-types-none", lambda t: YARN + ["--set", "layer_types=[chunked]"], None, ["layer_types"], SpecError),
    ("set-no-equals", lambda t: YARN + ["--set", "beta_fast"], None, ["key=value"], SpecError),
    ("non-rope-model", lambda t: YARN, _gpt2, ["learned absolute position embeddings"], UnsupportedModelError),
    ("no-length-in-config", lambda t: YARN, lambda s: _edit_config(s, max_position_embeddings=None), ["no max_position_embeddings"], SpecError),
    ("missing-shard", lambda t: YARN, _shard_index, ["missing from SOURCE"], CheckpointError),
    ("truncated-shard", lambda t: YARN, _truncate, ["truncated"], CheckpointError),
    ("no-weights", lambda t: YARN, lambda s: (s / "model.safetensors").unlink(), ["no weights"], CheckpointError),
    ("corrupt-config", lambda t: YARN, lambda s: (s / "config.json").write_text("{oops"), ["not valid JSON"], CheckpointError),
    ("config-not-object", lambda t: YARN, lambda s: (s / "config.json").write_text("[1, 2]"), ["JSON object"], CheckpointError),
    ("unknown-model-type", lambda t: YARN, lambda s: _edit_config(s, model_type="no-such-arch"), ["cannot read"], CheckpointError),
    ("no-config", lambda t: YARN, lambda s: (s / "config.json").unlink(), ["no config.json"], CheckpointError),
    ("already-scaled", lambda t: YARN, _already_scaled, ["replace_existing"], AlreadyScaledError),
    ("bad-mode", lambda t: YARN + ["--mode", "quick"], None, ["--mode 'quick'"], CheckpointError),
    ("bad-dtype", lambda t: YARN + ["--mode", "full", "--dtype", "int3"], None, ["--dtype 'int3'"], CheckpointError),
    ("dtype-config-only", lambda t: YARN + ["--mode", "config-only", "--dtype", "bfloat16"], None, ["needs --mode full"], CheckpointError),
    ("bad-repo-id", lambda t: YARN + ["--push-to-hub", "not a repo"], None, ["repo id like"], CheckpointError),
]


@pytest.mark.parametrize("case_id, args, mutate, words, api_error", CASES, ids=[c[0] for c in CASES])
def test_bad_input_cli_and_api(pristine, tmp_path, capsys, case_id, args, mutate, words, api_error):
    src = copy_tree(pristine, tmp_path / "src")
    if mutate:
        mutate(src)
    capsys.readouterr()
    before = checksums(src)
    out = tmp_path / "out"
    extra = args(tmp_path)
    assert run(["patch", str(src), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rope-extend: error:"), err
    for word in words:
        assert word in err[0], err[0]
    assert not out.exists() and not list(tmp_path.glob(".out.rope-extend-tmp-*"))
    assert checksums(src) == before
    # the Python API raises the documented exception (a ValueError subclass)
    if "--push-to-hub" in extra:
        return  # a CLI option
    assert issubclass(api_error, ValueError)
    with pytest.raises(api_error):
        spec = _api_spec(extra)
        mode = extra[extra.index("--mode") + 1] if "--mode" in extra else "auto"
        dtype = extra[extra.index("--dtype") + 1] if "--dtype" in extra else None
        patch_checkpoint(src, spec, out, mode=mode, dtype=dtype)
    assert not out.exists()


def _api_spec(extra):
    from rope_extend.cli.patch_cmd import build_spec

    get = lambda flag: extra[extra.index(flag) + 1] if flag in extra else None
    sets = [extra[i + 1] for i, a in enumerate(extra) if a == "--set"]
    factor = get("--factor")
    target = get("--target-length")
    return build_spec(get("--method"), float(factor) if factor else None, int(target) if target else None,
                      Path(get("--config")) if get("--config") else None, sets)


def test_table_has_at_least_30_cases():
    assert len(CASES) >= 30


def test_output_location_cases(pristine, tmp_path, capsys):
    src = copy_tree(pristine, tmp_path / "src")
    before = checksums(src)
    cases = [
        (src, "is SOURCE itself"),
        (src / "inner", "inside SOURCE"),
        (tmp_path, "SOURCE"),  # SOURCE inside OUT (and OUT not empty)
        (Path("/proc/rope-extend-out"), "cannot"),  # unwritable, even for root
    ]
    (tmp_path / "file").write_text("x")
    cases.append((tmp_path / "file", "existing file"))
    for out, words in cases:
        assert run(["patch", str(src), "-o", str(out), *YARN]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert checksums(src) == before


def test_disk_full_leaves_nothing(pristine, tmp_path, capsys, monkeypatch):
    from rope_extend import checkpoint

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_json", full_disk)
    out = tmp_path / "out"
    assert run(["patch", str(pristine), "-o", str(out), *YARN]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left" in err[0]
    assert not out.exists() and not list(tmp_path.glob(".out.rope-extend-tmp-*"))


def test_hub_id_not_cached_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert run(["patch", "acme/never-downloaded", "-o", str(tmp_path / "out"), *YARN]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not in the local Hub cache" in err[0]
    with pytest.raises(CheckpointError):
        patch_checkpoint("acme/never-downloaded", {"method": "yarn", "factor": 2}, tmp_path / "out")


# --- SIGKILL during write ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["config-only", "full"])
def test_sigkill_during_write_leaves_out_absent_or_complete(pristine, tmp_path, mode):
    import killworker

    source = copy_tree(pristine, tmp_path / "src")
    before = checksums(source)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["killworker", "rope_extend.checkpoint", "rope_extend.patch", "torch", "transformers",
                                "transformers.models.llama.modeling_llama", "safetensors.torch"])

    def start(out):
        process = ctx.Process(target=killworker.write, args=(str(source), str(out), mode))
        process.start()
        return process

    warm = start(tmp_path / "warm")  # also warms the fork server
    started = time.perf_counter()
    warm.join(120)
    duration = time.perf_counter() - started
    assert warm.exitcode == 0 and (tmp_path / "warm" / "config.json").exists()
    rng = random.Random(1234)
    outcomes = {"absent": 0, "complete": 0}
    for trial in range(20):
        out = tmp_path / f"out{trial}"
        process = start(out)
        time.sleep(rng.uniform(0, duration * 1.2))
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it finished before the kill: OUT must then be complete
        process.join(30)
        if out.exists():
            _assert_complete(out, mode)
            outcomes["complete"] += 1
        else:
            outcomes["absent"] += 1
        assert checksums(source) == before
    assert sum(outcomes.values()) == 20
    # temp folders of killed runs are cleaned by the next run beside the same OUT
    import shutil

    for trial in range(20):
        victim = tmp_path / f"out{trial}"
        shutil.rmtree(victim, ignore_errors=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            patch_checkpoint(source, {"method": "yarn", "factor": 4}, victim, mode="config-only")
    assert not list(tmp_path.glob(".*.rope-extend-tmp-*"))


def _config(folder):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def _assert_complete(out: Path, mode: str) -> None:
    from rope_extend import plan_patch as plan_

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "rope_extend.yaml", "README.md"} <= names, names
    config = _config(out)
    assert read_slots(config)[None]["rope_type"] == "yarn"
    plan = plan_(config, {"method": "yarn", "factor": 4})  # the same spec on the output: nothing to change
    assert not plan.changed
    verify_output(out, plan, mode)


# --- fuzzing -------------------------------------------------------------------------------------------------------
SPEC_KEYS = list(RopeSpec.model_fields) + ["fator", "type", "rope_type", ""]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.floats(allow_nan=True), max_size=4),
    st.sampled_from(["yarn", "linear", "ntk", "dynamic", "llama3", "longrope", "dynamic-yarn", "ntk-by-parts", "PI"]),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(SPEC_KEYS), VALUES, max_size=6))
def test_fuzz_spec_dicts_give_spec_or_spec_error(data):
    try:
        spec = RopeSpec(**data)
    except SpecError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    for original in (1, 4096):
        try:
            spec.resolve(original)
        except SpecError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fuzz_yaml_text_gives_spec_or_spec_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(text)
    try:
        load_spec(path)
    except SpecError:
        pass


VALID_SPECS = st.one_of(
    st.builds(dict, method=st.sampled_from(["linear", "ntk", "dynamic", "llama3"]),
              factor=st.floats(1.0, 64.0, allow_nan=False)),
    st.builds(dict, method=st.sampled_from(["yarn", "ntk-by-parts", "dynamic-yarn"]),
              factor=st.floats(1.0, 64.0), beta_fast=st.floats(2.0, 256.0), beta_slow=st.floats(0.01, 1.9),
              truncate=st.booleans()),
    st.builds(dict, method=st.just("yarn"), factor=st.floats(1.0, 64.0), mscale=st.floats(0.1, 2.0),
              mscale_all_dim=st.floats(0.1, 2.0)),
    st.builds(dict, method=st.just("yarn"), target_length=st.integers(32, 100_000),
              attention_factor=st.floats(0.5, 3.0)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=VALID_SPECS, arch=st.sampled_from(["llama", "gemma3_text", "gpt_neox", "qwen3", "llama_head_dim"]))
def test_fuzz_valid_specs_give_configs_stock_transformers_loads(spec, arch):
    from transformers import AutoConfig

    config = tiny.make_config(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_patch(config, spec)
        data = portable_config_dict(config.to_dict(), plan.slots, plan.max_position_embeddings, plan.marker)
        data.pop("transformers_version", None)
        loaded = AutoConfig.for_model(**data)
    verify_stock_config(loaded, plan)


# --- security ------------------------------------------------------------------------------------------------------
def test_remote_code_is_never_trusted_by_default(pristine, tmp_path, capsys):
    src = copy_tree(pristine, tmp_path / "src")
    _edit_config(src, auto_map={"AutoConfig": "evil.EvilConfig"}, model_type="evil-remote")
    (src / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    assert run(["patch", str(src), "-o", str(tmp_path / "out"), *YARN]) == 2
    err = capsys.readouterr().err
    assert "remote code ran" not in err and "rope-extend: error:" in err
