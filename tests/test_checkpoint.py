"""`rope-extend patch` end to end: fast path vs full path, hard links, SOURCE untouched, atomic output, errors,
Hub-id resolution from a local Hub cache (offline), model card (the push: tests/test_hub_push.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hubcache
import pytest
import tiny
import torch
from transformers import AutoModelForCausalLM

from rope_extend import CheckpointError, patch_model
from rope_extend.cli import run
from rope_extend.files import check_safetensors

checksums = tiny.checksums


def cli(*args) -> int:
    return run([str(a) for a in args])


def stock_logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture()
def source(tmp_path, user_checkpoint):
    """conftest.py's `user_checkpoint`, copied: these tests write into their SOURCE (truncate, delete, convert)."""
    return Path(shutil.copytree(user_checkpoint, tmp_path / "src"))


def test_fast_and_full_paths_load_to_identical_logits(source, tmp_path, capsys):
    before = checksums(source)
    ids = tiny.input_ids()
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", tmp_path / "fast") == 0
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", tmp_path / "full", "--mode", "full") == 0
    fast, full = stock_logits(tmp_path / "fast", ids), stock_logits(tmp_path / "full", ids)
    model = tiny.make_model("llama")
    patch_model(model, method="yarn", factor=4)
    with torch.no_grad():
        in_memory = model(ids).logits
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, in_memory, atol=1e-5, rtol=0)
    # the fast path shares the weights (a hard link here: this filesystem has no clone); SOURCE is byte-identical
    assert os.path.samefile(source / "model.safetensors", tmp_path / "fast" / "model.safetensors")
    assert checksums(source) == before
    # length caps users forget are raised; provenance written
    assert json.loads((tmp_path / "fast" / "tokenizer_config.json").read_text())["model_max_length"] == 4 * tiny.ORIGINAL
    assert json.loads((tmp_path / "fast" / "generation_config.json").read_text())["max_length"] == 4 * tiny.ORIGINAL
    assert "method: yarn" in (tmp_path / "fast" / "rope_extend.yaml").read_text()
    out = capsys.readouterr().out
    # stdout says what to do next in three lines (wrapped at 80 columns between words, the serve command with shell
    # continuations); every engine's command is in the model card
    fast = tmp_path / "fast"
    words = " ".join(out.replace(" \\\n", " ").split())
    assert "verified with stock transformers" in words and f"output: {fast} " in words
    assert "(config-only: 1 hard-linked," in words  # issue 57: and what that means for an in-place write
    assert "note: the hard-linked files are SOURCE's own bytes under a second name: a program that writes into one " \
           "in place changes SOURCE too" in words
    assert f"serve: vllm serve {fast} --max-model-len {4 * tiny.ORIGINAL}" in words and "--rope-scaling yarn" not in out
    assert f"report: {fast / 'README.md'}" in words and "--rope-scaling yarn" in (fast / "README.md").read_text()


