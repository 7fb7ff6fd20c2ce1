"""Bad input (table-driven, CLI and API), SIGKILL during write, property-based fuzzing, security defaults."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
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
    ModelConfigError,
    RopeExtendError,
    RopeSpec,
    SpecError,
    UnsupportedModelError,
    VerificationError,
    load_spec,
    plan_patch,
)
from rope_extend.checkpoint import patch_checkpoint, verify_output
from rope_extend.cli import run
from rope_extend.compat import portable_config_dict, read_slots
from rope_extend.plan import verify_stock_config
from rope_extend.spec import spec_keys

# CI runs a fixed sequence of examples (a red CI must mean a regression); locally hypothesis explores freely.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


checksums = tiny.checksums


@pytest.fixture(scope="module")
def pristine(tiny_llama_folder) -> Path:
    return tiny_llama_folder  # never written to: a test that changes its SOURCE copies it first (copy_tree)


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


# --- hostile and broken inputs (issue 12): every file read from SOURCE, every spec, every flag combination ----------
def _st_header(src, header, length=None):
    """Replace model.safetensors by a file with this header (an object, or raw bytes) and no tensor data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(raw) if length is None else length
    (src / "model.safetensors").write_bytes(size.to_bytes(8, "little") + raw)


def _index(src, weight_map):
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _nested_config(src, depth):
    data = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(data)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}")


def _link_outside(src, name, target):
    outside = src.parent / "outside"
    outside.mkdir(exist_ok=True)
    real = outside / target
    if name == "model.safetensors":
        (src / name).rename(real)
    else:
        real.write_text("a file outside SOURCE")
    (src / name).unlink(missing_ok=True)
    (src / name).symlink_to(real)


def _rope_parameters(src, **params):
    _edit_config(src, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **params}, rope_scaling=None)


