"""Publishing to the Hub against a real HTTP server (tests/hubserver.py) that speaks the Hub API huggingface_hub's
`create_repo` and `create_commit` use: exactly the checkpoint's files arrive, byte for byte (never a user's other
files or a link's target outside OUT, refused before any request), the card's metadata as the Hub parses it,
private/public as the Hub reports it, the commit message, the token never printed, `--dry-run` listing exactly
what the push sends and leaves out, the repo id validated first, and the failures (Hub unreachable or failing, no
token) that leave OUT exactly as it was.

One test runs the CLI in a subprocess with HF_ENDPOINT pointing at the server (huggingface_hub reads it at
import); the others run in-process with `huggingface_hub.constants.ENDPOINT` set to it, which is what HF_ENDPOINT
sets (seconds instead of a Python start each).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import hubcache
import pytest
import tiny
from helpers import expected_card, reference_serving
from hubserver import HubServer

from rope_extend.cli import run
from rope_extend.record import MODEL_ID, read_record

SECRET = "hf_SECRETtoken1234567890abcdef"
YARN = ["--method", "yarn", "--factor", "2"]
CHECKPOINT = ["README.md", "config.json", "generation_config.json", "model.safetensors", "rope_extend.yaml",
              "tokenizer_config.json"]


def cli(*args) -> int:
    return run([str(a) for a in args])


@pytest.fixture(scope="module")
def source(tmp_path_factory, user_checkpoint) -> Path:
    """conftest.py's `user_checkpoint`, copied for this module: the pushes hard-link its weights (their link count
    is the module's own)."""
    return Path(shutil.copytree(user_checkpoint, tmp_path_factory.mktemp("push") / "src"))


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    """The local Hub, with huggingface_hub pointed at it, HF_TOKEN set and no stored token; rope-extend's retries
    record their waits in `hub.waits` instead of sleeping."""
    from huggingface_hub import constants

    from rope_extend.publish import upload

    with HubServer() as server:
        server.waits = []
        monkeypatch.setattr(upload, "sleep", server.waits.append)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", SECRET)
        yield server


def folder_bytes(folder: Path, names=None, repo: str | None = None, to: str | None = None) -> dict[str, bytes]:
    """What a push of OUT must deliver under each name, read independently of rope-extend's selection: OUT's bytes
    (a link's target), rope_extend.yaml without this machine's data (`expected_record`); with `repo`, the card whose
    Serving section names it (`expected_card`) and the record holding that card's sha256; `to`: the repo pushed to
    (`repo` when not given), whose name the uploaded record's serving commands carry."""
    card = expected_card(folder, repo) if repo else None
    sent = {name: Path(os.path.realpath(folder / name)).read_bytes() for name in names or CHECKPOINT}
    if "rope_extend.yaml" in sent:
        sent["rope_extend.yaml"] = expected_record(folder, to or repo, card)
    return sent | ({"README.md": card} if card else {})


def expected_record(folder: Path, repo_id: str, card: bytes | None = None) -> bytes:
    """OUT's rope_extend.yaml as a push to `repo_id` must upload it: the same text, each shared weight's line reduced
    to its size (no inode, modification time or how it was shared: this machine's, not the model's), the card's line
    the sha256 of the card sent (`card`, when the push renames its Serving section), the serving commands naming
    `repo_id` (recorded as `model_id`), and a note that speaks of what it holds (no inodes or times)."""
    shared = re.compile(r"^(    \S+: )(?:hard-linked|reflinked) size (\d+) mtime_ns \d+ inode \d+$")
    lines = []
    for line in (folder / "rope_extend.yaml").read_text().splitlines(keepends=True):
        match = shared.match(line.rstrip("\n"))
        if card is not None and line.startswith("    README.md: sha256 "):
            line = f"    README.md: sha256 {hashlib.sha256(card).hexdigest()}\n"
        if line.startswith("# output_record:"):
            line = ("# output_record: rope-extend's record of this checkpoint as it was pushed, not part of the spec: "
                    "whether it was verified, every file with the sha256 of its bytes (weights shared with the base "
                    "model by their size), the serving commands for model_id. `rope-extend push` of a download of "
                    "this repo sends these files, as recorded, and no other.\n")
        if line == "output_record:\n":
            line += f"  model_id: {repo_id}\n"
        line = line.replace(MODEL_ID, repo_id)
        lines.append(f"{match[1]}size {match[2]}\n" if match else line)
    return "".join(lines).encode()


