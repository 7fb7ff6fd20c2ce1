"""The Hugging Face Hub as a source: resolve SOURCE (a local folder, an alias or a Hub id) to a local folder, name
its base model, and check a repo id.

Resolution goes through huggingface_hub's cache, so `HF_HUB_OFFLINE=1`, `HF_HUB_CACHE`, `--revision` and `HF_TOKEN`
behave as everywhere else. The token is passed to huggingface_hub and never printed, logged or written. Publishing
to the Hub (what a push sends, its plan, the transfer) is `rope_extend.publish`'s.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import CheckpointError

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
        where = f"and the Hub ({endpoint()}) is unreachable" if unreachable else "offline (HF_HUB_OFFLINE=1)"
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


def endpoint() -> str:
    """The Hub's address (`HF_ENDPOINT`, else huggingface.co)."""
    from huggingface_hub import constants

    return str(getattr(constants, "ENDPOINT", None) or "https://huggingface.co")


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "error"))


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