LAUGHS = "method: yarn\nfactor: 2\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{chr(99 + i)}: &{chr(99 + i)} [{', '.join(['*' + chr(98 + i)] * 9)}]\n" for i in range(8)
)
FIELD = ["config.json field"]
CASES += [
    # config.json: types and ranges at the boundary, each naming the file and the field
    ("config-theta-one", lambda t: YARN, lambda s: _edit_config(s, rope_theta=1), FIELD + ["rope_theta", "> 1"], CheckpointError),
    ("config-theta-negative", lambda t: YARN, lambda s: _edit_config(s, rope_theta=-5.0), FIELD + ["rope_theta"], CheckpointError),
    ("config-theta-text", lambda t: YARN, lambda s: _edit_config(s, rope_theta="big"), FIELD + ["rope_theta"], CheckpointError),
    ("config-theta-nan", lambda t: YARN, lambda s: _edit_config(s, rope_theta=float("nan")), FIELD + ["finite"], CheckpointError),
    ("config-heads-zero", lambda t: YARN, lambda s: _edit_config(s, num_attention_heads=0), FIELD + ["num_attention_heads", "at least one head"], CheckpointError),
    ("config-kv-heads-zero", lambda t: YARN, lambda s: _edit_config(s, num_key_value_heads=0), FIELD + ["num_key_value_heads"], CheckpointError),
    ("config-hidden-zero", lambda t: YARN, lambda s: _edit_config(s, hidden_size=0), FIELD + ["hidden_size"], CheckpointError),
    ("config-heads-text", lambda t: YARN, lambda s: _edit_config(s, num_attention_heads="4"), FIELD + ["num_attention_heads", "whole number"], CheckpointError),
    ("config-length-zero", lambda t: YARN, lambda s: _edit_config(s, max_position_embeddings=0), FIELD + ["max_position_embeddings", "[1, 2147483647]"], CheckpointError),
    ("config-length-beyond-int64", lambda t: YARN, lambda s: _edit_config(s, max_position_embeddings=2**70), FIELD + ["max_position_embeddings", "[1, 2147483647]"], CheckpointError),
    ("config-length-fraction", lambda t: YARN, lambda s: _edit_config(s, max_position_embeddings=32.5), FIELD + ["whole number"], CheckpointError),
    ("config-length-list", lambda t: YARN, lambda s: _edit_config(s, max_position_embeddings=[32]), FIELD + ["max_position_embeddings", "array"], CheckpointError),
    ("config-rope-scaling-list", lambda t: YARN, lambda s: _edit_config(s, rope_scaling=[1, 2]), FIELD + ["rope_scaling", "object"], CheckpointError),
    ("config-rope-scaling-text", lambda t: YARN, lambda s: _edit_config(s, rope_scaling="yarn"), FIELD + ["rope_scaling"], CheckpointError),
    ("config-rope-parameters-text", lambda t: YARN, lambda s: _edit_config(s, rope_parameters="default"), FIELD + ["rope_parameters"], CheckpointError),
    ("config-rope-parameters-theta-zero", lambda t: YARN, lambda s: _rope_parameters(s, rope_theta=0), FIELD + ["rope_parameters.rope_theta"], CheckpointError),
    ("config-rope-parameters-factor-negative", lambda t: YARN, lambda s: _rope_parameters(s, factor=-2), FIELD + ["rope_parameters.factor", "> 0"], CheckpointError),
    ("config-rope-type-number", lambda t: YARN, lambda s: _rope_parameters(s, rope_type=3), FIELD + ["rope_parameters.rope_type"], CheckpointError),
    ("config-partial-rotary-two", lambda t: YARN, lambda s: _edit_config(s, partial_rotary_factor=2), FIELD + ["partial_rotary_factor", "(0, 1]"], CheckpointError),
    ("config-model-type-number", lambda t: YARN, lambda s: _edit_config(s, model_type=5), FIELD + ["model_type"], CheckpointError),
    ("config-layer-types-text", lambda t: YARN, lambda s: _edit_config(s, layer_types="full_attention"), FIELD + ["layer_types"], CheckpointError),
    ("config-text-config-list", lambda t: YARN, lambda s: _edit_config(s, text_config=[1]), FIELD + ["text_config"], CheckpointError),
    ("config-marker-text", lambda t: YARN, lambda s: _edit_config(s, rope_extend="yarn"), FIELD + ["rope_extend"], CheckpointError),
    ("config-marker-damaged", lambda t: YARN, lambda s: _edit_config(s, rope_extend={"spec": {"method": "yarn"}, "original": {"max_position_embeddings": 32}}), FIELD + ["rope_extend.original", "damaged"], CheckpointError),
    ("config-nested-recursion", lambda t: YARN, lambda s: _nested_config(s, 100_000), ["config.json", "nested too deeply"], CheckpointError),
    ("config-nested-deep", lambda t: YARN, lambda s: _nested_config(s, 40), ["config.json", "levels deep"], CheckpointError),
    # a stray partial_rotary_factor: stock RoPE numbers agree, but the model cannot run (4.x: even unpatched; 5.x:
    # once its scaled RoPE applies the factor, test_patch asks which) -> the config is at fault (a ValueError naming
    # the field), never "verified"
    ("config-stray-partial-rotary", lambda t: YARN, lambda s: _edit_config(s, partial_rotary_factor=0.5), ["cannot run a forward pass", "partial_rotary_factor 0.5", "remove partial_rotary_factor"], ModelConfigError),
    # safetensors headers: right JSON syntax, wrong shape
    ("safetensors-header-list", lambda t: YARN, lambda s: _st_header(s, [1, 2]), ["model.safetensors", "not an object"], CheckpointError),
    ("safetensors-header-text", lambda t: YARN, lambda s: _st_header(s, "weights"), ["model.safetensors", "not an object"], CheckpointError),
    ("safetensors-offsets-text", lambda t: YARN, lambda s: _st_header(s, {"w": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}}), ["data_offsets"], CheckpointError),
    ("safetensors-entry-list", lambda t: YARN, lambda s: _st_header(s, {"w": [0, 4]}), ["tensor 'w'", "data_offsets"], CheckpointError),
    ("safetensors-no-dtype", lambda t: YARN, lambda s: _st_header(s, {"w": {"data_offsets": [0, 0]}}), ["dtype"], CheckpointError),
    ("safetensors-header-huge", lambda t: YARN, lambda s: _st_header(s, b"{}", length=2**63), ["header length"], CheckpointError),
    ("safetensors-header-not-json", lambda t: YARN, lambda s: _st_header(s, b"\xff\xfe not json"), ["not JSON"], CheckpointError),
    # index.json: wrong shapes, and entries pointing outside SOURCE
    ("index-outside-source", lambda t: YARN, lambda s: _index(s, {"a": "../../etc/passwd.safetensors"}), ["inside SOURCE"], CheckpointError),
    ("index-absolute-path", lambda t: YARN, lambda s: _index(s, {"a": "/etc/model.safetensors"}), ["inside SOURCE"], CheckpointError),
    ("index-not-a-shard", lambda t: YARN, lambda s: _index(s, {"a": "../../etc/passwd"}), [".safetensors shard"], CheckpointError),
    ("index-map-list", lambda t: YARN, lambda s: _index(s, ["model.safetensors"]), ["weight_map", "object"], CheckpointError),
    ("index-map-empty", lambda t: YARN, lambda s: _index(s, {}), ["weight_map"], CheckpointError),
    ("index-entry-number", lambda t: YARN, lambda s: _index(s, {"a": 5}), ["weight_map['a']"], CheckpointError),
    ("index-not-object", lambda t: YARN, lambda s: (s / "model.safetensors.index.json").write_text('"x"'), ["JSON object"], CheckpointError),
    # links out of SOURCE are never followed (only the Hub cache's snapshot -> blobs)
    ("link-to-outside-file", lambda t: YARN, lambda s: _link_outside(s, "notes.txt", "secret.txt"), ["symbolic link", "Hub cache layout"], CheckpointError),
    ("link-weights-outside", lambda t: YARN, lambda s: _link_outside(s, "model.safetensors", "w.safetensors"), ["symbolic link"], CheckpointError),
    # specs: bounded YAML, sane ranges, no silent ambiguity
    ("yaml-alias", lambda t: _yaml(t, "method: yarn\nfactor: &f 2\nbeta_fast: *f\n"), None, ["anchors"], SpecError),
    ("yaml-billion-laughs", lambda t: _yaml(t, LAUGHS), None, ["not allowed"], SpecError),
    ("yaml-duplicate-key", lambda t: _yaml(t, "method: yarn\nfactor: 2\nfactor: 4\n"), None, ["'factor' appears twice"], SpecError),
    ("yaml-deep-nesting", lambda t: _yaml(t, "method: yarn\nfactor: 2\nlayer_types: " + "[" * 60 + "]" * 60 + "\n"), None, ["nests deeper"], SpecError),
    ("yaml-huge-file", lambda t: _yaml(t, "method: yarn\nfactor: 2\n" + "# padding\n" * 200_000), None, ["byte limit"], SpecError),
    ("yaml-hex-number", lambda t: _yaml(t, "method: yarn\nfactor: 0x10\n"), None, ["'factor'", "'0x10'"], SpecError),
    ("yaml-null-key", lambda t: _yaml(t, "method: yarn\nfactor: 2\nnull: 3\n"), None, ["keys must be names"], SpecError),
    ("yaml-is-a-folder", lambda t: ["--config", str(t)], None, ["is a folder"], SpecError),
    ("factor-beyond-range", lambda t: ["--method", "yarn", "--factor", "5000"], None, ["[1, 1024]"], SpecError),
    ("target-beyond-range", lambda t: ["--method", "yarn", "--target-length", "99999999999"], None, ["[1, 2147483647]"], SpecError),
    ("target-beyond-int64", lambda t: ["--method", "yarn", "--set", "target_length=99999999999999999999999"], None, ["[1, 2147483647]"], SpecError),
    ("spec-theta-one", lambda t: YARN + ["--set", "rope_theta=1"], None, ["rope_theta", "> 1"], SpecError),
    ("spec-theta-negative", lambda t: YARN + ["--set", "rope_theta=-3"], None, ["rope_theta"], SpecError),
    ("set-empty-value", lambda t: YARN + ["--set", "beta_fast="], None, ["empty value"], SpecError),
    ("set-conflicts-with-flag", lambda t: YARN + ["--set", "factor=8"], None, ["--factor 2", "disagree"], SpecError),
    ("set-twice", lambda t: YARN + ["--set", "beta_fast=64", "--set", "beta_fast=32"], None, ["given twice"], SpecError),
    ("factor-one-is-a-no-op", lambda t: ["--method", "yarn", "--factor", "1"], None, ["yarn x1: 32 -> 32 tokens extends nothing", "--target-length 64"], SpecError),
    ("factor-rounding-to-one", lambda t: ["--method", "yarn", "--factor", "1.0000001"], None, ["yarn x1.0000001: 32 -> 32", "rounds to 32"], SpecError),
    ("target-beyond-factor-range", lambda t: ["--method", "yarn", "--target-length", "2147483647"], None, ["target_length 2147483647", "x6.71089e+07", "outside the factor range [1, 1024]", "at most 32768 tokens"], SpecError),
    # flags that would be silently ignored or write where the user did not ask
    ("revision-with-local-folder", lambda t: YARN + ["--revision", "main"], None, ["--revision 'main'", "local folder"], CheckpointError),
    ("eval-dir-inside-source", lambda t: YARN + ["--eval", "smoke", "--eval-dir", str(t / "src" / "report")], None, ["inside SOURCE"], CheckpointError),
    ("eval-unknown-suite", lambda t: YARN + ["--eval", "no-such-suite"], None, ["no-such-suite", "not found"], CheckpointError),
    ("eval-dir-without-eval", lambda t: YARN + ["--eval-dir", str(t / "report")], None, ["only applies"], CheckpointError),
]
CLI_ONLY = ("--push-to-hub", "--eval", "--eval-dir")