def tree(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`: a link's target, or a file's sha256, inode and mtime (a rewrite changes it)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = os.lstat(path)
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), info.st_ino, info.st_mtime_ns)
            else:
                found[rel] = ("dir", info.st_mtime_ns)
    return found


def dry_run_lines(stdout: str, mark: str = "+") -> list[str]:
    return [line[4:].split("   (")[0] for line in stdout.splitlines() if line.startswith(f"  {mark} ")]


def one_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("rope-extend: error:")]
    assert len(lines) == 1, err
    return lines[0]


def card_data(text: str, tmp_path: Path):
    from huggingface_hub import ModelCard

    path = tmp_path / "card" / "README.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return ModelCard.load(path).data


def test_patch_push_to_hub_over_http(source, tmp_path):
    """`patch --push-to-hub --private` in a fresh process with HF_ENDPOINT set: the repo is created private and
    receives exactly OUT's files, byte for byte, in one commit whose message is the spec; the token is sent in the
    Authorization header and printed nowhere."""
    out = tmp_path / "out"
    with HubServer() as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN=SECRET, HF_HOME=str(tmp_path / "hf-home"))
        done = subprocess.run([sys.executable, "-m", "rope_extend", "patch", str(source), *YARN, "-o", str(out),
                               "--push-to-hub", "me/tiny-yarn", "--private"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    repo = hub.repos["me/tiny-yarn"]
    assert repo.private is True
    assert repo.files == folder_bytes(out, to="me/tiny-yarn")
    uploaded = repo.files["rope_extend.yaml"].decode()  # no machine-local data: no inode, time or path
    local = re.compile(r"(inode|mtime_ns) \d+|hard-linked size")
    assert not local.search(uploaded) and str(tmp_path) not in uploaded and local.search((out / "rope_extend.yaml")
                                                                                        .read_text())
    assert re.search(r"model\.safetensors: size \d+\n", uploaded)
    spec = "method: yarn factor: 2.0 target_length: 64 original_max_position_embeddings: 32"
    assert repo.commits == [f"rope-extend: {spec}"]
    writes = [r for r in hub.requests if r.method == "POST" and not r.path.startswith("/lfs/")]  # the Hub's API
    assert writes and all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in writes)
    storage = [r for r in hub.requests if r.path.startswith("/lfs/")]  # the weights, as an LFS object
    assert storage and all("authorization" not in r.headers for r in storage)
    data = card_data(repo.files["README.md"].decode(), tmp_path)
    assert data.library_name == "transformers"
    assert {"rope-scaling", "yarn", "long-context"} <= set(data.tags)
    assert "vllm serve me/tiny-yarn" in repo.files["README.md"].decode()  # the card names the path users will have
    assert f"pushed: {hub.endpoint}/me/tiny-yarn (6 files, private)" in done.stdout
    assert "serve:  vllm serve me/tiny-yarn --max-model-len 64" in done.stdout


def test_dry_run_lists_exactly_what_the_push_uploads(source, tmp_path, hub, capsys):
    out = tmp_path / "out"
    (source / ".cache").mkdir(exist_ok=True)  # hidden files are never carried or uploaded
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/a", "--dry-run") == 0
    printed = capsys.readouterr()
    listed = dry_run_lines(printed.out)
    assert hub.requests == []  # a dry run sends nothing
    assert "would push 6 files to me/a (public if created" in printed.out
    assert "  + model.safetensors   (weights rope-extend shared with SOURCE, hard-linked)" in printed.out
    assert cli("push", out, "me/a") == 0
    assert sorted(hub.repos["me/a"].files) == listed == CHECKPOINT
    assert hub.repos["me/a"].private is False
    assert SECRET not in "".join(capsys.readouterr())


def test_the_record_names_the_files_links_and_serving_of_out(source, tmp_path):
    """rope_extend.yaml records every file patch wrote with the sha256 of its bytes (its own entry: of its spec
    part), the weights it shared with SOURCE by how, size, modification time and inode (SOURCE's inode: a hard link
    here), and serving commands that render, for any repo id, what planning the patch again gives; the spec part
    still reads as a spec (`--config OUT/rope_extend.yaml`)."""
    from rope_extend.record import spec_text
    from rope_extend.spec import load_spec

    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    record = read_record(out)
    assert sorted(record.files) == CHECKPOINT and record.verified
    weights = record.entries["model.safetensors"]
    info = os.stat(source / "model.safetensors")
    assert (weights.shared, weights.inode, weights.size, weights.mtime_ns, weights.sha256) == (
        "hard-linked", info.st_ino, info.st_size, info.st_mtime_ns, None)
    assert os.stat(out / "model.safetensors").st_nlink >= 2  # SOURCE's name and OUT's (other tests link it too)
    for name in set(CHECKPOINT) - {"model.safetensors", "rope_extend.yaml"}:
        assert record.entries[name].sha256 == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    assert record.entries["rope_extend.yaml"].sha256 == hashlib.sha256(spec_text(out).encode()).hexdigest()
    for name in ("me/tiny-yarn", "org-x/Model_1.5-64k"):
        serving, serve = reference_serving(out, name)
        assert record.serving_for(name) == serving and record.serve_for(name) == serve
    assert MODEL_ID not in (out / "README.md").read_text()
    spec = load_spec(out / "rope_extend.yaml")
    assert (spec.method, spec.factor, spec.target_length) == ("yarn", 2.0, 64)


def test_a_later_push_renames_the_serving_commands_and_leaves_out_unchanged(source, tmp_path, hub, capsys):
    out = tmp_path / "smollm2-yarn2"
    assert cli("patch", source, *YARN, "-o", out) == 0
    assert "vllm serve ./smollm2-yarn2 " in (out / "README.md").read_text()  # runs from OUT's parent folder
    before = tree(out)
    capsys.readouterr()
    assert cli("push", out, "me/b", "--dry-run") == 0
    assert "README.md: sent with its Serving section naming me/b (OUT's copy is not changed)" in capsys.readouterr().out
    assert cli("push", out, "me/b") == 0
    printed = capsys.readouterr().out
    card = hub.repos["me/b"].files["README.md"].decode()
    serving, serve = reference_serving(out, "me/b")
    assert serving.strip() in card and "smollm2-yarn2 " not in card
    assert f"serve:  {serve}" in printed
    assert card.encode() == expected_card(out, "me/b")
    assert tree(out) == before  # a push writes nothing into OUT
    assert cli("push", out, "me/b") == 0  # the repo exists (409): the push adds a commit
    assert len(hub.repos["me/b"].commits) == 2


def test_push_sends_the_checkpoint_not_the_folder(source, tmp_path, hub, capsys):
    """OUT patched from a Hub cache snapshot (its weights hard-linked to the cache's blob), then filled with what a
    user's folder holds: notes, a private key in a subfolder, .env, nested folders, a link to a file outside, a link
    to a folder outside, a hard link to an outside file under a checkpoint's name. The push (and its dry run) refuses
    all of them in one line before any request; --include cannot send what resolves outside OUT; once only what the
    user names on purpose is left, exactly the checkpoint and that file arrive, byte for byte, and OUT is as it was."""
    snapshot = hub_snapshot(source, tmp_path / "hub")
    out = tmp_path / "mixed"
    assert cli("patch", snapshot, *YARN, "-o", out) == 0
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    assert os.stat(out / "model.safetensors").st_ino == blob.stat().st_ino  # hard-linked from the Hub cache
    outside = tmp_path / "outside"
    (outside / "ssh").mkdir(parents=True)
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (outside / "ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (out / "notes.txt").write_text("my notes")
    (out / "private").mkdir()
    (out / "private" / "id_rsa").write_text("-----BEGIN RSA PRIVATE KEY-----\n")
    (out / ".env").write_text("OPENAI_API_KEY=sk-123\n")
    (out / "runs" / "a").mkdir(parents=True)
    (out / "runs" / "a" / "log.txt").write_text("step 1")
    (out / "passwd.txt").symlink_to(outside / "passwd")
    (out / "keys").symlink_to(outside / "ssh", target_is_directory=True)
    os.link(outside / "ssh" / "id_ed25519", out / "LICENSE")  # a checkpoint's name, an outside file's inode
    before = tree(out)
    capsys.readouterr()

    for dry in ([], ["--dry-run"]):
        assert cli("push", out, "me/mixed", *dry) == 2
        printed = capsys.readouterr()
        error = one_error(printed.err)
        assert "holds 7 files a push may not send as the checkpoint's, so nothing was sent" in error
        for named in (".env (not a file of a checkpoint)", "notes.txt (not a file of a checkpoint)",
                      "private/id_rsa (in a subfolder", "runs/a/log.txt (in a subfolder",
                      f"passwd.txt (a symbolic link to {str(outside / 'passwd')!r}, outside OUT)",
                      f"keys (a symbolic link to the folder {str(outside / 'ssh')!r}, outside OUT",
                      "LICENSE (a hard link (2 names) and rope-extend did not make it"):
            assert named in error
        assert "--include NAME" in error and "uploading" not in printed.err
    assert dry_run_lines(printed.out) == CHECKPOINT
    assert sorted(dry_run_lines(printed.out, "x")) == sorted([".env", "LICENSE", "keys", "notes.txt", "passwd.txt",
                                                              "private/id_rsa", "runs/a/log.txt"])
    assert hub.requests == []
    for bad in (["--include", "passwd.txt"], ["--include", "keys/id_ed25519"], ["--include", "../outside/passwd"],
                ["--include", str(outside / "passwd")]):
        assert cli("push", out, "me/mixed", *bad) == 2
        assert "outside OUT" in one_error(capsys.readouterr().err)
    assert hub.requests == [] and tree(out) == before
    # a hard link to an outside file, named on purpose: nothing of it is sent
    for name in ("passwd.txt", "keys", ".env"):
        os.unlink(out / name)
    shutil_rmtree(out / "private")
    shutil_rmtree(out / "runs")
    os.unlink(out / "notes.txt")
    assert cli("push", out, "me/mixed", "--include", "LICENSE") == 2
    error = one_error(capsys.readouterr().err)
    assert "holds 1 file a push may not send" in error and "LICENSE (a hard link (2 names)" in error
    assert "never sent, even when named; copy it into OUT (cp, not ln) to send it" in error
    assert hub.requests == []
    (out / "notes.txt").write_text("my notes")
    (out / "runs" / "a").mkdir(parents=True)
    (out / "runs" / "a" / "log.txt").write_text("step 1")

    os.unlink(out / "LICENSE")
    assert cli("push", out, "me/mixed", "--include", "notes.txt", "--include", "runs") == 0
    sent = ["notes.txt", *CHECKPOINT, "runs/a/log.txt"]
    assert hub.repos["me/mixed"].files == folder_bytes(out, sent, "me/mixed")
    assert hub.repos["me/mixed"].files["model.safetensors"] == blob.read_bytes()


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def hub_snapshot(source: Path, cache: Path, repo_id: str = "acme/tiny-llama") -> Path:
    """SOURCE's files in a Hub cache laid out as huggingface_hub's (tests/hubcache.py): snapshot links to blobs."""
    import shutil

    plain = cache.parent / "plain"
    plain.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            shutil.copy(path, plain / path.name)
    return hubcache.from_folder(cache, repo_id, plain)


def test_a_hub_cache_snapshot_is_pushed_through_its_blob_links(source, tmp_path, hub, capsys):
    """A clean checkpoint in the Hub cache: its files are links to the blobs of the same repo, which are sent; a link
    into another repo's blobs is refused."""
    snapshot = hub_snapshot(source, tmp_path / "hub")
    names = sorted(p.name for p in source.iterdir() if p.is_file())
    assert cli("push", snapshot, "me/copy") == 2  # not written or verified by rope-extend: only on purpose
    assert "--unverified" in one_error(capsys.readouterr().err) and "me/copy" not in hub.repos
    assert cli("push", snapshot, "me/copy", "--unverified") == 0
    files = hub.repos["me/copy"].files
    assert files.pop("README.md").startswith(f"# {snapshot.name}\n\n> **Not verified by rope-extend.**".encode())
    assert files == {name: (source / name).read_bytes() for name in names}
    other = hubcache.from_folder(tmp_path / "hub", "evil/other", tmp_path / "hub" / "models--acme--tiny-llama" / "blobs")
    blob = next(p for p in other.iterdir())
    (snapshot / "tokenizer.json").symlink_to(os.path.relpath(os.path.realpath(blob), snapshot))
    assert cli("push", snapshot, "me/copy2", "--unverified") == 2
    assert "tokenizer.json (a symbolic link to" in one_error(capsys.readouterr().err)
    assert "me/copy2" not in hub.repos


def test_what_rope_extend_carried_from_source_is_left_out_and_an_unrecorded_out_needs_include(source, tmp_path, hub,
                                                                                           capsys):
    """Files SOURCE carried into OUT that are not a checkpoint's (Llama 3.1's original/, a Mistral params.json)
    are rope-extend's, not the user's: left out, said why, --include sends them. An OUT without rope-extend's
    record (written before it kept one) has hard links nobody recorded: refused until named on purpose; its card
    goes up as it is. A damaged record sends nothing."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(source, src, ignore=shutil.ignore_patterns(".*"))
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text('{"dim": 64}')
    (src / "params.json").write_text('{"dim": 64}')
    out = tmp_path / "out"
    assert cli("patch", src, *YARN, "-o", out) == 0
    capsys.readouterr()
    assert cli("push", out, "me/g", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert dry_run_lines(printed) == CHECKPOINT and max(map(len, printed.splitlines())) <= 80
    words = " ".join(printed.split())  # wrapped at 80 columns, a reason continuing under its name
    assert ("- original/params.json (left out: in a subfolder; a checkpoint's files are at its top level; "
            "rope-extend carried it from SOURCE (--include original/params.json sends it))") in words
    assert "- params.json (left out: not a file of a checkpoint; rope-extend carried it" in words
    assert cli("push", out, "me/g", "--include", "original") == 0
    assert sorted(hub.repos["me/g"].files) == sorted([*CHECKPOINT, "original/params.json"])
    assert f"left out: params.json (`rope-extend push {out} me/g --include original --dry-run` says why)" in (
        capsys.readouterr().out)
    assert cli("patch", src, *YARN, "-o", tmp_path / "out2", "--push-to-hub", "me/g2", "--dry-run") == 0
    assert (f"(`rope-extend push {tmp_path / 'out2'} me/g2 --include original/params.json` sends it)"
            in " ".join(capsys.readouterr().out.split()))  # patch has no --include: the command that has one

    text = (out / "rope_extend.yaml").read_text()
    spec = text.split("# output_record")[0]
    (out / "rope_extend.yaml").write_text(spec)  # as rope-extend wrote it before it recorded its outputs
    for stray in ("LICENSE.secret", "tokenization_private.py", "model-00001-of-00002.safetensors"):
        (out / stray).write_text("not the checkpoint's")  # names a push would send from a plain checkpoint
    requests = len(hub.requests)
    for args in ([], ["--include", "model.safetensors"], ["--dry-run"]):
        assert cli("push", out, "me/h", *args) == 2
        error = one_error(capsys.readouterr().err)
        assert "was written by rope-extend before it recorded the files it vouches for" in error
        assert (f"writing the checkpoint again into a new folder, `rope-extend patch SOURCE --config "
                f"{out / 'rope_extend.yaml'} -o NEW`") in error and "move" not in error
    assert "me/h" not in hub.repos and len(hub.requests) == requests  # refused before any request
    (out / "rope_extend.yaml").write_text(spec + "output_record:\n  files: [../../etc/passwd]\n  hard_links: {}\n")
    assert cli("push", out, "me/i", "--include", "model.safetensors") == 2
    assert "output_record is damaged" in one_error(capsys.readouterr().err) and "me/i" not in hub.repos
    # a record from before contents were recorded (names and inodes): `rope-extend verify` records them
    inode = os.stat(out / "model.safetensors").st_ino
    legacy = (text.split("# output_record")[0] + "output_record:\n  files: [" + ", ".join(
        sorted(read_record_names(text))) + f"]\n  hard_links: {{model.safetensors: {inode}}}\n")
    (out / "rope_extend.yaml").write_text(legacy)
    for stray in ("LICENSE.secret", "tokenization_private.py", "model-00001-of-00002.safetensors"):
        (out / stray).unlink()
    assert cli("push", out, "me/j") == 2
    assert f"`rope-extend verify {out}` re-verifies OUT as it is now" in one_error(capsys.readouterr().err)
    assert cli("verify", out) == 0
    assert "on the real weights" in " ".join(capsys.readouterr().out.split())  # nothing vouched for their bytes
    assert cli("push", out, "me/j") == 0 and hub.repos["me/j"].files["config.json"] == (out / "config.json").read_bytes()