def test_a_full_write_keeps_sources_shard_layout_and_never_writes_shards_over_the_cap(source, tmp_path, monkeypatch):
    """Issue 66 item 2: `patch --mode full` wrote one model.safetensors whatever SOURCE's shards (transformers 5's
    default max_shard_size is 50 GB). A SOURCE in 4 shards gives the same 4 shards, the same index; an unsharded
    SOURCE larger than the cap (`checkpoint.MAX_SHARD_BYTES`, 5 GB; set to 40 kB here) gives shards of at most the
    cap; the record lists every shard and the index."""
    from safetensors import safe_open

    from rope_extend import checkpoint
    from rope_extend.record import read_record

    sharded = tmp_path / "sharded"
    tiny.make_model("llama").save_pretrained(sharded, max_shard_size="40KB")
    names = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(names) >= 3
    out = tmp_path / "out"
    assert cli("patch", sharded, "--method", "yarn", "--factor", 4, "-o", out, "--mode", "full") == 0
    assert sorted(p.name for p in out.glob("*.safetensors")) == names  # as many shards, none larger

    def tensor_bytes(shard: Path) -> int:
        with safe_open(shard, "pt") as handle:
            return sum(handle.get_tensor(k).nbytes for k in handle.keys())

    assert max(tensor_bytes(out / n) for n in names) <= max(tensor_bytes(sharded / n) for n in names)
    index = "model.safetensors.index.json"
    assert set(json.loads((out / index).read_text())["weight_map"].values()) == set(names)
    assert read_record(out).weights == sorted([*names, index])

    cap = 40_000
    monkeypatch.setattr(checkpoint, "MAX_SHARD_BYTES", cap)
    assert (source / "model.safetensors").stat().st_size > 2 * cap
    capped = tmp_path / "capped"
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", capped, "--mode", "full") == 0
    shards = sorted(capped.glob("*.safetensors"))
    assert len(shards) >= 3 and not (capped / "model.safetensors").exists()
    assert max(map(tensor_bytes, shards)) <= cap  # the tensors' bytes of each shard (its header aside)
    torch.testing.assert_close(stock_logits(capped, tiny.input_ids()), stock_logits(out, tiny.input_ids()))