@pytest.mark.parametrize("case_id, args, mutate, words, api_error", CASES, ids=[c[0] for c in CASES])
def test_bad_input_cli_and_api(pristine, tmp_path, capsys, case_id, args, mutate, words, api_error):
    src = copy_tree(pristine, tmp_path / "src")
    if mutate:
        mutate(src)
    capsys.readouterr()
    before = checksums(src)
    out = tmp_path / "new" / "out"  # its parent does not exist: a refused run must not leave it behind
    extra = args(tmp_path)
    present = sorted(tmp_path.iterdir())
    assert run(["patch", str(src), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rope-extend: error:"), err
    for word in words:
        assert word in err[0], err[0]
    assert sorted(tmp_path.iterdir()) == present  # nothing written anywhere: no OUT, parents, temp or eval folders
    assert checksums(src) == before
    # the Python API raises the documented exception (a RopeExtendError, and a builtin ValueError/RuntimeError)
    if any(flag in extra for flag in CLI_ONLY):
        return  # CLI options
    assert issubclass(api_error, RopeExtendError) and issubclass(api_error, (ValueError, RuntimeError))
    with pytest.raises(api_error):
        spec = _api_spec(extra)
        get = lambda flag: extra[extra.index(flag) + 1] if flag in extra else None
        patch_checkpoint(src, spec, out, mode=get("--mode") or "auto", dtype=get("--dtype"), revision=get("--revision"))
    assert sorted(tmp_path.iterdir()) == present
    assert checksums(src) == before


def _api_spec(extra):
    from rope_extend.cli.options import build_spec

    get = lambda flag: extra[extra.index(flag) + 1] if flag in extra else None
    sets = [extra[i + 1] for i, a in enumerate(extra) if a == "--set"]
    factor = get("--factor")
    target = get("--target-length")
    return build_spec(get("--method"), float(factor) if factor else None, int(target) if target else None,
                      Path(get("--config")) if get("--config") else None, sets)


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
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("rope-extend: [")]
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
        # kill times spread from "at once" (before any write) to well past a whole run (after the rename)
        time.sleep(trial / 19 * duration * 1.6 * rng.uniform(0.9, 1.1) if trial < 19 else duration * 4)
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
    # both outcomes must have happened, or the test did not exercise an interrupted write (nor a finished one)
    assert outcomes["absent"] > 0 and outcomes["complete"] > 0, outcomes
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
SPEC_KEYS = spec_keys() + ["fator", "type", "rope_type", ""]
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
    assert RopeSpec(**spec.to_dict()) == spec  # what validates also round-trips
    for original in (1, 4096):
        try:
            resolved = spec.resolve(original)
        except SpecError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        assert resolved.original_max_position_embeddings == (spec.original_max_position_embeddings or original)
        assert abs(resolved.factor * resolved.original_max_position_embeddings - resolved.target_length) < 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fuzz_yaml_text_gives_spec_or_spec_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(text)
    try:
        spec = load_spec(path)
    except SpecError as exc:
        assert str(exc) and "\n" not in str(exc) and "spec" in str(exc).lower()
        return
    assert isinstance(spec, RopeSpec) and load_spec(spec.to_dict()) == spec


FACTORS = st.floats(1.0 + 1 / 32, 64.0, allow_nan=False)  # every one reaches beyond L = 32 (factor 1 is refused)
VALID_SPECS = st.one_of(
    st.builds(dict, method=st.sampled_from(["linear", "ntk", "dynamic", "llama3"]), factor=FACTORS),
    st.builds(dict, method=st.sampled_from(["yarn", "ntk-by-parts", "dynamic-yarn"]),
              factor=FACTORS, beta_fast=st.floats(2.0, 256.0), beta_slow=st.floats(0.01, 1.9),
              truncate=st.booleans()),
    st.builds(dict, method=st.just("yarn"), factor=FACTORS, mscale=st.floats(0.1, 2.0),
              mscale_all_dim=st.floats(0.1, 2.0)),
    st.builds(dict, method=st.just("yarn"), target_length=st.integers(33, 32 * 1024),  # factor <= 1024 on L = 32
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


# --- signals: real SIGINT / SIGTERM on a real process ---------------------------------------------------------------
def _cli_process(args, env_extra=None, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and not k.lower().endswith("_proxy")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})})
    return subprocess.Popen([sys.executable, "-m", "rope_extend", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kwargs)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_exits_128_plus_signal_and_leaves_nothing(pristine, tmp_path, signum, code):
    src = copy_tree(pristine, tmp_path / "src")
    before = checksums(src)
    out = tmp_path / "new" / "out"
    process = _cli_process(["patch", src, "-o", out, "--method", "yarn", "--factor", "4", "--mode", "full"])
    first = process.stderr.readline()  # progress starts once validation passed: the write is under way
    assert first.startswith("rope-extend: [1/2] writing the full checkpoint"), first
    # at once: on an idle machine the rest of this tiny model's write and verification takes ~0.2 s, so a later
    # signal can land after the command has finished (it did in CI), which tests nothing
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == code, (stdout, stderr)
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("rope-extend: [")]
    name = signal.Signals(signum).name
    assert lines == [f"rope-extend: interrupted ({name}); nothing was left at {out}"], stderr
    assert not (tmp_path / "new").exists() and checksums(src) == before
    assert "wrote" not in stdout


