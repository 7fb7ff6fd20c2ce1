"""The Hugging Face Hub: resolve a SOURCE (local folder or Hub id) to files, name its base model, push OUT.

The model card is rope_extend.card's. Resolution goes through huggingface_hub's cache, so `HF_HUB_OFFLINE=1`, `HF_HUB_CACHE`, `--revision` and `HF_TOKEN`
behave as everywhere else. The token is passed to huggingface_hub and never printed, logged or written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return env or bool(getattr(constants, "HF_HUB_OFFLINE", False))


# Model aliases every command accepts as SOURCE (resolved before any path or Hub lookup).
ALIASES = {"smollm2": "the demo model SmolLM2-135M-Instruct (built once under ~/.cache/rope-extend)"}
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


def resolve_source(source: str | os.PathLike, revision: str | None = None, config_only: bool = False) -> Path:
    """A local folder holding the checkpoint: SOURCE itself, the demo model for the alias `smollm2`, or the Hub
    cache snapshot of the repo id SOURCE. With the Hub unreachable, the cache answers or one error line does."""
    source = resolve_alias(source)
    path = Path(source).expanduser()
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(
                f"--revision {revision!r} applies to Hub repo ids, but SOURCE {str(path)!r} is a local folder; "
                "drop --revision (or check out that revision into the folder)"
            )
        if not (path / "config.json").is_file():
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
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.md", "*.tiktoken", "*.jinja"],
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
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{source!r} has no config.json in the Hub cache snapshot {folder}")
    return folder


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(getattr(constants, "ENDPOINT", None) or "https://huggingface.co")


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "error"))


# --- push ------------------------------------------------------------------------------------------------------------
# Every failure of a push after OUT was written ends with this: OUT is kept and one command pushes it later.
PUSH_LATER = "OUT {out!r} is complete: push it later with `{command}`"


@dataclass
class PushPlan:
    """What a push sends: computed once by `plan_push`, printed by `--dry-run`, executed by `push`."""

    folder: Path
    repo_id: str
    private: bool
    files: list[str]  # POSIX paths relative to `folder`, exactly the files the upload sends
    commit_message: str
    card: str | None = None  # README.md rewritten so its serving commands name `repo_id` (None: already does)
    url: str = ""

    @property
    def later(self) -> str:
        """The one command that pushes `folder` later (what every failure prints)."""
        import shlex

        return f"rope-extend push {shlex.quote(str(self.folder))} {self.repo_id}" + (" --private" if self.private else "")

    def where(self) -> str:
        return "; " + PUSH_LATER.format(out=str(self.folder), command=self.later)

    def dry_run_lines(self) -> list[str]:
        """The dry run's report: the repo, its visibility, the commit message and every file, one per line."""
        lines = [
            f"dry run: would push {len(self.files)} files to {self.repo_id} "
            f"({'private' if self.private else 'public'}; an existing repo keeps its visibility)",
            f"commit message: {self.commit_message}",
        ]
        if self.card is not None:
            lines.append(f"README.md: its serving commands would be rewritten to name {self.repo_id}")
        return lines + [f"  + {name}" for name in self.files]


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id or ""):
        raise CheckpointError(f"--push-to-hub expects a repo id like 'user/model-name', got {repo_id!r}")
    return repo_id


def upload_files(folder: Path) -> list[str]:
    """The files a push uploads: every regular file under `folder` (hard-linked weights included) except hidden ones
    (`.git*`, `.cache/`, the demo cache's `.complete`), which huggingface_hub's `upload_folder` would skip anyway.

    The one list both `--dry-run` and the upload use: `push` hands it to `upload_folder` as exact patterns."""
    names = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            names.append(rel.as_posix())
    return names


def plan_push(folder: str | os.PathLike, repo_id: str, private: bool) -> PushPlan:
    """Check OUT and the repo id and compute the upload (no network, nothing written)."""
    check_repo_id(repo_id)
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{str(folder)!r} is not a checkpoint folder (no config.json); give the OUT folder "
                              "that `rope-extend patch` or `train` wrote")
    folder = folder.resolve()
    spec = folder / "rope_extend.yaml"
    what = " ".join(spec.read_text().split()) if spec.is_file() else f"upload {folder.name}"
    return PushPlan(
        folder=folder,
        repo_id=repo_id,
        private=private,
        files=upload_files(folder),
        commit_message=("rope-extend: " + what)[:1000],
        card=_card_for_repo(folder, repo_id),
    )