def read_record_names(text: str) -> list[str]:
    """The file names under output_record.files of a rope_extend.yaml's text."""
    import yaml

    return list(yaml.safe_load(text)["output_record"]["files"])


@pytest.mark.parametrize("repo_id, reason", [("me/some..repo", "Cannot have -- or .. in repo_id"),
                                             ("me/" + "a" * 120, "the maximum length is 96"),
                                             ("me/repo.git", "cannot end by '.git'"),
                                             ("not a repo", "expects a Hub repo id like 'user/model-name'")])
def test_repo_ids_are_validated_first(source, tmp_path, hub, capsys, repo_id, reason):
    """huggingface_hub's validate_repo_id decides, before anything else (the dry run too, patch before writing OUT);
    the error says the library's reason, names the command's own argument and offers no retry."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", repo_id, "--dry-run") == 2
    error = one_error(capsys.readouterr().err)
    assert reason in error and error.startswith("rope-extend: error: --push-to-hub ") and not out.exists()
    assert cli("patch", source, *YARN, "-o", out) == 0
    before = tree(out)
    for dry in (["--dry-run"], []):
        assert cli("push", out, repo_id, *dry) == 2
        error = one_error(capsys.readouterr().err)
        assert reason in error and "--push-to-hub" not in error and "push it later" not in error
        assert error.startswith("rope-extend: error: REPO ")
    assert hub.requests == [] and tree(out) == before
    text = tmp_path / "plays.txt"
    text.write_text("To be, or not to be, that is the question. " * 20)
    assert cli("train", source, *YARN, "--text", text, "-o", tmp_path / "trained", "--push-to-hub", repo_id) == 2
    error = one_error(capsys.readouterr().err)  # before training starts
    assert reason in error and error.startswith("rope-extend: error: --push-to-hub ")
    assert not (tmp_path / "trained").exists() and not (tmp_path / "trained.train-state").exists()


def test_a_failed_push_leaves_out_as_it_was_and_offers_a_retry_only_when_one_can_help(source, tmp_path, hub, capsys):
    """A 5xx on the commit: OUT untouched (its card still names the folder), the retry command printed, and it
    works once the Hub is back; a 403: why, no retry offered (push) and OUT untouched."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    before = tree(out)
    capsys.readouterr()
    (out / "NOTES.md").write_text("how it was made")  # sent on purpose: the retry command keeps --include
    before = tree(out)
    hub.fail_commit = 503
    assert cli("push", out, "me/f", "--include", "NOTES.md") == 2
    error = one_error(capsys.readouterr().err)
    assert "HTTP 503" in error
    later = re.search(r"push it later with `([^`]+)`", error)[1]
    assert later == f"rope-extend push {out} me/f --include NOTES.md"
    assert tree(out) == before and hub.repos["me/f"].files == {}
    hub.fail_commit = 403
    assert cli("push", out, "me/f", "--include", "NOTES.md") == 2
    error = one_error(capsys.readouterr().err)
    assert "HTTP 403" in error and "write access" in error and "push it" not in error and "is kept as it is" in error
    assert tree(out) == before
    hub.fail_commit = None
    assert run(shlex.split(later)[1:]) == 0
    assert hub.repos["me/f"].files == folder_bytes(out, [*CHECKPOINT, "NOTES.md"], "me/f")