def test_sigterm_the_moment_the_temporary_folder_appears_leaves_nothing(pristine, tmp_path, monkeypatch, capsys):
    """Issue 57: SIGTERM right after the temporary output folder was created (before, the cleanup was armed only
    after it: the folder stayed, exit 143 saying "nothing was left"). The test hook pins that moment; the hook ran."""
    from rope_extend import checkpoint

    src = copy_tree(pristine, tmp_path / "src")
    out = tmp_path / "new" / "out"
    seen = []

    def terminate(tmp):
        seen.append(tmp.is_dir())
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(checkpoint, "_tmp_created", terminate)
    capsys.readouterr()
    assert run(["patch", str(src), "-o", str(out), "--method", "yarn", "--factor", "4", "--mode", "full"]) == 143
    assert seen == [True]  # the signal came with the folder there
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("rope-extend: [")]
    assert lines == [f"rope-extend: interrupted (SIGTERM); nothing was left at {out}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no OUT, no hidden folder, no parent created


# --- what 'verified' promises --------------------------------------------------------------------------------------
def test_patch_model_refuses_a_model_that_would_not_run_and_changes_nothing():
    import torch

    from rope_extend import patch_model

    model = tiny.make_model("llama")
    model.config.partial_rotary_factor = 0.5  # stray: llama's attention rotates the whole head
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    ids = tiny.input_ids(8)
    with torch.no_grad():
        expected = model(ids).logits
    with pytest.raises(ModelConfigError, match="partial_rotary_factor 0.5") as refused:  # test_patch: which message
        patch_model(model, method="yarn", factor=2)
    assert isinstance(refused.value, ValueError) and not isinstance(refused.value, VerificationError)
    assert (refused.value.field, refused.value.value) == ("partial_rotary_factor", 0.5)
    assert torch.equal(model.model.rotary_emb.inv_freq, inv_freq)
    assert model.config.max_position_embeddings == tiny.ORIGINAL
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)  # still runs, unchanged


