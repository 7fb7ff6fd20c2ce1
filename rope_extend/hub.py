"""The Hugging Face Hub: resolve a SOURCE (local folder or Hub id) to files, name its base model, push OUT.

The model card is rope_extend.card's. Resolution goes through huggingface_hub's cache, so `HF_HUB_OFFLINE=1`, `HF_HUB_CACHE`, `--revision` and `HF_TOKEN`
behave as everywhere else. The token is passed to huggingface_hub and never printed, logged or written.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CheckpointError

if TYPE_CHECKING:
    from .record import Selection

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return env or bool(getattr(constants, "HF_HUB_OFFLINE", False))


# Model aliases every command accepts as SOURCE (resolved before any path or Hub lookup).
ALIASES = {"smollm2": "the demo model SmolLM2-135M-Instruct (built once under $ROPE_EXTEND_CACHE, default "
                      "~/.cache/rope-extend)"}
REACH_TIMEOUT_S = 3.0


def resolve_alias(source: str | os.PathLike) -> str | os.PathLike:
    """`smollm2` -> the demo model's local folder (a folder named smollm2 in the working directory wins)."""
    if str(source) in ALIASES and not Path(source).exists():
        from .demo_model import smollm2_path

        return str(smollm2_path())
    return source


def hub_reachable(timeout: float = REACH_TIMEOUT_S) -> bool:
    """One TCP connection to the Hub endpoint: a quick yes/no instead of huggingface_hub's retries (~25 s)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(getattr(constants, "ENDPOINT", None) or "https://huggingface.co")
    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(name) for name in proxies):
        return True  # behind a proxy a direct connection says nothing; huggingface_hub's own errors answer
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def hub_repo_id(folder: Path) -> str | None:
    """`org/name` when `folder` is a snapshot in the Hub cache layout (models--org--name/snapshots/<rev>)."""
    from .files import hub_repo_root

    root = hub_repo_root(folder)
    if root is None:
        return None
    repo = root.name.removeprefix("models--").replace("--", "/", 1)
    return repo if REPO_ID.match(repo) else None


# The Hub repo each alias is built from: the model card's base_model.
ALIAS_REPOS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def base_model_id(source: str | os.PathLike, resolved: Path) -> str | None:
    """The Hub repo SOURCE is (the model card's `base_model`): a Hub id, an alias's repo, the repo of a Hub cache
    snapshot (its `models--org--name` folder names it), the demo model's folder; None for another local folder."""
    text = str(source)
    if text in ALIAS_REPOS and not Path(text).exists():
        return ALIAS_REPOS[text]
    if REPO_ID.match(text) and not Path(text).expanduser().exists():
        return text
    from .demo_model import is_demo_model

    if is_demo_model(resolved):
        return ALIAS_REPOS["smollm2"]
    return hub_repo_id(resolved)


# What a Hub snapshot download fetches: a checkpoint (weights, config, tokenizer, code, card), or a tokenizer alone.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.md", "*.tiktoken", "*.jinja"]
TOKENIZER_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def resolve_source(source: str | os.PathLike, revision: str | None = None, config_only: bool = False,
                   tokenizer_only: bool = False) -> Path:
    """A local folder holding the checkpoint: SOURCE itself, the demo model for the alias `smollm2`, or the Hub
    cache snapshot of the repo id SOURCE. With the Hub unreachable, the cache answers or one error line does.
    Every command that takes SOURCE resolves it here. `config_only`: only config.json is fetched from the Hub;
    `tokenizer_only`: only the tokenizer's files (and a local folder needs no config.json)."""
    source = resolve_alias(source)
    path = Path(source).expanduser()
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(
                f"--revision {revision!r} applies to Hub repo ids, but SOURCE {str(path)!r} is a local folder; "
                "drop --revision (or check out that revision into the folder)"
            )
        if not tokenizer_only and not (path / "config.json").is_file():
            raise CheckpointError(f"{str(path)!r} has no config.json; point SOURCE at a Hugging Face checkpoint folder")
        return path.resolve()
    if path.exists():
        raise CheckpointError(f"SOURCE {str(path)!r} is a file; give the checkpoint folder (with config.json)")
    source = str(source)
    if not REPO_ID.match(source):
        raise CheckpointError(
            f"SOURCE {source!r} is neither an existing folder, a Hub repo id like 'meta-llama/Llama-3.1-8B', nor an "
            f"alias ({', '.join(ALIASES)}); check the path"
        )
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = _offline()
    unreachable = not offline and not hub_reachable()
    offline = offline or unreachable  # the cache still answers; nothing waits on retries
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        if config_only:
            config = hf_hub_download(
                source, "config.json", revision=revision, cache_dir=cache_dir, local_files_only=offline
            )
            return Path(config).parent
        folder = snapshot_download(
            source,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            allow_patterns=TOKENIZER_FILES if tokenizer_only else CHECKPOINT_FILES,
        )
    except (LocalEntryNotFoundError, FileNotFoundError):
        where = f"and the Hub ({_endpoint()}) is unreachable" if unreachable else "offline (HF_HUB_OFFLINE=1)"
        raise CheckpointError(
            f"{source!r}{'@' + revision if revision else ''} is not in the local Hub cache {where}; download it "
            f"first (hf download {source}) or pass a local folder"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise CheckpointError(
            f"Hub repo {source!r} not found or not accessible ({type(exc).__name__}); check the id and set HF_TOKEN "
            "for private or gated repos"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"revision {revision!r} of {source!r} does not exist; check --revision") from None
    except HfHubHTTPError as exc:
        raise CheckpointError(f"could not fetch {source!r} from the Hub: HTTP {_status(exc)}") from None
    folder = Path(folder)
    if not tokenizer_only and not (folder / "config.json").is_file():
        raise CheckpointError(f"{source!r} has no config.json in the Hub cache snapshot {folder}")
    return folder


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(getattr(constants, "ENDPOINT", None) or "https://huggingface.co")


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "error"))