def test_the_visibility_printed_is_the_hubs(source, tmp_path, hub, capsys):
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    capsys.readouterr()
    assert cli("push", out, "me/p", "--private") == 0
    assert "(6 files, private)" in capsys.readouterr().out
    assert cli("push", out, "me/p") == 0  # an existing repo keeps its visibility, and the report says so
    assert "(6 files, private)" in capsys.readouterr().out and hub.repos["me/p"].private is True
    assert cli("push", out, "me/q") == 0 and cli("push", out, "me/q", "--private") == 0
    assert capsys.readouterr().out.count("(6 files, public)") == 2


def test_a_repo_id_with_a_leading_dash_is_explained(source, tmp_path, hub, capsys):
    """Issue 66 item 7: `push OUT -me/x` said only "No such option: -m" (click reads the id as options), and
    `--push-to-hub -me/x` did not say what was wrong with it: both say the id starts with '-' and the id meant."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    capsys.readouterr()
    assert cli("push", out, "-me/x") == 2
    assert one_error(capsys.readouterr().err) == (
        "rope-extend: error: No such option: -m; '-me/x' starts with '-', so it was read as options: a Hub repo id "
        "starts with a letter or a digit (user/name), e.g. 'me/x'")
    assert cli("patch", source, *YARN, "-o", tmp_path / "o2", "--push-to-hub", "-me/x") == 2
    assert one_error(capsys.readouterr().err) == (
        "rope-extend: error: --push-to-hub expects a Hub repo id like 'user/model-name', got '-me/x'; it starts "
        "with '-': a repo id starts with a letter or a digit, e.g. 'me/x'")
    assert hub.requests == [] and not (tmp_path / "o2").exists()


def test_push_with_the_hub_down_keeps_out_and_prints_the_push_later_command(source, tmp_path, hub, monkeypatch,
                                                                            capsys):
    from huggingface_hub import constants

    with HubServer() as down:
        pass  # started and stopped: its port refuses connections
    monkeypatch.setattr(constants, "ENDPOINT", down.endpoint)
    out = tmp_path / "my model"  # a path that needs quoting in the printed command
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/c", "--private") == 2
    error = one_error(capsys.readouterr().err)
    assert "unreachable" in error and "is kept as it is" in error
    later = re.search(r"push it later with `([^`]+)`", error)[1]
    assert later == f"rope-extend push '{out.resolve()}' me/c --private"
    before = tree(out)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # the Hub is back: the printed command pushes OUT
    assert run(shlex.split(later)[1:]) == 0
    assert hub.repos["me/c"].private is True and hub.repos["me/c"].files == folder_bytes(out, to="me/c")
    assert tree(out) == before


def test_a_missing_token_is_reported_before_any_network_call(source, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/d") == 2
    printed = capsys.readouterr()
    error = one_error(printed.err)
    assert "no Hugging Face token" in error and "hf auth login" in error
    assert f"once that is fixed, push it with `rope-extend push {out.resolve()} me/d`" in error
    assert "uploading" not in printed.err
    assert (out / "config.json").is_file()
    assert cli("push", out, "me/d") == 2
    printed = capsys.readouterr()
    error = one_error(printed.err)
    assert "no Hugging Face token" in error and "push it" not in error and "uploading" not in printed.err
    assert hub.requests == []


def test_push_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, hub, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.md").write_text("mine")
    assert cli("push", tmp_path / "notes", "me/e") == 2
    assert "not a checkpoint folder (no config.json)" in one_error(capsys.readouterr().err)
    assert cli("push", tmp_path / "gone", "me/e") == 2
    assert f"OUT {str(tmp_path / 'gone')!r} does not exist" in one_error(capsys.readouterr().err)
    assert hub.requests == []


# --- the model card's metadata, as the Hub parses it ------------------------------------------------------------------
PAPER = Path(__file__).resolve().parents[1] / "eval" / "reports" / "smollm2-paper" / "results.jsonl"


def test_base_model_is_named_whenever_the_source_is_known(tmp_path):
    from rope_extend.hub import base_model_id

    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    plain = tmp_path / "my-model"
    plain.mkdir()
    assert base_model_id("smollm2", plain) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("meta-llama/Llama-3.1-8B", snapshot) == "meta-llama/Llama-3.1-8B"
    assert base_model_id(str(snapshot), snapshot) == "acme/tiny-llama"  # a path inside a Hub cache
    assert base_model_id(str(plain), plain) is None


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval, from its closed form (the reference for the card's accuracy intervals)."""
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return centre - half, centre + half


def test_card_metadata_license_eval_results_and_banner(tmp_path):
    """A fine-tuned x8 card from a source whose card says its license, with the real records of the paper suite
    (YaRN x2's, up to 16k tokens) as its evaluation marked smoke: the Hub's metadata and the body."""
    from huggingface_hub import ModelCard

    from rope_extend.card import build_model_card
    from rope_extend.eval.card_section import CardEval

    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# A model\n")
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    records = [json.loads(line) for line in PAPER.read_text().splitlines() if line.strip()]
    evaluation = CardEval(records, suite="paper", smoke=True, variant="yarn-x2")
    spec = "method: yarn\nfactor: 8.0\ntarget_length: 65536\noriginal_max_position_embeddings: 8192\n"
    text = build_model_card("HuggingFaceTB/SmolLM2-135M-Instruct", spec, "yarn", [], "- vLLM: `vllm serve me/x`",
                            eval_summary=evaluation, training="400 steps.", source_dir=source)
    path = tmp_path / "README.md"
    path.write_text(text)
    card = ModelCard.load(path)
    data = card.data
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data.base_model_relation == "finetune"
    assert data.license == "apache-2.0" and data.library_name == "transformers"
    assert data.tags == ["rope-extend", "rope-scaling", "yarn", "long-context"]
    mine = [r for r in records if r["variant"] == "yarn-x2"]
    ppl = {(r["metrics"]["text"], r["length"]): r["metrics"] for r in mine if r["kind"] == "perplexity"}
    passkey: dict[int, list[float]] = {}
    for r in mine:
        if r["kind"] == "passkey":
            passkey.setdefault(r["length"], []).append(r["metrics"]["score"])
    results = data.eval_results
    assert len(results) == len(ppl) + len(passkey)
    for result in results:
        length = result.metric_args["context_length"]
        if result.metric_type == "perplexity":
            m = ppl[(result.dataset_name, length)]
            assert result.metric_value == pytest.approx(m["ppl"], abs=1e-4)
            assert result.metric_args["interval_95"] == pytest.approx(m["ppl_ci"], abs=1e-4)
            assert result.metric_args["n"] == len(m["block_losses"])
        else:
            scores = passkey[length]
            k, n = int(sum(scores)), len(scores)
            assert result.metric_type == "accuracy" and result.metric_args["n"] == n
            assert result.metric_value == pytest.approx(k / n, abs=1e-4)
            assert result.metric_args["interval_95"] == pytest.approx(wilson(k, n), abs=1e-4)
        assert "smoke test" in result.metric_config and result.source_url is None  # no unchecked address
    assert card.text.count("> **Smoke test.** The `paper` suite") == 1
    assert "Nothing was measured at the target length (65536 tokens): the longest context evaluated is 16384" in text
    assert "pypi.org" not in text and "github.com" not in text
    assert "License: `apache-2.0`, read from the metadata of the base model's card (its README.md)." in text