def test_verification_compares_a_real_forward_beyond_the_original_length(pristine, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_extend.verify import probe_inputs, probe_outputs, verify_plan

    out = tmp_path / "out"
    patch_checkpoint(pristine, {"method": "yarn", "factor": 4}, out)
    config = AutoConfig.from_pretrained(out)
    plan = plan_patch(AutoConfig.from_pretrained(pristine), {"method": "yarn", "factor": 4})
    _, positions = probe_inputs(plan, 128)
    assert positions.max().item() == 4 * tiny.ORIGINAL - 1 > tiny.ORIGINAL  # beyond the original window
    stock = AutoModelForCausalLM.from_pretrained(out).eval()
    outputs = probe_outputs(stock, plan)
    verify_plan(plan, source_config=config, stock_config=config, patched_outputs=outputs, stock_model=stock)
    with pytest.raises(VerificationError, match="disagree beyond the original length"):
        verify_plan(plan, source_config=config, stock_config=config, patched_outputs=outputs * 1.01, stock_model=stock)
    with torch.no_grad():  # the probe really is the model's output at those positions, and RoPE matters to it
        ids, positions = probe_inputs(plan, config.vocab_size)
        torch.testing.assert_close(stock(input_ids=ids, position_ids=positions).logits, outputs)
        shifted = stock(input_ids=ids, position_ids=positions // 2).logits
    assert (shifted - outputs).abs().max() > 1e-3  # other positions give other outputs: the probe sees rotations


# --- nothing written where the user did not ask ----------------------------------------------------------------------
def test_overwrite_only_replaces_model_folders(pristine, tmp_path, capsys, monkeypatch):
    src = copy_tree(pristine, tmp_path / "src")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "notes.md").write_text("mine")
    (work / "config.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    code_dir = tmp_path / "project"
    (code_dir / ".git").mkdir(parents=True)
    (code_dir / "train.py").write_text("print('mine')")
    refused = [(".", "the current folder"), ("~", "your home folder"), ("/", "the filesystem root"),
               (str(tmp_path), "inside OUT"), (str(code_dir), "not a checkpoint")]
    for out, words in refused:
        assert run(["patch", str(src), "-o", out, *YARN, "--overwrite"]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert (home / "notes.md").read_text() == "mine" and (code_dir / "train.py").exists()
    previous = tmp_path / "previous"
    assert run(["patch", str(src), "-o", str(previous), *YARN]) == 0
    assert run(["patch", str(src), "-o", str(previous), "--method", "ntk", "--factor", "2", "--overwrite"]) == 0
    assert "method: ntk" in (previous / "rope_extend.yaml").read_text()  # a folder rope-extend wrote
    models_only = copy_tree(pristine, tmp_path / "models-only")
    assert run(["patch", str(src), "-o", str(models_only), *YARN, "--overwrite"]) == 0
    assert (models_only / "rope_extend.yaml").exists()


def test_card_and_out_hold_no_local_paths_or_cache_markers(pristine, tmp_path):
    src = copy_tree(pristine, tmp_path / "src")
    (src / ".complete").write_text('{"source": "demo cache marker"}')
    out = tmp_path / "out"
    patch_checkpoint(src, {"method": "yarn", "factor": 2}, out)
    assert not (out / ".complete").exists()
    for name in ("README.md", "config.json", "rope_extend.yaml"):
        text = (out / name).read_text()
        assert str(tmp_path) not in text, name
    card = (out / "README.md").read_text()
    assert "the local checkpoint `src`" in card and "vllm serve ./out " in card  # OUT beside the reader


# --- the Hub unreachable: one behaviour everywhere -----------------------------------------------------------------
def test_hub_unreachable_fails_fast_with_one_line(tmp_path):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path)}
    commands = [["show", "acme/model"], ["inspect", "acme/model"],
                ["patch", "acme/model", "--method", "yarn", "--factor", "2", "-o", tmp_path / "out"]]
    for args in commands:
        started = time.perf_counter()
        process = _cli_process(args, {**env, "HF_HUB_OFFLINE": "0"})
        stdout, stderr = process.communicate(timeout=120)
        seconds = time.perf_counter() - started
        lines = stderr.strip().splitlines()
        assert process.returncode == 2 and len(lines) == 1, (args, stderr)
        assert "unreachable" in lines[0] and "not in the local Hub cache" in lines[0], lines[0]
        assert seconds < 60, (args, seconds)  # no retry loop (the import of torch alone takes seconds here)
    assert not (tmp_path / "out").exists()


def test_push_with_the_hub_unreachable_says_out_is_complete(pristine, tmp_path, capsys, monkeypatch):
    from rope_extend import hub

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_TOKEN", "hf_x")  # the token is checked first (tests/test_hub_push.py: a real server)
    out = tmp_path / "out"
    assert run(["patch", str(pristine), "-o", str(out), *YARN, "--push-to-hub", "me/tiny"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("rope-extend: [")]
    assert len(err) == 1 and "unreachable" in err[0] and "is kept as it is: push it later with" in err[0], err
    assert f"`rope-extend push {out} me/tiny`" in err[0]
    assert (out / "config.json").exists() and (out / "rope_extend.yaml").exists()


# --- a newcomer's first hour ---------------------------------------------------------------------------------------
def test_version_debug_and_progress_when_not_a_terminal(pristine, tmp_path, capsys):
    from rope_extend import __version__

    assert run(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"rope-extend {__version__} (transformers ")
    process = _cli_process(["--help"], {"COLUMNS": "100"})
    stdout, _ = process.communicate(timeout=120)
    assert "--debug" in stdout and "--version" in stdout
    out = tmp_path / "out"
    process = _cli_process(["patch", pristine, "-o", out, "--method", "yarn", "--factor", "2"])
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    # one line per step (a step's wrapped continuation lines repeat its prefix, indented by two)
    stderr = re.sub(r"\nrope-extend: \[\d+/\d+\]   ", " ", stderr)
    progress = [line for line in stderr.splitlines() if line.startswith("rope-extend: [")]
    assert [line.split("]")[0] for line in progress] == ["rope-extend: [1/2", "rope-extend: [2/2"], stderr
    assert "elapsed" in progress[0] and "ETA" in progress[1]
    assert "rope-extend: [" not in stdout and stdout.split()[0] == "wrote"  # (the path on the next line when long)


def test_show_fits_80_columns_without_cut_cells_or_raw_dicts(pristine, tmp_path):
    out = tmp_path / "out"
    patch_checkpoint(pristine, {"method": "yarn", "factor": 4}, out)
    process = _cli_process(["show", out], {"COLUMNS": "80"})
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "…" not in stdout and "{'" not in stdout and "{\"" not in stdout, stdout
    for key in ("rope_type:", "rope_theta:", "rotary dim:", "original length:", "attention_factor:"):
        assert key in stdout
    assert "yarn" in stdout and "factor=4" in stdout and "10000" in stdout


def test_every_command_accepts_the_smollm2_alias(pristine, tmp_path, capsys, monkeypatch):
    import rope_extend.demo_model as demo_model

    monkeypatch.setattr(demo_model, "smollm2_path", lambda cache_dir=None: pristine)
    monkeypatch.chdir(tmp_path)  # no folder named smollm2 here
    assert run(["show", "smollm2"]) == 0
    assert "max_position_embeddings: 32" in capsys.readouterr().out
    assert run(["inspect", "smollm2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inspection"]["original_length"] == 32
    assert run(["patch", "smollm2", "-o", str(tmp_path / "out"), *YARN]) == 0
    # the card names the Hub repo the alias stands for (issue 37: base_model whenever the source is known)
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in (tmp_path / "out" / "README.md").read_text()


# --- the Hub cache (issue 18): one rule for every file SOURCE names, index entries included ---------------------------
@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sharded") / "src"
    tiny.make_model("llama").save_pretrained(folder, max_shard_size="100KB")
    assert len(list(folder.glob("model-*.safetensors"))) >= 3 and (folder / "model.safetensors.index.json").exists()
    return folder


def _hub(tmp_path, monkeypatch, folder, repo="acme/tiny-sharded"):
    import hubcache

    cache = tmp_path / "hub"
    snapshot = hubcache.from_folder(cache, repo, folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache, snapshot


def test_sharded_model_from_the_hub_cache_is_patched_and_every_shard_linked(sharded, tmp_path, monkeypatch, capsys):
    """Every shard is the blob's inode in OUT (a hard link: this filesystem has no clone); the index, a small file,
    is OUT's own copy."""
    cache, snapshot = _hub(tmp_path, monkeypatch, sharded)
    before = checksums(cache)
    out = tmp_path / "out"
    assert run(["patch", "acme/tiny-sharded", "-o", str(out), *YARN]) == 0, capsys.readouterr().err
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    for name in shards + ["model.safetensors.index.json"]:
        blob = Path(os.path.realpath(snapshot / name))
        assert blob.parent == cache / "models--acme--tiny-sharded" / "blobs"
        assert not (out / name).is_symlink()
        shared = name.endswith(".safetensors")
        assert (os.stat(out / name).st_ino == os.stat(blob).st_ino) is shared
        assert os.stat(blob).st_nlink == (2 if shared else 1)  # the blob and OUT's hard link / a copy
    assert (out / "model.safetensors.index.json").read_bytes() == (snapshot / "model.safetensors.index.json").read_bytes()
    assert checksums(cache) == before


def _relink(snapshot: Path, name: str, target) -> None:
    (snapshot / name).unlink()
    os.symlink(target, snapshot / name)


def _other_repo_blob(snapshot: Path, name: str, absolute: bool) -> None:
    """`name` links to a copy of its own blob in another repo of the same cache (same bytes, other repo)."""
    cache = snapshot.parents[2]
    other = cache / "models--evil--repo" / "blobs"
    other.mkdir(parents=True)
    blob = other / Path(os.path.realpath(snapshot / name)).name
    blob.write_bytes((snapshot / name).read_bytes())
    _relink(snapshot, name, blob if absolute else os.path.relpath(blob, snapshot))


def _index_entry(snapshot: Path, entry: str) -> None:
    """Rewrite the index (a new blob, as the Hub would store it) so that its first tensor names `entry`."""
    import hubcache

    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = entry
    data = json.dumps(index).encode()
    blob = snapshot.parents[1] / "blobs" / hubcache.git_blob_sha1(data)
    blob.write_bytes(data)
    _relink(snapshot, "model.safetensors.index.json", os.path.relpath(blob, snapshot))


def _first_shard(snapshot: Path) -> str:
    return sorted(p.name for p in snapshot.glob("model-*.safetensors"))[0]


def _loop(snapshot: Path) -> None:
    blobs = snapshot.parents[1] / "blobs"
    os.symlink("loop", blobs / "loop")  # blobs/loop -> itself
    _relink(snapshot, _first_shard(snapshot), "../../blobs/loop")


def _nested_blob(snapshot: Path) -> None:
    name = _first_shard(snapshot)
    nested = snapshot.parents[1] / "blobs" / "sub"
    nested.mkdir()
    (nested / "x").write_bytes((snapshot / name).read_bytes())
    _relink(snapshot, name, "../../blobs/sub/x")


def _dir_link_entry(snapshot: Path) -> None:
    outside = snapshot.parents[4] / "outside"
    outside.mkdir()
    (outside / "w.safetensors").write_bytes((snapshot / _first_shard(snapshot)).read_bytes())
    os.symlink(outside, snapshot / "sub")
    _index_entry(snapshot, "sub/w.safetensors")


def _outside_file(snapshot: Path, name: str) -> None:
    outside = snapshot.parents[4] / f"outside-{name}"
    outside.write_bytes((snapshot / name).read_bytes())
    _relink(snapshot, name, outside)


HUB_CASES = [
    ("shard-into-other-repo-blobs", lambda s: _other_repo_blob(s, _first_shard(s), absolute=False), ["symbolic link", "same repo"]),
    ("shard-absolute-other-repo-blob", lambda s: _other_repo_blob(s, _first_shard(s), absolute=True), ["symbolic link", "same repo"]),
    ("index-into-other-repo-blobs", lambda s: _other_repo_blob(s, "model.safetensors.index.json", absolute=False), ["symbolic link"]),
    ("index-link-outside-cache", lambda s: _outside_file(s, "model.safetensors.index.json"), ["symbolic link"]),
    ("config-link-outside-cache", lambda s: _outside_file(s, "config.json"), ["symbolic link"]),
    ("shard-link-outside-cache", lambda s: _outside_file(s, _first_shard(s)), ["symbolic link"]),
    ("shard-link-loop", _loop, ["broken (or looping) link"]),
    ("shard-dangling-blob", lambda s: _relink(s, _first_shard(s), "../../blobs/" + "0" * 64), ["broken (or looping) link"]),
    ("shard-nested-in-blobs", _nested_blob, ["symbolic link"]),
    ("index-entry-dotdot-to-blob", lambda s: _index_entry(s, "../../blobs/x.safetensors"), ["inside SOURCE"]),
    ("index-entry-absolute", lambda s: _index_entry(s, str(Path(os.path.realpath(s / _first_shard(s)))) + ".safetensors"), ["inside SOURCE"]),
    ("index-entry-through-linked-folder", _dir_link_entry, ["symbolic link"]),
]


@pytest.mark.parametrize("case_id, mutate, words", HUB_CASES, ids=[c[0] for c in HUB_CASES])
def test_hub_cache_hostile_links_are_refused(sharded, tmp_path, monkeypatch, capsys, case_id, mutate, words):
    cache, snapshot = _hub(tmp_path, monkeypatch, sharded)
    mutate(snapshot)
    out = tmp_path / "new" / "out"
    capsys.readouterr()
    assert run(["patch", "acme/tiny-sharded", "-o", str(out), *YARN]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rope-extend: error:"), err
    for word in words:
        assert word in err[0], err[0]
    assert not (tmp_path / "new").exists()
    with pytest.raises(CheckpointError):
        patch_checkpoint("acme/tiny-sharded", {"method": "yarn", "factor": 2}, out)


# --- the rest of the hostile-input table (issue 18 §5) -------------------------------------------------------------
def test_inspect_recommend_refuses_an_absurd_target_length(pristine, capsys):
    for target, words in ((99999999999, ["99999999999", "[1, 2147483647]"]),
                          (tiny.ORIGINAL * 1024 + 1, [str(tiny.ORIGINAL * 1024 + 1), "[1, 1024]"])):
        assert run(["inspect", str(pristine), "--recommend", "--target-length", str(target)]) == 2, target
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(word in err[0] for word in words), err
    assert run(["inspect", str(pristine), "--recommend", "--target-length", str(tiny.ORIGINAL * 1024)]) == 0


def test_validate_names_a_bad_original_length(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("method: yarn\nfactor: 4\n")
    for bad in ("0", "-3"):
        assert run(["validate", str(spec), "--original-length", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--original-length {bad} " in err[0], err
        with pytest.raises(SpecError, match=f"original context length {bad} "):
            load_spec(spec).resolve(int(bad))
    assert run(["validate", str(spec), "--original-length", "4096"]) == 0
    assert "target_length: 16384" in capsys.readouterr().out


def test_out_that_is_a_link_is_refused_before_any_work(pristine, tmp_path, capsys, monkeypatch):
    from rope_extend import checkpoint

    def no_work(*args, **kwargs):
        raise AssertionError("SOURCE was scanned: OUT was not checked first")

    monkeypatch.setattr(checkpoint, "scan_source", no_work)
    dangling = tmp_path / "out"
    dangling.symlink_to(tmp_path / "nowhere")
    linked_dir = tmp_path / "out2"
    (tmp_path / "empty").mkdir()
    linked_dir.symlink_to(tmp_path / "empty")
    for out, words in ((dangling, ["symbolic link", "dangling"]), (linked_dir, ["symbolic link", "real folder"])):
        assert run(["patch", str(pristine), "-o", str(out), *YARN]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(word in err[0] for word in [f"OUT {str(out)!r}", *words]), err
        with pytest.raises(CheckpointError, match="symbolic link"):
            patch_checkpoint(pristine, {"method": "yarn", "factor": 2}, out)
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists() and not any((tmp_path / "empty").iterdir())