# --- push ------------------------------------------------------------------------------------------------------------
# What a push sends is decided by rope_extend.record (no network, nothing written); this part talks to the Hub.
# OUT is never written by a push: a card naming the repo is sent from memory.
SERVING_HEADING = "\n## Serving\n\n"


@dataclass
class PushPlan:
    """What a push sends: computed once by `plan_push`, printed by `--dry-run`, executed by `push`."""

    folder: Path
    repo_id: str
    private: bool
    selection: Selection
    commit_message: str
    card: bytes | None = None  # OUT's README.md with its Serving section naming `repo_id` (None: sent as it is)
    record_text: bytes | None = None  # OUT's rope_extend.yaml without this machine's data (`record.public_text`)
    serve: str | None = None  # the serve line for the pushed repo (from OUT's record)
    written_now: bool = False  # `patch`/`train --push-to-hub`: OUT was just written, its command is news
    include: tuple[str, ...] = ()  # push's --include names (the push-later command repeats them)
    unverified: bool = False  # push --unverified (the push-later command repeats it)
    url: str = ""
    transfer: object = None  # upload.Transfer of the push that ran (what was sent, what the Hub held)

    @property
    def files(self) -> list[str]:
        return self.selection.names

    @property
    def later(self) -> str:
        """The one command that pushes `folder` (what a failure a retry can fix prints)."""
        return (f"rope-extend push {shlex.quote(str(self.folder))} {self.repo_id}" + (" --private" if self.private else "")
                + "".join(f" --include {shlex.quote(name)}" for name in self.include)
                + (" --unverified" if self.unverified else ""))

    def kept(self, retry: bool = False) -> str:
        """How a failure ends: OUT is kept as it was, and, when a retry can fix the failure (network, 5xx), the
        command that pushes it later; after an auth failure of `--push-to-hub`, the command to run once fixed."""
        where = f"; OUT {str(self.folder)!r} is kept as it is"
        if retry:
            return f"{where}: push it later with `{self.later}` (it sends only what the Hub does not hold yet)"
        return f"{where}: once that is fixed, push it with `{self.later}`" if self.written_now else where

    def dry_run_lines(self) -> list[str]:
        """The dry run's report: the repo, its visibility, the commit message, every file sent (and why it may
        be), left out or refused (and why)."""
        from .record import CARD, SPEC_FILE, shown_name

        selection = self.selection
        changed = {name for name, _ in selection.changed}
        sendable = [entry for entry in selection.sent if entry.name not in changed]
        if selection.refusal() is None:
            head = (f"dry run: would push {files_count(len(sendable))} to {self.repo_id} "
                    f"({'private' if self.private else 'public'} if created; an existing repo keeps its visibility)")
        else:  # the push would be refused: nothing is sent, and the count says so
            why = [f"{len(changed)} changed since verification (!)" if changed else "",
                   f"{len(selection.refused)} refused (x)" if selection.refused else ""]
            head = (f"dry run: a push to {self.repo_id} would send nothing: {files_count(len(changed) + len(selection.refused))} "
                    f"it may not send, {' and '.join(w for w in why if w)}; the {files_count(len(sendable))} marked + "
                    "would go once they are dealt with")
        lines = [head, f"commit message: {self.commit_message}"]
        if selection.unverified is not None and selection.allow_unverified:
            lines.append(f"--unverified: {selection.unverified}; the {CARD} sent says rope-extend did not verify it "
                         "(OUT's copy is not changed)")
        elif self.card is not None:
            lines.append(f"{CARD}: sent with its Serving section naming {self.repo_id} (OUT's copy is not changed)")
        elif selection.card_edited:
            lines.append(f"{CARD}: edited since rope-extend wrote it: yours, sent as written")
        if find_token() is None:
            lines.append("no Hugging Face token is set: the push itself would stop before sending anything; set "
                         "HF_TOKEN to a token with write access or log in once with `hf auth login`")
        if self.record_text is not None:
            lines.append(f"{SPEC_FILE}: sent without this machine's data (inodes, times), its serving commands naming "
                         f"{self.repo_id}; OUT's copy is not changed")
        lines += [f"  + {shown_name(entry.name)}   ({entry.how})" for entry in sendable]
        lines += [f"  - {shown_name(name)}   (left out: {why})" for name, why in selection.left_out]
        lines += [f"  x {shown_name(name)}   (refused: {why})" for name, why in selection.refused]
        lines += [f"  ! {shown_name(name)}   (changed since rope-extend verified it: {why})"
                  for name, why in selection.changed]
        return lines