def test_config_only_card_without_a_known_source(tmp_path):
    from huggingface_hub import ModelCard

    from rope_extend.card import build_model_card

    spec = "method: ntk\nfactor: 2.0\ntarget_length: 64\noriginal_max_position_embeddings: 32\n"
    text = build_model_card("my-model", spec, "ntk", [], "- vLLM: `vllm serve x`", source_dir=tmp_path)
    (tmp_path / "README.md").write_text(text)
    data = ModelCard.load(tmp_path / "README.md").data.to_dict()
    assert "base_model" not in data and "base_model_relation" not in data and "license" not in data
    assert "No license is given: neither the base model's card nor its config.json says one" in text
    assert "model-index" not in data and "eval_results" not in data
    assert "the local checkpoint `my-model`" in text
    assert "No evaluation was run" in text and "Nothing was measured at the target length (64 tokens)" in text


# --- a push sends only what was verified (issue 47) ----------------------------------------------------------------------
def test_a_changed_output_is_refused_naming_each_file_until_verify_reverifies_it(source, tmp_path, hub, monkeypatch,
                                                                                 capsys):
    """OUT patched from a Hub cache (weights hard-linked to the blob). A config.json edited back to the original
    window and RoPE (issue 47's case) is refused by push, naming it, with the command that re-verifies OUT; that
    command refuses too (it does not verify) and writes nothing. Weights replaced by other bytes under the same name:
    refused, naming them; `verify` then runs on the real weights (the path is recorded), refreshes the record and
    the card, and the push delivers the new bytes while the cache's blob stays as it was. A chat template edited in
    place: refused, re-verified on a small model, sent as edited. A card edited by hand: sent as written."""
    import shutil

    from safetensors.torch import save_file

    from rope_extend import reverify

    snapshot = hub_snapshot(source, tmp_path / "hub")
    out = tmp_path / "out"
    assert cli("patch", snapshot, *YARN, "-o", out) == 0
    blobs = tiny.checksums(tmp_path / "hub")
    shipped = (out / "config.json").read_bytes()
    edited = json.loads(shipped)
    edited["max_position_embeddings"] = tiny.ORIGINAL
    for key in ("rope_scaling", "rope_parameters"):
        edited[key] = {"rope_type": "default", "rope_theta": 10000.0}
    (out / "config.json").write_text(json.dumps(edited))
    capsys.readouterr()
    for dry in ([], ["--dry-run"]):
        assert cli("push", out, "me/v", *dry) == 2
        error = one_error(capsys.readouterr().err)
        assert error.startswith(f"rope-extend: error: OUT {str(out)!r} changed since rope-extend verified it, so "
                                "nothing was sent: config.json (edited)")
        assert f"`rope-extend verify {out}` re-verifies OUT as it is now" in error
    assert hub.requests == []
    before = tree(out)
    assert cli("verify", out) == 2
    error = one_error(capsys.readouterr().err)
    assert "does not verify as it is now" in error and "nothing was written" in error and tree(out) == before
    (out / "config.json").write_bytes(shipped)  # back as verified: sendable again

    replaced = tmp_path / "other.safetensors"  # same name, other bytes (a new file renamed over OUT's)
    state = {k: v + 1 for k, v in tiny.make_model("llama").state_dict().items()}
    save_file(state, replaced, metadata={"format": "pt"})
    os.replace(replaced, out / "model.safetensors")
    assert cli("push", out, "me/v") == 2
    error = one_error(capsys.readouterr().err)
    assert "model.safetensors (another file than the one verified (its size, time or inode changed))" in error
    assert "config.json" not in error.split("so nothing was sent:")[1].split(";")[0]
    ran = []
    original = reverify.patched_outputs_of
    monkeypatch.setattr(reverify, "patched_outputs_of", lambda *a: ran.append(a) or original(*a))
    assert cli("verify", out) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert ran and "on the real weights" in printed and "model.safetensors (another file than the one verified" in printed
    assert "Re-verified by rope-extend" in (out / "README.md").read_text()
    assert read_record(out).entries["model.safetensors"].sha256 == hashlib.sha256(
        (out / "model.safetensors").read_bytes()).hexdigest()  # OUT's own bytes now: recorded by content
    assert cli("push", out, "me/v") == 0
    assert hub.repos["me/v"].files == folder_bytes(out, repo="me/v")
    assert tiny.checksums(tmp_path / "hub") == blobs

    (out / "chat_template.jinja").write_text("{{ messages }}")  # a file added to OUT (SOURCE has none)
    assert cli("push", out, "me/v") == 2
    assert "chat_template.jinja (not among the files rope-extend recorded" in one_error(capsys.readouterr().err)
    os.unlink(out / "chat_template.jinja")
    with open(out / "tokenizer_config.json", "r+") as handle:  # an in-place edit of a recorded file
        handle.write('{"model_max_length": 64, "padding_side": "left"}')
    assert cli("push", out, "me/v") == 2
    assert "tokenizer_config.json (edited)" in one_error(capsys.readouterr().err)
    ran.clear()
    assert cli("verify", out) == 0
    assert not ran and "a small model of the config" in " ".join(capsys.readouterr().out.split())
    card = (out / "README.md").read_text() + "\nMy own notes on this model.\n"
    (out / "README.md").write_text(card)  # the user's card now: sent as written
    assert cli("push", out, "me/w", "--dry-run") == 0
    assert "README.md: edited since rope-extend wrote it: yours, sent as written" in capsys.readouterr().out
    assert cli("push", out, "me/w") == 0
    assert hub.repos["me/w"].files == folder_bytes(out, to="me/w")
    assert hub.repos["me/w"].files["README.md"] == card.encode()
    shutil.rmtree(out)


def test_a_hub_cache_blob_is_sent_only_when_its_bytes_are_the_repos(source, tmp_path, hub, capsys):
    """A snapshot patched from three times (rope-extend's hard links: its weights' blob has 4 names) pushes, sending
    the blob's bytes (they hash to its name, as huggingface_hub names blobs); a blob replaced by a hard link to a
    private file (its bytes no longer hash to its name) sends nothing of it, even named, and the advice is one that
    can work for a blob (copy the snapshot), not "move it out"."""
    snapshot = hub_snapshot(source, tmp_path / "hub")
    for factor in (2, 3, 4):
        assert cli("patch", snapshot, "--method", "yarn", "--factor", factor, "-o", tmp_path / f"out{factor}") == 0
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    assert blob.stat().st_nlink == 4
    capsys.readouterr()
    assert cli("push", snapshot, "me/snap", "--unverified") == 0
    assert hub.repos["me/snap"].files["model.safetensors"] == (source / "model.safetensors").read_bytes()

    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    small = Path(os.path.realpath(snapshot / "generation_config.json"))
    os.unlink(small)
    os.link(secret, small)
    received = len(hub.requests)
    for named in ([], ["--include", "generation_config.json"]):
        assert cli("push", snapshot, "me/blob", "--unverified", *named) == 2
        error = one_error(capsys.readouterr().err)
        assert ("generation_config.json (a Hub cache blob with 2 names whose bytes do not hash to its name: they are "
                "another file's (a hard link), so it is never sent, even when named)") in error
        assert f"copy the snapshot's files into a new folder (cp -rL {snapshot} NEW) and push NEW" in error
        assert "move it out of OUT" not in error
    assert len(hub.requests) == received and "me/blob" not in hub.repos