def _card_for_repo(folder: Path, repo_id: str) -> str | None:
    """OUT's model card with its serving commands naming `repo_id` (the path users of the pushed model have), or
    None when it already does, or when OUT was not written by rope-extend (its card is left as it is)."""
    card = folder / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(encoding="utf-8")
    start = text.find(SERVING_HEADING)
    if start < 0:
        return None
    from .serving import serving_hints

    plan = _plan_of(folder)
    if plan is None:
        return None
    serving, _ = serving_hints(plan, repo_id)
    body_start = start + len(SERVING_HEADING)
    end = text.find("\n## ", body_start)
    end = len(text) if end < 0 else end
    new = text[:body_start] + serving.strip() + "\n" + text[end:]
    return None if new == text else new


SERVING_HEADING = "\n## Serving\n\n"


def _plan_of(folder: Path):
    """The PatchPlan a rope-extend checkpoint was written with (from its config's marker), or None."""
    from . import compat
    from .files import load_config
    from .plan import plan_patch
    from .spec import RopeSpec

    config = compat.text_config(load_config(folder))
    marker = compat.read_marker(config)
    if not marker or not isinstance(marker.get("spec"), dict):
        return None
    return plan_patch(config, RopeSpec(**marker["spec"]))


def serve_command_for(folder: Path, repo_id: str) -> str | None:
    """The serve line for the pushed model (`serving.serve_command` naming the repo id), or None for a folder
    rope-extend did not write."""
    from .serving import serve_command

    plan = _plan_of(folder)
    return None if plan is None else serve_command(plan, repo_id)


def hub_token(where: str = "") -> str:
    """HF_TOKEN, else huggingface_hub's stored token (`hf auth login`); a missing one is refused here, before any
    network call. The token goes to huggingface_hub only: never printed, logged or written."""
    from huggingface_hub import get_token

    token = os.environ.get("HF_TOKEN") or get_token()
    if not token:
        raise CheckpointError(
            "no Hugging Face token: set HF_TOKEN to a token with write access or log in once with `hf auth login`"
            + where
        )
    return token


def push(plan: PushPlan) -> str:
    """Create the repo (`exist_ok`: a later push adds a commit) and upload exactly `plan.files`; returns the repo URL.

    Checks the token, then the Hub's reachability (one TCP connection), and only then rewrites OUT's card for the
    repo and sends anything. Every failure is one CheckpointError line ending with the push-later command; OUT is
    never removed or left half-written."""
    import glob

    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    token = hub_token(plan.where())
    if not hub_reachable():
        raise CheckpointError(f"cannot push to {plan.repo_id!r}: the Hub ({_endpoint()}) is unreachable{plan.where()}")
    if plan.card is not None:
        card = plan.folder / "README.md"
        tmp = card.with_name(f".README.md.rope-extend-{os.getpid()}")
        tmp.write_text(plan.card, encoding="utf-8")
        os.replace(tmp, card)  # a fresh file: never written through a hard link
    api = HfApi(token=token)
    try:
        repo = api.create_repo(repo_id=plan.repo_id, private=plan.private, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=plan.repo_id,
            folder_path=str(plan.folder),
            commit_message=plan.commit_message,
            allow_patterns=[glob.escape(name) for name in plan.files],
        )
    except HfHubHTTPError as exc:
        status = _status(exc)
        why = "; check that the token has write access to it" if status in ("401", "403") else ""
        raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP {status}{why}{plan.where()}") from None
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as exc:  # connection errors of whichever HTTP client huggingface_hub uses
        raise CheckpointError(f"pushing to {plan.repo_id!r} failed ({type(exc).__name__}){plan.where()}") from None
    plan.url = str(getattr(repo, "url", None) or f"{_endpoint()}/{plan.repo_id}")
    return plan.url