def test_config_only_does_not_load_weights(source, tmp_path, monkeypatch):
    """The fast path never opens the weights with torch: poison the loaders and it still works."""
    import safetensors.torch
    import transformers

    def boom(*args, **kwargs):
        raise AssertionError("weights were loaded on the config-only path")

    monkeypatch.setattr(safetensors.torch, "load_file", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    assert cli("patch", source, "--method", "ntk", "--factor", 2, "-o", tmp_path / "out") == 0


def test_config_from_yaml_with_overrides(source, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("method: yarn\nfactor: 8\n")
    out = tmp_path / "out"
    assert cli("patch", source, "--config", spec, "--factor", 2, "--set", "beta_fast=64", "-o", out) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"]["factor"] == 2.0 and config["rope_scaling"]["beta_fast"] == 64.0
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_theta"] == 10000.0
    assert config["max_position_embeddings"] == 2 * tiny.ORIGINAL


def test_messages_suggest_what_the_command_line_can_do(source, tmp_path, capsys):
    """Issue 66 item 7: patching rope-extend's own output again suggested `unpatch_model()` (the Python API) to a
    command-line user; a method given where a spec file goes (`--config yarn`, eval's `--spec yarn`) said only that
    the file does not exist: each names what to type instead."""
    from rope_extend.errors import SpecError
    from rope_extend.spec import parse_inline_spec

    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", out) == 0
    capsys.readouterr()
    for method, said in (("yarn", "or patch the model this one was written from, its SOURCE"),
                         ("self-extend", "which would drop that patch: patch the model this one was written from, "
                                         "its SOURCE, with self-extend")):
        assert cli("patch", out, "--method", method, "--factor", 4, "-o", tmp_path / method) == 2
        error = one_error_line(capsys)
        assert said in error and "unpatch_model" not in error, error
    assert cli("patch", source, "--config", "yarn", "-o", tmp_path / "c") == 2
    assert one_error_line(capsys) == (
        "rope-extend: error: spec file 'yarn' does not exist; 'yarn' is a method, not a spec file: give it with its "
        "factor (patch: --method yarn --factor 2; eval: --spec method=yarn,factor=2)")
    with pytest.raises(SpecError) as info:
        parse_inline_spec("YaRN")
    assert str(info.value) == ("--spec 'YaRN' names a method but no spec: write it inline with its factor, e.g. "
                               "--spec method=yarn,factor=2, or give a spec YAML file")
    assert parse_inline_spec("method=yarn,factor=2") == {"method": "yarn", "factor": 2}


def test_a_read_only_filesystem_is_named_as_such(source, tmp_path):
    """Issue 66 item 7: OUT on a read-only filesystem was refused as "permission denied". A tmpfs mounted
    read-only in a private mount namespace (`unshare`, as root or through a user namespace)."""
    import shutil

    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "-Urm", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs unshare with user and mount namespaces to mount a read-only filesystem")
    mount = tmp_path / "ro"
    mount.mkdir()
    script = (f"mount -t tmpfs -o ro tmpfs {mount} && exec {sys.executable} -m rope_extend patch {source} "
              f"--method yarn --factor 2 -o {mount}/out")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([unshare, "-Urm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("rope-extend: error:")]
    assert error == [f"rope-extend: error: cannot write to {str(mount)!r}: it is on a read-only filesystem; choose "
                     "an -o on a writable one"]


def one_error_line(capsys) -> str:
    """The one error line on stderr (progress lines of work that had started, `rope-extend: [i/n] ...`, aside)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("rope-extend: [")]
    assert len(err) == 1, err
    assert "Traceback" not in err[0] and err[0].startswith("rope-extend: error:")
    return err[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--method", "yarn", "--factor", "0.5"], ["factor", ">= 1"]),
        (["--method", "yarnn", "--factor", "2"], ["did you mean 'yarn'"]),
        (["--method", "yarn", "--target-length", "8"], ["shorter than the original length"]),
        (["--factor", "2"], ["--method"]),
        (["--method", "yarn", "--factor", "2", "--set", "nope=1"], ["unknown spec key 'nope'"]),
        (["--method", "yarn", "--factor", "2", "--mode", "fast"], ["--mode 'fast'"]),
    ],
)
def test_bad_specs_exit_2_and_leave_nothing(source, tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert cli("patch", source, *args, "-o", out) == 2
    line = one_error_line(capsys)
    for word in words:
        assert word in line
    assert not out.exists()
    assert not list(tmp_path.glob(".out.rope-extend-tmp-*"))


def test_output_location_errors(source, tmp_path, capsys):
    before = checksums(source)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", source) == 2
    assert "is SOURCE itself" in one_error_line(capsys)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", source / "sub") == 2
    assert "inside SOURCE" in one_error_line(capsys)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    for overwrite in ([], ["--overwrite"]):  # a folder of the user's files is never replaced (tests/test_outputs.py)
        assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", busy, *overwrite) == 2
        assert "keep.txt" in one_error_line(capsys)
        assert (busy / "keep.txt").read_text() == "mine" and not (busy / "config.json").exists()
    assert cli("patch", tmp_path / "missing", "--method", "yarn", "--factor", 2, "-o", tmp_path / "o") == 2
    assert "neither an existing folder, a Hub repo id" in one_error_line(capsys)
    assert checksums(source) == before


def test_verification_mismatch_is_an_error_and_leaves_nothing(source, tmp_path, capsys, monkeypatch):
    from rope_extend import verify
    from rope_extend.errors import VerificationError

    def mismatch(config, plan, rtol=1e-6):
        raise VerificationError("stock transformers builds attention factor 1.0, rope-extend computed 1.1386")

    monkeypatch.setattr(verify, "verify_stock_config", mismatch)
    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out) == 2
    assert "attention factor" in one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".out.rope-extend-tmp-*"))
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out, "--no-verify") == 0


def test_truncated_and_missing_weights_are_refused(source, tmp_path, capsys):
    data = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        check_safetensors(source / "model.safetensors")
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "truncated" in one_error_line(capsys)
    (source / "model.safetensors").unlink()
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "no weights" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_pickle_weights_need_allow_pickle(source, tmp_path, capsys):
    state = AutoModelForCausalLM.from_pretrained(source).state_dict()
    (source / "model.safetensors").unlink()
    torch.save(state, source / "pytorch_model.bin")
    capsys.readouterr()
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "--allow-pickle" in one_error_line(capsys)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out", "--allow-pickle") == 0
    assert (tmp_path / "out" / "pytorch_model.bin").exists()


def test_corrupt_config_is_one_line(source, tmp_path, capsys):
    (source / "config.json").write_text("{not json")
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "not valid JSON" in one_error_line(capsys)


def test_model_card_contents(source, tmp_path):
    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out) == 0
    card = (out / "README.md").read_text()
    for text in ("rope-extend", "yarn", "arxiv.org/abs/2309.00071", "| `max_position_embeddings` | `32` | `128` |",
                 "beta_fast", "vllm serve", "transformers", "factor: 4.0"):
        assert text in card, text


def make_hub_cache(cache: Path, repo: str, folder: Path, revision: str = "a" * 40) -> None:
    """The layout huggingface_hub writes: blobs/, snapshots/<commit>/ with links into blobs, refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        blob.write_bytes(file.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)


def run_cli_process(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "rope_extend", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_hub_id_resolves_from_local_cache_offline(source, tmp_path):
    cache = tmp_path / "hub"
    make_hub_cache(cache, "acme/tiny-llama", source)
    blobs = checksums(cache)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf")}
    done = run_cli_process(["patch", "acme/tiny-llama", "--method", "yarn", "--factor", 2, "-o", tmp_path / "out"],
                           env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_scaling"]["rope_type"] == "yarn"
    assert checksums(cache) == blobs  # the cache's blobs were linked, never written
    shown = run_cli_process(["show", "acme/tiny-llama"], env, tmp_path)
    assert shown.returncode == 0 and "existing scheme: none" in shown.stdout
    missing = run_cli_process(["patch", "acme/not-cached", "--method", "yarn", "--factor", 2, "-o", tmp_path / "o2"],
                              env, tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "not in the local Hub cache" in missing.stderr
    assert not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_real_smollm2_fast_and_full_paths_agree(smollm2_path, tmp_path):
    """SmolLM2-135M: both paths give configs that load to the same logits; SOURCE untouched; links used."""
    before = checksums(smollm2_path)
    ids = torch.randint(100, 40000, (1, 96), generator=torch.Generator().manual_seed(0))
    assert cli("patch", smollm2_path, "--method", "yarn", "--factor", 2, "-o", tmp_path / "fast") == 0
    assert cli("patch", smollm2_path, "--method", "yarn", "--factor", 2, "-o", tmp_path / "full", "--mode", "full") == 0
    torch.testing.assert_close(stock_logits(tmp_path / "fast", ids), stock_logits(tmp_path / "full", ids),
                               atol=1e-4, rtol=0)
    assert os.path.samefile(smollm2_path / "model.safetensors", tmp_path / "fast" / "model.safetensors")
    assert checksums(smollm2_path) == before


# --- no write to OUT reaches SOURCE (rope_extend.sharing) ---------------------------------------------------------
SMALL_FILES = {  # what users edit before publishing, as SOURCE ships them (none rewritten by the patch)
    "chat_template.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "special_tokens_map.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>"}),
    "tokenizer_config.json": json.dumps({"model_max_length": 10**30, "chat_template": "x"}),  # never raised
    "generation_config.json": json.dumps({"temperature": 0.6, "bos_token_id": 1}),  # no max_length: not rewritten
}


def with_small_files(folder: Path) -> Path:
    for name, text in SMALL_FILES.items():
        (folder / name).write_text(text)
    return folder


def edit_in_place(folder: Path, skip=()) -> list[str]:
    """Overwrite the first bytes of every file under `folder` through its own name, in place (`r+b`: the inode kept,
    as vim's backupcopy=yes and many editors save); returns the names edited."""
    edited = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name in skip:
            continue
        with open(path, "r+b") as handle:
            head = handle.read(8)
            handle.seek(0)
            handle.write(bytes(255 - b for b in head) or b"x")
        edited.append(name)
    return edited


@pytest.mark.parametrize("layout", ["folder", "hub-cache"])
def test_in_place_edits_of_every_small_file_in_out_leave_source_and_the_hub_cache_as_they_were(
        source, tmp_path, monkeypatch, layout):
    """After a config-only patch (from a folder, and from a Hub cache whose snapshot links to blobs), every file in
    OUT but the hard-linked weights is its own copy: overwriting each in place leaves SOURCE (the cache's blobs)
    byte for byte. The weights are hard links here (this filesystem has no clone, and `sharing.clone` is asked
    first: the test records the call), so editing THEM in place does edit SOURCE: the documented exception."""
    from rope_extend import sharing

    with_small_files(source)
    tried = []
    monkeypatch.setattr(sharing, "clone", lambda src, dst: tried.append(Path(dst).name) or False)
    src = source if layout == "folder" else hubcache.from_folder(tmp_path / "hub", "acme/tiny-llama", source)
    kept = tmp_path / "hub" if layout == "hub-cache" else source
    before = checksums(kept)
    out = tmp_path / "out"
    assert cli("patch", src, "--method", "yarn", "--factor", 2, "-o", out) == 0
    assert tried == ["model.safetensors"]  # only the weights are shared; the clone was tried first
    weights = out / "model.safetensors"
    assert os.stat(weights).st_ino == os.stat(os.path.realpath(src / "model.safetensors")).st_ino  # hard-linked
    assert all(os.stat(p).st_nlink == 1 for p in out.iterdir() if p != weights)
    edited = edit_in_place(out, skip={"model.safetensors"})
    assert set(edited) == {"README.md", "config.json", "rope_extend.yaml", *SMALL_FILES}
    assert checksums(kept) == before
    edit_in_place(out, skip=set(edited))  # the hard-linked weights: their other name is SOURCE's
    assert checksums(kept) != before


def test_weights_are_cloned_where_the_filesystem_can_and_then_every_edit_stays_in_out(source, tmp_path, monkeypatch):
    """Where OUT's filesystem clones (copy-on-write), the weights are a clone, not a hard link: then an in-place edit
    of EVERY file in OUT, weights included, leaves SOURCE as it was. The capability is forced here (a clone that
    copies, as a clone reads); tests/test_checkpoint.py::test_a_real_reflink runs it on a real one."""
    from rope_extend import sharing

    with_small_files(source)
    cloned = []

    def copy_on_write(src, dst):
        import shutil

        shutil.copyfile(src, dst)
        cloned.append(Path(dst).name)
        return True

    monkeypatch.setattr(sharing, "clone", copy_on_write)
    before = checksums(source)
    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", out) == 0
    assert cloned == ["model.safetensors"]
    assert all(os.stat(p).st_nlink == 1 for p in out.iterdir())
    assert "model.safetensors" in edit_in_place(out)
    assert checksums(source) == before


def test_a_real_reflink(source, tmp_path, capsys):
    """On a filesystem with copy-on-write clones (ROPE_EXTEND_REFLINK_DIR, e.g. an XFS formatted with reflink=1 or a
    btrfs, mounted; else tmp_path if it is one), a patch clones the weights for real (its own inode, the same bytes,
    no link) and an in-place edit of every file in OUT, weights included, leaves SOURCE byte for byte."""
    import shutil
    import uuid

    from rope_extend import sharing

    base = Path(os.environ.get("ROPE_EXTEND_REFLINK_DIR") or tmp_path) / f"rope-extend-test-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    try:
        probe = base / "probe"
        probe.write_bytes(b"x" * 4096)
        if not sharing.clone(probe, base / "probe-clone"):
            pytest.skip(f"{base.parent} has no copy-on-write clones (set ROPE_EXTEND_REFLINK_DIR to a folder on an XFS "
                        "with reflink=1 or a btrfs)")
        src = with_small_files(Path(shutil.copytree(source, base / "src")))
        before = checksums(src)
        out = base / "out"
        assert cli("patch", src, "--method", "yarn", "--factor", 2, "-o", out) == 0
        assert "1 reflinked" in " ".join(capsys.readouterr().out.split())
        weights = out / "model.safetensors"
        assert os.stat(weights).st_ino != os.stat(src / "model.safetensors").st_ino and os.stat(weights).st_nlink == 1
        assert weights.read_bytes() == (src / "model.safetensors").read_bytes()
        assert "model.safetensors" in edit_in_place(out)
        assert checksums(src) == before
    finally:
        shutil.rmtree(base, ignore_errors=True)