def test_include_names_that_would_send_nothing_are_refused_and_counts_read_as_english(source, tmp_path, hub, capsys):
    """`--include .` / `''` name OUT itself / nothing; `.git` is metadata; a link to a folder (or a path through
    one) would be skipped by the walk: each is one line saying so, instead of 'outside OUT' or doing nothing. A
    push of one file says '1 file'; the dry run fits 80 columns."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    (out / ".git").mkdir()
    (out / "runs" / "a").mkdir(parents=True)
    (out / "runs" / "a" / "log.txt").write_text("step 1")
    (out / "latest").symlink_to(out / "runs" / "a", target_is_directory=True)
    capsys.readouterr()
    for item, said in ((".", "names OUT itself: a push already sends the checkpoint's files"),
                       (str(out), "names OUT itself"), ("", "names nothing"),
                       (".git", "is git metadata, which a push never uploads"),
                       ("latest", "goes through 'latest', a symbolic link to a folder; a push does not follow "
                                  "folders through links: name it by its own path, --include runs/a"),
                       ("latest/log.txt", "name it by its own path, --include runs/a/log.txt")):
        assert cli("push", out, "me/inc", "--include", item) == 2
        error = one_error(capsys.readouterr().err)
        assert f"--include {item!r} {said}" in error or said in error, error
        assert "outside OUT" not in error
    assert hub.requests == []
    one = tmp_path / "one"
    one.mkdir()
    (one / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (one / "README.md").write_text("# one\n\nmy model\n")
    assert cli("push", one, "me/one", "--unverified", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert "would push 2 files to me/one" in printed and max(map(len, printed.splitlines())) <= 80
    (one / "README.md").unlink()
    assert cli("push", one, "me/one", "--unverified") == 0
    assert "(2 files, public)" in capsys.readouterr().out  # config.json and the card saying it was not verified
    from rope_extend.publish.plan import files_count

    assert files_count(1) == "1 file"


def test_push_publishes_only_what_rope_extend_wrote_and_verified(source, tmp_path, hub, capsys, monkeypatch):
    """Issue 66 item 1: a folder holding only a config.json was pushed (`pushed: ... (1 file, public)`, exit 0).
    A push refuses, in one line before any request, a folder rope-extend did not write (saying `patch` makes one), an
    OUT written with --no-verify and one whose record lists no weight file (saying `verify` verifies it); each goes
    with --unverified, the card sent then saying so under its title (OUT's card unchanged). The dry run says when no
    token is set."""
    one = tmp_path / "one"
    one.mkdir()
    (one / "config.json").write_text(json.dumps({"model_type": "llama"}))
    capsys.readouterr()
    for dry in (["--dry-run"], []):
        assert cli("push", one, "me/one", *dry) == 2
        error = one_error(capsys.readouterr().err)
        assert error == (f"rope-extend: error: OUT {str(one)!r} is not a checkpoint rope-extend verified: it holds no "
                         "record of rope-extend's (rope_extend.yaml with output_record), so rope-extend did not write "
                         "or verify it, so nothing was sent (a push publishes what rope-extend wrote and verified); "
                         f"write it with `rope-extend patch {one} --method METHOD --factor N -o NEW` (which verifies "
                         "the checkpoint it writes and records every file) and push NEW, or push it as it is with "
                         "--unverified (the card it sends then says rope-extend did not verify it)")
    assert hub.requests == []
    assert cli("push", one, "me/one", "--unverified") == 0
    card = hub.repos["me/one"].files["README.md"].decode()
    assert card == ("# one\n\n> **Not verified by rope-extend.** Pushed as it is with `rope-extend push --unverified`: "
                    "it holds no record of rope-extend's (rope_extend.yaml with output_record), so rope-extend did not "
                    "write or verify it. rope-extend vouches for none of these files.\n")
    assert sorted(hub.repos["me/one"].files) == ["README.md", "config.json"] and not (one / "README.md").exists()

    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out, "--no-verify") == 0
    assert read_record(out).verified is False
    before = tree(out)
    capsys.readouterr()
    assert cli("push", out, "me/nv", "--dry-run") == 2
    error = one_error(capsys.readouterr().err)
    assert ("its record says it is not verified (written with --no-verify, or kept after a failed verification), so "
            "nothing was sent") in error and f"`rope-extend verify {out}` verifies OUT as it is now" in error
    assert cli("push", out, "me/nv", "--unverified") == 0
    sent = hub.repos["me/nv"].files
    lines = sent["README.md"].decode().split("\n")
    title = next(i for i, line in enumerate(lines) if line.startswith("# "))
    assert lines[0] == "---" and lines[title + 2].startswith("> **Not verified by rope-extend.** Pushed as it is")
    assert "verified: false" in sent["rope_extend.yaml"].decode() and tree(out) == before
    assert cli("verify", out) == 0 and read_record(out).verified is True
    assert cli("push", out, "me/nv2", "--dry-run") == 0 and "--unverified" not in capsys.readouterr().out

    # a record that lists no weight file vouches for no model: refused, the weights refused as unverified
    text = (out / "rope_extend.yaml").read_text()
    (out / "rope_extend.yaml").write_text("".join(line for line in text.splitlines(keepends=True)
                                                  if not line.startswith("    model.safetensors:")))
    assert read_record(out).weights == []
    capsys.readouterr()
    assert cli("push", out, "me/nw") == 2
    error = one_error(capsys.readouterr().err)
    assert "its record lists no weight file, so it vouches for no model" in error and "verify" in error
    monkeypatch.delenv("HF_TOKEN")
    assert cli("push", out, "me/nw", "--dry-run", "--unverified") == 2  # the unrecorded weights stay refused
    printed = capsys.readouterr()
    assert "model.safetensors (weights rope-extend did not verify" in one_error(printed.err)
    assert "move it out" not in printed.err and f"`rope-extend verify {out}` verifies OUT with the weights" in printed.err
    assert "no Hugging Face token is set: the push itself would stop before sending anything" in " ".join(
        printed.out.split())
    assert "me/nw" not in hub.repos


def test_a_pushed_output_downloaded_into_a_hub_cache_pushes_again_on_its_public_record(source, tmp_path, hub, capsys):
    """What a push uploads is a checkpoint rope-extend can vouch for again: the repo's files laid out as
    huggingface_hub's cache (links to blobs), their rope_extend.yaml the public record (sha256 and sizes, no
    inode), push to another repo as they are (the card's Serving section renamed for it); a blob edited in the
    cache is refused by name."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    assert cli("push", out, "me/first") == 0
    uploaded = hub.repos["me/first"].files
    plain = tmp_path / "download"
    plain.mkdir()
    for name, data in uploaded.items():
        (plain / name).write_bytes(data)
    snapshot = hubcache.from_folder(tmp_path / "hub", "me/first", plain)
    capsys.readouterr()
    assert cli("push", snapshot, "me/second") == 0, capsys.readouterr().err
    second = hub.repos["me/second"].files
    card = uploaded["README.md"].replace(b"me/first", b"me/second")
    first_sha, second_sha = (hashlib.sha256(c).hexdigest().encode() for c in (uploaded["README.md"], card))
    assert second == uploaded | {"README.md": card,
                                 "rope_extend.yaml": uploaded["rope_extend.yaml"].replace(first_sha, second_sha)
                                 .replace(b"me/first", b"me/second")}
    blob = Path(os.path.realpath(snapshot / "generation_config.json"))
    blob.write_text('{"max_length": 1}')
    assert cli("push", snapshot, "me/third") == 2
    assert "generation_config.json (edited)" in one_error(capsys.readouterr().err) and "me/third" not in hub.repos


def test_a_gguf_file_is_pushed_as_a_gguf_repo_with_its_card(tmp_path, hub, capsys):
    """Issue 66 item 6: `push model.gguf me/x` (was: "is a file; give the checkpoint folder"). A GGUF keeps no
    rope-extend record, so it goes with --unverified only (one line before any request says so); then the repo
    holds the file byte for byte and a card the Hub reads as a GGUF repo's (the gguf tag), saying what llama.cpp
    reads from the metadata, that rope-extend did not verify it, and the llama-server command for the repo; no
    local path in it. A vocab-only GGUF is refused for what it is."""
    import gguf
    from helpers import write_tiny_gguf

    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "tiny-yarn.gguf"
    assert cli("patch", source, "--method", "yarn", "--factor", "2", "-o", out) == 0
    capsys.readouterr()
    assert cli("push", out, "me/tiny-gguf") == 2
    error = one_error(capsys.readouterr().err)
    assert error.startswith(f"rope-extend: error: OUT {str(out)!r} is not a checkpoint rope-extend verified: it is a "
                            "GGUF file, which keeps no record of rope-extend's") and "--unverified" in error
    assert hub.requests == []
    assert cli("push", out, "me/tiny-gguf", "--unverified", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert dry_run_lines(printed) == ["README.md", "tiny-yarn.gguf"] and "would push 2 files" in printed
    assert cli("push", out, "me/tiny-gguf", "--unverified") == 0
    assert "(2 files, public)" in capsys.readouterr().out
    files = hub.repos["me/tiny-gguf"].files
    assert sorted(files) == ["README.md", "tiny-yarn.gguf"] and files["tiny-yarn.gguf"] == out.read_bytes()
    card = files["README.md"].decode()
    assert "gguf" in card_data(card, tmp_path).tags
    meta = {name: f.contents() for name, f in gguf.GGUFReader(out).fields.items()}
    assert f"- context_length: {meta['llama.context_length']}" in card
    assert f"factor={meta['llama.rope.scaling.factor']:g}" in card and "type=yarn" in card
    assert "> **Not verified by rope-extend.**" in card
    assert f"llama-server --hf-repo me/tiny-gguf --hf-file tiny-yarn.gguf -c {meta['llama.context_length']}" in card
    assert str(tmp_path) not in card

    vocab = tmp_path / "ggml-vocab.gguf"
    writer = gguf.GGUFWriter(str(vocab), "llama")
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert cli("push", vocab, "me/vocab", "--unverified") == 2
    assert "is a vocab-only GGUF" in one_error(capsys.readouterr().err) and "me/vocab" not in hub.repos


# --- large outputs: LFS objects first, one commit, resumed after faults (issue 59) -----------------------------------
PART = 16 << 10  # the test Hub's multipart part size: every shard travels in several parts


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A checkpoint saved in 4 shards (as users' large ones are), bf16."""
    import torch

    folder = tmp_path_factory.mktemp("sharded") / "src"
    tiny.make_model("llama").to(torch.bfloat16).save_pretrained(folder, max_shard_size="40KB")
    assert len(list(folder.glob("model-*.safetensors"))) >= 3
    return folder


def shards(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def sent_names(out: Path) -> list[str]:
    return sorted(read_record(out).files)


def test_weights_resharded_after_writing_are_verified_on_recorded_and_pushed(source, tmp_path, hub, capsys):
    """Issue 66 item 2: a full OUT whose weights were re-sharded by hand: `verify` said verified "on the real
    weights" while its record then listed no weight file, and the push refused every shard as "added later" (moving
    them out pushed a checkpoint with no weights). Now verify runs on the shards, the record lists them and their
    index, and the push sends them; an OUT with no weight file left is refused by verify."""
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out, "--mode", "full") == 0
    state = load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    save_torch_state_dict({k: v.to(torch.float32) for k, v in state.items()}, out, max_shard_size="20KB")
    names = shards(out)
    assert len(names) >= 2 and "model.safetensors" not in names
    capsys.readouterr()
    assert cli("verify", out) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "on the real weights" in said and f"vouching for the weights {names[0]}" in said
    assert read_record(out).weights == sorted([*names, "model.safetensors.index.json"])
    assert cli("push", out, "me/resharded") == 0
    sent = hub.repos["me/resharded"].files
    assert sorted(name for name in sent if "safetensors" in name) == sorted([*names, "model.safetensors.index.json"])
    assert all(sent[name] == (out / name).read_bytes() for name in names)

    for name in [*names, "model.safetensors.index.json"]:
        (out / name).unlink()
    assert cli("verify", out) == 2
    assert "holds no weight file (*.safetensors), so there is no model to verify" in one_error(capsys.readouterr().err)


def test_an_interrupted_push_resumes_sending_only_what_the_hub_lacks(sharded, tmp_path, hub, capsys):
    """Ctrl-C in the middle of a sharded push (after half of the shards' bytes arrived): exit 130, one line saying
    what the Hub holds, that nothing was committed and the command that resumes; the repo shows nothing. Rerun: the
    shards whose objects arrived are not sent again (the server counts the bytes it receives: exactly the missing
    shards' sizes), and the one commit holds exactly the verified files, byte for byte."""
    out = tmp_path / "out"
    assert cli("patch", sharded, *YARN, "-o", out) == 0
    names = shards(out)
    sizes = {name: (out / name).stat().st_size for name in names}
    total = sum(sizes.values())
    hub.part_size = PART
    hub.cut_after, hub.interrupt = total // 2, True
    before = tree(out)
    capsys.readouterr()
    assert cli("push", out, "me/big") == 130
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1, err
    repo = hub.repos["me/big"]
    held = [name for name in names if hashlib.sha256((out / name).read_bytes()).hexdigest() in repo.objects]
    assert 0 < len(held) < len(names)
    assert (f"push interrupted: {len(held)} of {len(names)} large files" in lines[0]
            and "nothing was committed, so me/big shows no part of this checkpoint" in lines[0])
    assert f"`rope-extend push {out} me/big` resumes" in lines[0]
    assert repo.commits == [] and repo.tree == {} and tree(out) == before
    first = hub.received
    assert total // 2 <= first < total

    assert cli("push", out, "me/big") == 0
    printed = capsys.readouterr()
    missing = sum(sizes[name] for name in names if name not in held)
    assert hub.received - first == missing  # only the objects the Hub lacked, each once
    assert (f"{len(names) - len(held)} of {len(names)} large files to send" in printed.err
            and f"on the Hub already from an earlier push: {len(held)}" in printed.err)
    assert repo.commits == [repo.commits[0]] and sorted(repo.tree) == sent_names(out)
    assert repo.files == folder_bytes(out, sent_names(out), "me/big")
    assert tree(out) == before


def test_a_file_changed_between_an_interrupted_push_and_its_resumption_is_refused(sharded, tmp_path, hub, capsys):
    """The record's hashes decide across a resume: a shard rewritten with other bytes after the interruption is
    refused by name, in one line, before any byte is sent or anything committed."""
    out = tmp_path / "out"
    assert cli("patch", sharded, *YARN, "-o", out, "--mode", "full") == 0
    names = shards(out)
    assert names and read_record(out).entries[names[-1]].sha256  # written by rope-extend: recorded by content
    hub.part_size = PART
    hub.cut_after, hub.interrupt = sum((out / n).stat().st_size for n in names) // 2, True
    assert cli("push", out, "me/edit") == 130
    capsys.readouterr()
    data = bytearray((out / names[-1]).read_bytes())
    data[-1] ^= 1
    (out / names[-1]).write_bytes(bytes(data))
    received, requests = hub.received, len(hub.requests)
    assert cli("push", out, "me/edit") == 2
    error = one_error(capsys.readouterr().err)
    assert f"changed since rope-extend verified it, so nothing was sent: {names[-1]} (edited)" in error
    assert hub.received == received and len(hub.requests) == requests
    assert hub.repos["me/edit"].commits == []


def test_faults_are_retried_a_429_waits_its_retry_after_and_a_reset_resends_one_part(sharded, tmp_path, hub,
                                                                                        capsys):
    """A 500 on creating the repo (retried after 1 s), a 429 with Retry-After: 3 on the commit (waited 3 s, then
    committed once), a connection reset in the middle of a shard's second part (that part is sent again, not the
    file): the push succeeds with every file intact and says each retry, naming the request, never its URL."""
    from hubserver import Fault

    out = tmp_path / "out"
    assert cli("patch", sharded, *YARN, "-o", out) == 0
    names = shards(out)
    total = sum((out / n).stat().st_size for n in names)
    hub.part_size = PART
    hub.fault(Fault(nth=1, status=500, path="/api/repos/create"))
    hub.fault(Fault(nth=1, status=429, path="/commit/", retry_after=3))
    hub.cut_after = PART + PART // 2  # in the middle of the second part
    capsys.readouterr()
    assert cli("push", out, "me/faults") == 0
    err = capsys.readouterr().err
    assert hub.waits == [1.0, 1.0, 3.0]  # the repo, the cut part, the commit: each request retried alone
    assert "HTTP 500 on creating the repo: retrying in 1 s (try 2 of 5)" in err
    assert re.search(rf"\w+ on {re.escape(names[0])}, part 2: retrying in 1 s \(try 2 of 5\)", err), err
    assert "HTTP 429 on the commit: retrying in 3 s (try 2 of 5)" in err
    assert total < hub.received <= total + PART  # the cut part again, not the whole shard
    assert len([r for r in hub.requests if "/commit/" in r.path]) == 2
    assert "/lfs/" not in err and hub.endpoint not in err
    repo = hub.repos["me/faults"]
    assert len(repo.commits) == 1 and repo.files == folder_bytes(out, sent_names(out), "me/faults")


def test_one_retry_policy_a_persistent_503_is_tried_as_stated_and_no_url_is_printed(sharded, tmp_path, hub,
                                                                                      capsys):
    """A part the Hub answers 503 on every try (issue 66 item 2: 5 tries of rope-extend around huggingface_hub's 6
    made 30 in ~135 s, each logged by huggingface_hub with the part's whole URL): the part is tried
    `upload.RETRY.attempts` times in all, waiting 1, 2, 4, 8 s, one rope-extend line per retry naming the file and
    part; huggingface_hub logs nothing; then one error line offers the command that resumes. Nothing is committed."""
    import logging

    from hubserver import Fault

    from rope_extend.publish.upload import RETRY

    out = tmp_path / "out"
    assert cli("patch", sharded, *YARN, "-o", out) == 0
    first = shards(out)[0]
    hub.part_size = PART
    fault = hub.fault(Fault(nth=1, status=503, path="/lfs/me--down/", times=None))  # its parts
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("huggingface_hub")
    logger.addHandler(handler)
    capsys.readouterr()
    try:
        assert cli("push", out, "me/down") == 2
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert RETRY.attempts == 5 and fault.fired == RETRY.attempts
    assert hub.waits == [1.0, 2.0, 4.0, 8.0]
    retries = [line for line in err.splitlines() if "retrying in" in line]
    assert [line.split("rope-extend: ")[-1] for line in retries] == [
        f"HTTP 503 on {first}, part 1: retrying in {wait} s (try {n} of 5)" for n, wait in ((2, 1), (3, 2), (4, 4), (5, 8))]
    error = one_error(err)
    assert "pushing to 'me/down' failed: HTTP 503" in error and f"push it later with `rope-extend push {out} me/down`" in error
    assert "/lfs/" not in err and hub.endpoint not in err
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    assert hub.repos["me/down"].commits == []


@pytest.mark.parametrize("status", [401, 403, 404])
def test_an_auth_or_missing_repo_error_fails_at_once_in_one_line(source, tmp_path, hub, capsys, status):
    from hubserver import Fault

    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    fault = hub.fault(Fault(nth=1, status=status, path="/preupload/", times=None))
    capsys.readouterr()
    assert cli("push", out, "me/denied") == 2
    error = one_error(capsys.readouterr().err)
    assert f"pushing to 'me/denied' failed: HTTP {status}" in error and "retrying" not in error
    assert fault.fired == 1 and hub.waits == [] and hub.received == 0
    assert hub.repos["me/denied"].commits == []


# --- publishing edges (issue 57 item 7) ------------------------------------------------------------------------------
def test_the_dry_run_of_a_refused_push_counts_nothing_sent_and_lists_each_file_once(source, tmp_path, hub, capsys):
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    (out / "config.json").write_text((out / "config.json").read_text().replace("64", "65", 1))
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli("push", out, "me/dry", "--dry-run") == 2
    printed = capsys.readouterr().out
    head = " ".join(printed.split("commit message:")[0].split())
    assert head == ("dry run: a push to me/dry would send nothing: 2 files it may not send, 1 changed since "
                    "verification (!) and 1 refused (x); the 5 files marked + would go once they are dealt with")
    marked = [line.split()[1] for line in printed.splitlines() if line.startswith(("  + ", "  ! ", "  x "))]
    assert sorted(marked) == sorted([*CHECKPOINT, "notes.txt"])  # each once: config.json as changed only
    assert dry_run_lines(printed, "!") == ["config.json"] and hub.requests == []


def test_include_through_dot_dot_escaped_names_and_what_a_users_folder_sends_byte_for_byte(source, tmp_path, hub,
                                                                                           capsys):
    """OUT holding a user's notes (one of them named through `extra/..`), a private key, a symlink to a file outside
    and a name with an escape sequence and a newline: the refusal prints the name escaped; once the name is gone,
    `--include extra/../NOTES.md` sends NOTES.md; the server receives exactly the checkpoint and the notes (every
    request body searched: no byte of the key or the outside file), and the uploaded rope_extend.yaml names the repo
    in its serving commands, with no placeholder, and says what it holds."""
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out) == 0
    (out / "extra").mkdir()
    (out / "NOTES.md").write_text("how I made it\n")
    (out / "private").mkdir()
    key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
    (out / "private" / "id_ed25519").write_bytes(key)
    outside = tmp_path / "passwd"
    outside.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    (out / "passwd.txt").symlink_to(outside)
    odd = "notes\x1b[31mRED\nrope-extend: pushed.txt"
    (out / odd).write_text("x")
    capsys.readouterr()
    assert cli("push", out, "me/edges", "--include", "extra/../NOTES.md") == 2
    printed = capsys.readouterr()
    assert "\x1b" not in printed.err + printed.out and "notes\\x1b[31mRED\\nrope-extend: pushed.txt (not a file" in (
        printed.err)
    assert cli("push", out, "me/edges", "--include", "extra/../NOTES.md", "--dry-run") == 2
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out and "  x notes\\x1b[31mRED\\nrope-extend: pushed.txt   (refused" in printed.out
    os.unlink(out / odd)
    import shutil

    shutil.rmtree(out / "private")
    os.unlink(out / "passwd.txt")
    assert cli("push", out, "me/edges", "--include", "extra/../NOTES.md") == 0
    files = hub.repos["me/edges"].files
    assert files == folder_bytes(out, [*CHECKPOINT, "NOTES.md"], "me/edges")
    wire = b"".join(r.body for r in hub.requests) + b"".join(
        v for v in hub.repos["me/edges"].objects.values() if isinstance(v, bytes))
    assert key not in wire and b"root:x:0:0" not in wire and b"BEGIN OPENSSH" not in wire
    record = files["rope_extend.yaml"].decode()
    assert MODEL_ID not in record and "vllm serve me/edges" in record and "model_id: me/edges" in record
    note = next(line for line in record.splitlines() if line.startswith("# output_record:"))
    assert "inode" not in record and "time" not in note and "model_id" in note


def test_rope_extend_imports_no_private_huggingface_hub_name():
    """The Hub client through huggingface_hub's public API (issue 67 item 6): no module of rope_extend imports a
    private module or name of huggingface_hub (`_commit_api`, `_fetch_upload_modes`...), which change between its
    majors (0.36 and 2.x are both supported)."""
    import ast

    import rope_extend

    found = []
    for path in sorted(Path(rope_extend.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "huggingface_hub":
                private = [part for part in node.module.split(".") if part.startswith("_")]
                private += [alias.name for alias in node.names if alias.name.startswith("_")]
                found += [f"{path.name}:{node.lineno} {name}" for name in private]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "").startswith("_build_hf_headers"):
                found.append(f"{path.name}:{node.lineno} _build_hf_headers")
    assert found == []