def files_count(count: int) -> str:
    """'1 file', '6 files'."""
    return f"{count} file" + ("" if count == 1 else "s")


def check_repo_id(repo_id: str, flag: str = "REPO") -> str:
    """`repo_id` if it is a model repo id `user/name` that huggingface_hub's own `validate_repo_id` accepts; else
    one line naming `flag` (the caller's argument) and the library's reason. No network."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not REPO_ID.match(repo_id or ""):
        meant = (repo_id or "").lstrip("-")
        dash = (f"; it starts with '-': a repo id starts with a letter or a digit, e.g. {meant!r}"
                if (repo_id or "").startswith("-") and REPO_ID.match(meant) else "")
        raise CheckpointError(f"{flag} expects a Hub repo id like 'user/model-name', got {repo_id!r}{dash}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        reason = " ".join(str(exc).split())
        raise CheckpointError(f"{flag} {repo_id!r} is not a valid Hub repo id (huggingface_hub: {reason})") from None
    return repo_id


def plan_push(folder: str | os.PathLike, repo_id: str, private: bool, include: Sequence[str] = (), *,
              flag: str = "REPO", written_now: bool = False, unverified: bool = False) -> PushPlan:
    """Check the repo id and OUT and compute the upload (`record.select`); no network, nothing written. Refused
    files are in `plan.selection.refused` (`selection.refusal()` is the error the push raises). `unverified`: push
    --unverified, an OUT rope-extend did not verify sent as it is with a card that says so."""
    from .record import CARD, SPEC_FILE, Sent, public_text, select, spec_text

    check_repo_id(repo_id, flag)
    given = str(folder)
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise CheckpointError(f"OUT {given!r} does not exist; give the folder `rope-extend patch` or `train` wrote")
    if folder.is_file():
        from .gguf import is_gguf

        if is_gguf(folder):
            return plan_gguf_push(folder, repo_id, private, written_now=written_now, unverified=unverified)
        raise CheckpointError(f"OUT {given!r} is a file, not a GGUF; give the checkpoint folder (with config.json) "
                              "or a .gguf file")
    if not folder.is_dir():
        raise CheckpointError(f"OUT {given!r} is neither a folder nor a file; give the checkpoint folder")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"OUT {given!r} is not a checkpoint folder (no config.json); give the folder "
                              "`rope-extend patch` or `train` wrote")
    folder = Path(os.path.abspath(folder))
    command = f"rope-extend push {shlex.quote(str(folder))} {repo_id}"
    hint = (f"`{command} --include {{name}}`" if written_now
            else "--include {name}")  # patch and train have no --include: the push command does
    selection = select(folder, include, hint, unverified=unverified,
                       unverified_hint=f"`{command} --unverified`" if written_now else "--unverified")
    record = selection.record
    card = None
    readme = next((entry for entry in selection.sent if entry.name == CARD), None)
    if record is not None and record.serving is not None and readme is not None and not selection.card_edited:
        try:
            text = readme.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = None  # not a card rope-extend wrote: sent as it is
        new = text and _with_serving(text, record.serving_for(repo_id))
        card = None if new == text else new.encode("utf-8")
    if selection.unverified is not None and unverified:  # the card sent says so, whatever OUT's says
        if readme is None:
            readme = Sent(CARD, folder / CARD, "written by this push (OUT has none): it says rope-extend did not "
                                               "verify this folder")
            selection.sent = sorted([*selection.sent, readme], key=lambda entry: entry.name)
            text = None
        elif card is not None:
            text = card.decode("utf-8")
        else:
            try:
                text = readme.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        card = unverified_card(text, folder.name, selection.unverified).encode("utf-8")
    spec = spec_text(folder)
    what = " ".join(spec.split()) if spec else f"upload {folder.name}"
    sends_record = record is not None and any(entry.name == SPEC_FILE for entry in selection.sent)
    return PushPlan(folder=folder, repo_id=repo_id, private=private, selection=selection,
                    commit_message=("rope-extend: " + what)[:1000], card=card,
                    record_text=public_text(folder, record, card, repo_id).encode("utf-8") if sends_record else None,
                    serve=record.serve_for(repo_id) if record is not None else None, written_now=written_now,
                    include=tuple(include), unverified=unverified and selection.unverified is not None)


def plan_gguf_push(path: Path, repo_id: str, private: bool, *, written_now: bool = False,
                   unverified: bool = False) -> PushPlan:
    """A push of one GGUF file as a GGUF repo: the file and a card (sent from memory) saying what llama.cpp reads
    from its metadata and how to serve it from the repo. A GGUF holds no rope-extend record, so it goes only with
    `unverified` (the card says so). Its header is read first: what is not a model GGUF is refused in one line."""
    from .gguf import read_gguf_info
    from .record import CARD, Selection, Sent

    path = Path(os.path.abspath(path))
    info = read_gguf_info(path)
    command = f"rope-extend push {shlex.quote(str(path))} {repo_id} --unverified"
    selection = Selection(folder=path, record=None, allow_unverified=unverified,
                          unverified_hint=f"`{command}`" if written_now else "--unverified")
    selection.unverified = ("it is a GGUF file, which keeps no record of rope-extend's (its metadata is what "
                            "llama.cpp reads), so rope-extend cannot say it wrote and verified it")
    selection.unverified_fix = ("`rope-extend patch` checks the GGUF it writes against llama.cpp's RoPE math, but "
                                "keeps no record inside it either")
    selection.sent = [Sent(CARD, path.with_name(CARD), "written by this push: what llama.cpp reads from the file, "
                                                       "how to serve it"),
                      Sent(path.name, path, "the GGUF file")]
    return PushPlan(folder=path, repo_id=repo_id, private=private, selection=selection,
                    commit_message=f"rope-extend: upload {path.name}",
                    card=gguf_card(info, repo_id, path.name, selection.unverified).encode("utf-8"),
                    written_now=written_now, unverified=unverified)


def gguf_card(info, repo_id: str, file_name: str, why: str) -> str:
    """The card of a pushed GGUF: the Hub's gguf tag, what llama.cpp reads from its metadata (no local path), the
    note that rope-extend did not verify it, and the command that serves it from the repo."""
    scaling = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.scaling.items())
    rope_freqs = f"{len(info.rope_freqs)} factors" if info.rope_freqs is not None else "none"
    context = f" -c {info.context_length}" if info.context_length else ""
    return "\n".join([
        "---", "tags:", "- gguf", "- rope-scaling", "- long-context", "---", "",
        f"# {repo_id.split('/', 1)[1]}", "", UNVERIFIED_NOTE.format(why=why), "",
        f"`{file_name}`: {info.name or 'a model'} as one GGUF file for llama.cpp ({info.architecture}, "
        f"{info.tensor_count} tensors, {info.file_size / 1e6:.1f} MB).", "",
        "## What llama.cpp reads from it", "",
        f"- context_length: {info.context_length}",
        f"- rope.freq_base: {info.freq_base:.9g}",
        f"- rope.dimension_count: {info.rope_dim}",
        f"- rope.scaling: {scaling or 'none'}",
        f"- rope_freqs tensor: {rope_freqs}", "",
        "Read from the file's metadata by rope-extend (`rope-extend show FILE.gguf` prints the same).", "",
        "## Serving", "", "```bash",
        f"llama-server --hf-repo {repo_id} --hf-file {shlex.quote(file_name)}{context}", "```", "",
    ])


UNVERIFIED_NOTE = ("> **Not verified by rope-extend.** Pushed as it is with `rope-extend push --unverified`: {why}. "
                   "rope-extend vouches for none of these files.")


def unverified_card(text: str | None, name: str, why: str) -> str:
    """The card an unverified push sends: `text` (OUT's card; None: OUT has none, a title is made from `name`) with
    a note under its title (after the metadata block) saying rope-extend did not verify it and why."""
    note = UNVERIFIED_NOTE.format(why=why)
    if not text:
        return f"# {name}\n\n{note}\n"
    lines = text.split("\n")
    start = 0
    if lines and lines[0].strip() == "---":  # the metadata block the Hub reads stays first
        start = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
    title = next((i for i in range(start, len(lines)) if lines[i].startswith("# ")), None)
    at = title + 1 if title is not None else start
    return "\n".join(lines[:at] + ["", note, ""] + lines[at:])


def _with_serving(text: str, serving: str) -> str:
    """`text` (a model card) with the body of its Serving section replaced by `serving`."""
    start = text.find(SERVING_HEADING)
    if start < 0:
        return text
    body = start + len(SERVING_HEADING)
    end = text.find("\n## ", body)
    end = len(text) if end < 0 else end
    return text[:body] + serving.strip() + "\n" + text[end:]


def find_token() -> str | None:
    """HF_TOKEN, else huggingface_hub's stored token (`hf auth login`), else None (never printed)."""
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token() or None


def hub_token(where: str = "") -> str:
    """HF_TOKEN, else huggingface_hub's stored token (`hf auth login`); a missing one is refused here, before any
    network call. The token goes to huggingface_hub only: never printed, logged or written."""
    token = find_token()
    if not token:
        raise CheckpointError(
            "no Hugging Face token: set HF_TOKEN to a token with write access or log in once with `hf auth login`"
            + where
        )
    return token


def check_reachable(plan: PushPlan) -> None:
    """One TCP connection to the Hub (3 s) instead of huggingface_hub's retries; a retry can fix this one."""
    if not hub_reachable():
        raise CheckpointError(f"cannot push to {plan.repo_id!r}: the Hub ({_endpoint()}) is unreachable"
                              f"{plan.kept(retry=True)}")


def push(plan: PushPlan, token: str, report=None, retry=None) -> bool | None:
    """Create the repo (`exist_ok`: a later push adds a commit) and send exactly `plan.selection.sent`: the large
    files as LFS objects the Hub does not hold yet, then one commit of every file (`rope_extend.upload`; the card
    from `plan.card` when it names the repo); returns the visibility the Hub reports afterwards (True: private; None:
    not reported). Sets `plan.url`. Every failure is one CheckpointError line saying why, OUT is kept as it was (a
    push writes nothing into it), and a failure a retry can fix offers the command that resumes; Ctrl-C raises
    `upload.PushInterrupted`, whose line says the same."""
    from huggingface_hub import HfApi

    from .upload import retryable, send, status_of, without_urls

    refusal = plan.selection.refusal()
    if refusal is not None:
        raise refusal
    try:
        transfer = send(plan, token, report, retry)
    except (KeyboardInterrupt, SystemExit, MemoryError, CheckpointError):
        raise
    except Exception as exc:  # huggingface_hub's HTTP errors, connection errors and timeouts of its HTTP client
        status = status_of(exc)
        if status is None:
            reason = without_urls(" ".join(str(exc).split()))[:200]
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed ({type(exc).__name__}"
                                  f"{': ' + reason if reason else ''}){plan.kept(retry=retryable(exc))}") from None
        said = without_urls(" ".join(str(getattr(exc, "server_message", None) or "").split()))[:200]
        said = f" ({said})" if said else ""
        if status in (401, 403):
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP {status}{said}; check that the token "
                                  f"has write access to it{plan.kept()}") from None
        if status == 404:
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP 404{said}; check the repo id and that "
                                  f"the token may write to it{plan.kept()}") from None
        raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP {status}{said}"
                              f"{plan.kept(retry=retryable(exc))}") from None
    plan.url = transfer.url or f"{_endpoint()}/{plan.repo_id}"
    plan.transfer = transfer
    try:
        return bool(HfApi(token=token).repo_info(plan.repo_id, repo_type="model").private)
    except Exception:  # the push is done; only the visibility report is missing
        return None
