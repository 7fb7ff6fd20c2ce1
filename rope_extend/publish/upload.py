"""Sending a push plan's files to the Hub: the large files as LFS objects first, one at a time, then one commit that
names every file.

**Why one final commit.** The repository shows a checkpoint only through a commit. Until the last request of a push,
the weights are LFS objects in the repository's storage that no commit names, which the Hub does not show; the
commit that adds the card saying what was verified adds every weight with it. So a repo never holds a partial
checkpoint as the verified one, whatever interrupts the push (the Hub's advice, files under 20 GB and under 100 files
per commit, is about what one commit *carries*: once the objects are uploaded, the commit carries pointers).

**Resuming.** Nothing is kept on this machine and nothing in OUT is written: the LFS batch API answers, for each
object (named by the sha256 of its bytes), whether the repository's storage already holds it, so rerunning the same
push sends only the objects that did not arrive and says so before it starts. An object is the unit of resumption:
a multipart upload interrupted between two runs starts that file again; within a run, a failed part is sent again,
not the file.

**Integrity.** Objects are addressed by the sha256 of the bytes read now: bytes sent before an interruption can only
be reused for a file whose bytes are the same, never mixed into another. A file the record vouches for by its sha256
is checked against it when hashed (a file changed between `select` and the upload is refused) and while it is sent.

**One retry policy** (`RETRY`): every request of a push (creating the repo, asking which files are large, asking
which objects the Hub holds, each part of each large file, completing it, the commit) is tried at most
`Retry.attempts` (5) times in all when it fails with one of `RETRY_STATUSES` (408, 429, 500, 502, 503, 504) or a
dropped connection or timeout, waiting what `Retry-After` says (at most 600 s), else 1, 2, 4, 8 s; each retry is one
progress line naming the request (`HTTP 503 on model-00002-of-00004.safetensors, part 3: retrying in 2 s (try 3 of
5)`), never its URL (a part's URL on the Hub is a presigned storage URL: a credential while it lasts). Any other
status (401, 403, 404...) ends the push at once. A persistent 503 is 5 tries, 15 s of waiting, then one error line.

**Why rope-extend sends the Hub's requests itself.** huggingface_hub's public upload calls (`HfApi.preupload_lfs_files`,
`create_commit`, `upload_folder`) send each part, the batch and the preupload request through a retry loop of their
own (`http_backoff`: 6 tries, waits up to 8 s, on 0.36 other statuses than on 2.x), which no public argument turns
off, logging every retry with the request's whole URL; wrapped in a caller's retries that loop multiplies them (a
persistent 503 made 5 x 6 = 30 tries in ~135 s). The public call that is missing: an LFS upload whose requests follow
the caller's retry policy and report its progress. So a push sends the Hub's documented requests itself (`HubClient`:
the preupload endpoint, git-lfs's batch API, the multipart parts and their completion, the commit endpoint), each one
try through huggingface_hub's public `utils.http_backoff` with its retries off (`max_retries=0`: huggingface_hub's
HTTP session, proxies, user agent and `HfHubHTTPError`s), the auth headers from `utils.build_hf_headers`, the repo
from `HfApi.create_repo`. No private name of huggingface_hub is used; tests/test_hub_push.py runs the whole push
against tests/hubserver.py on both majors (0.36 on the transformers 4.x line, 2.x on 5.x).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import CheckpointError
from ..record import CARD, SPEC_FILE, sha256
from ..terminal import shown_name

if TYPE_CHECKING:
    from .plan import PushPlan

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})  # the statuses a retry can fix; every other fails at once
LFS_HEADERS = {"Accept": "application/vnd.git-lfs+json", "Content-Type": "application/vnd.git-lfs+json"}
BATCH_FILES = 100  # objects per LFS batch request
PREUPLOAD_FILES = 256  # files per preupload request
SAMPLE_BYTES = 512  # the start of a file the preupload endpoint reads to decide regular or LFS
READ = 1 << 20  # bytes per read of a file being hashed or sent
DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class Retry:
    """How often and how long a request is retried: `attempts` tries in all, waiting `Retry-After` (at most
    `max_retry_after` s) or `first_wait`, doubled each time up to `max_wait`."""

    attempts: int = 5
    first_wait: float = 1.0
    max_wait: float = 30.0
    max_retry_after: float = 600.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return min(self.first_wait * 2 ** (attempt - 1), self.max_wait)


RETRY = Retry()


def sleep(seconds: float) -> None:
    """How a retry waits (tests replace it to record the waits instead)."""
    time.sleep(seconds)


def retryable(exc: BaseException) -> bool:
    """Whether a retry can fix the failure `exc` of a request: one of `RETRY_STATUSES`, or a network error."""
    status = status_of(exc)
    return status in RETRY_STATUSES if status is not None else network_error(exc)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a huggingface_hub error (None for another failure)."""
    from huggingface_hub.errors import HfHubHTTPError

    if not isinstance(exc, HfHubHTTPError):
        return None
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def network_error(exc: BaseException) -> bool:
    """A connection error or a timeout (requests' are OSErrors; httpx's derive from its TransportError)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, (OSError, TimeoutError)) or bool(names & {"TransportError", "TimeoutException"})


def without_urls(text: str) -> str:
    """`text` with every URL's query string (a presigned URL's signature) and every `url: /path?...` query removed."""
    return re.sub(r"\?[^\s'\")\]]*", "", text)


@dataclass
class Item:
    """One file of the push: its name in the repo, size, whether it travels as an LFS object, and what happened."""

    name: str
    size: int
    lfs: bool = False
    present: bool = False  # the Hub held the object before this run
    done: int = 0  # bytes of it on the Hub (this run's position in the file while it is sent)
    uploaded: bool = False  # fully on the Hub (present or sent now)
    ignored: bool = False  # the repo's .gitignore leaves it out: neither sent nor committed


@dataclass
class Transfer:
    """The state of one push, for progress and for the line an interruption prints."""

    items: list[Item] = field(default_factory=list)
    sent: int = 0  # bytes read to be sent in this run, retries included
    committed: bool = False
    url: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def total(self) -> int:
        return sum(item.size for item in self.items)

    @property
    def done(self) -> int:
        """Bytes on the Hub or read for sending (the progress shown)."""
        return sum(item.size if item.uploaded else item.done for item in self.items)

    @property
    def on_hub(self) -> int:
        """Bytes of the large files whose objects the Hub holds."""
        return sum(item.size for item in self.items if item.lfs and item.uploaded)

    @property
    def already(self) -> int:
        return sum(item.size for item in self.items if item.present)

    @property
    def ignored(self) -> list[str]:
        return [item.name for item in self.items if item.ignored]


class Report(Protocol):
    """What a push says while it runs (the CLI prints it; tests may record it)."""

    def hashing(self, item: Item) -> None: ...
    def planned(self, transfer: Transfer) -> None: ...
    def start(self, item: Item, transfer: Transfer) -> None: ...
    def advance(self, item: Item, transfer: Transfer) -> None: ...
    def finish(self, item: Item, transfer: Transfer) -> None: ...
    def retry(self, what: str, why: str, wait: float, attempt: int, attempts: int) -> None: ...


class Silent:
    def hashing(self, item): pass
    def planned(self, transfer): pass
    def start(self, item, transfer): pass
    def advance(self, item, transfer): pass
    def finish(self, item, transfer): pass
    def retry(self, what, why, wait, attempt, attempts): pass


class PushInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a push: `message` says what is on the Hub and the command that resumes."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# --- what is sent ----------------------------------------------------------------------------------------------------
@dataclass
class _File:
    """A file of the push: its bytes (`data`, a card or record sent from memory) or `path`, their sha256 (the LFS
    object id) and the sample the preupload endpoint reads."""

    item: Item
    sha256: str
    sample: bytes
    path: Path | None = None
    data: bytes | None = None

    def content(self) -> bytes:
        """A small file's bytes for the commit, checked against the sha256 they were announced with."""
        data = self.data if self.data is not None else self.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise CheckpointError(f"{shown_name(self.item.name)} changed while it was being sent (its bytes no longer "
                                  "hash to what was read before); nothing was committed")
        return data


class _Reader:
    """A large file of OUT as it is sent: counts the bytes read (progress), and hashes the bytes read in order from
    the start, so that what was sent can be checked against the object's sha256."""

    def __init__(self, path: Path, on_read: Callable[[int, int], None]):
        self._file = open(path, "rb")  # closed by close()
        self._on_read = on_read
        self.digest = hashlib.sha256()
        self.hashed = 0  # bytes [0, hashed) fed to `digest`

    def read_at(self, offset: int, size: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(size)
        if offset <= self.hashed < offset + len(data):
            self.digest.update(memoryview(data)[self.hashed - offset:])
            self.hashed = offset + len(data)
        if data:
            self._on_read(offset + len(data), len(data))
        return data

    def close(self) -> None:
        self._file.close()


class _Part:
    """Bytes [start, start + size) of a `_Reader` as a request body, streamed: `read` for requests (huggingface_hub
    0.x), iteration for httpx (1.x on); its length is sent as Content-Length."""

    def __init__(self, reader: _Reader, start: int, size: int):
        self.reader, self.start, self.size, self.position = reader, start, size, 0

    def __len__(self) -> int:
        return self.size

    def read(self, count: int | None = -1) -> bytes:
        left = self.size - self.position
        count = left if count is None or count < 0 else min(count, left)
        if count <= 0:
            return b""
        data = self.reader.read_at(self.start + self.position, count)
        self.position += len(data)
        return data

    def __iter__(self):
        while chunk := self.read(READ):
            yield chunk


def _body_keyword() -> str:
    """The keyword huggingface_hub's HTTP client takes a raw request body by: requests' `data` (huggingface_hub 0.x),
    httpx's `content` (1.x on, where `data=` is for forms)."""
    import huggingface_hub

    return "data" if huggingface_hub.__version__.split(".")[0] == "0" else "content"


# --- the requests ----------------------------------------------------------------------------------------------------
@dataclass
class HubClient:
    """The Hub's upload requests for one model repo (the module docstring says why rope-extend sends them), each
    sent once: `_retrying` decides about retries. Errors are huggingface_hub's `HfHubHTTPError` (status, the Hub's
    message) or the HTTP client's own network errors."""

    repo_id: str
    token: str
    endpoint: str
    revision: str = "main"

    def request(self, method: str, url: str, *, auth: bool = True, headers: dict | None = None, body=None,
                json_body=None):
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

        kwargs = {"headers": {**(build_hf_headers(token=self.token) if auth else {}), **(headers or {})}}
        if body is not None:
            kwargs[_body_keyword()] = body
        if json_body is not None:
            kwargs["json"] = json_body
        response = http_backoff(method, url, max_retries=0, retry_on_exceptions=(), retry_on_status_codes=(),
                                **kwargs)  # one try: retries are the push's (RETRY)
        hf_raise_for_status(response)
        return response

    def hub_url(self, href: str) -> str:
        """An URL the Hub answered, on this client's endpoint (a mirror set by HF_ENDPOINT gets its own)."""
        if self.endpoint.rstrip("/") != DEFAULT_ENDPOINT and href.startswith(DEFAULT_ENDPOINT):
            return self.endpoint.rstrip("/") + href[len(DEFAULT_ENDPOINT):]
        return href

    def upload_modes(self, files: list[_File]) -> dict[str, tuple[str, bool]]:
        """name -> (the Hub's upload mode, "lfs" or "regular"; whether the repo's .gitignore leaves it out)."""
        payload = {"files": [{"path": f.item.name, "sample": base64.b64encode(f.sample).decode("ascii"),
                              "size": f.item.size} for f in files]}
        answer = self.request("POST", f"{self.endpoint}/api/models/{self.repo_id}/preupload/{self.revision}",
                              json_body=payload).json()
        return {entry["path"]: (entry["uploadMode"], bool(entry.get("shouldIgnore"))) for entry in answer["files"]}

    def batch(self, files: list[_File]) -> dict[str, dict]:
        """sha256 -> the LFS batch API's answer for each object: no `actions` when the store holds it already, else
        the upload to make (fresh URLs on every call: they expire)."""
        payload = {"operation": "upload", "transfers": ["basic", "multipart"], "hash_algo": "sha256",
                   "ref": {"name": self.revision},
                   "objects": [{"oid": f.sha256, "size": f.item.size} for f in files]}
        answer = self.request("POST", f"{self.endpoint}/{self.repo_id}.git/info/lfs/objects/batch",
                              headers=LFS_HEADERS, json_body=payload).json()
        refused = [obj for obj in answer.get("objects", []) if obj.get("error")]
        if refused:
            raise CheckpointError("the Hub's LFS batch API refused " + ", ".join(
                f"{obj['oid'][:12]} ({obj['error'].get('message', '?')})" for obj in refused[:4]))
        return {obj["oid"]: obj for obj in answer.get("objects", [])}

    def put(self, url: str, body: _Part):
        """One part (or a whole small object) to its presigned URL: no auth header leaves for the storage."""
        return self.request("PUT", url, auth=False, headers={"Content-Length": str(len(body))}, body=body)

    def complete(self, url: str, oid: str, etags: list[str]) -> None:
        parts = [{"partNumber": number, "etag": etag} for number, etag in enumerate(etags, start=1)]
        self.request("POST", self.hub_url(url), auth=False, headers=LFS_HEADERS,
                     json_body={"oid": oid, "parts": parts})

    def verify(self, action: dict, oid: str, size: int) -> None:
        self.request("POST", self.hub_url(action["href"]), headers=action.get("header") or {},
                     json_body={"oid": oid, "size": size})

    def commit(self, message: str, files: list[_File]) -> dict:
        """One commit of every file: a small one's bytes, a large one's object (which the store must hold)."""
        lines = [{"key": "header", "value": {"summary": message, "description": ""}}]
        for f in files:
            if f.item.ignored:
                continue
            if f.item.lfs:
                lines.append({"key": "lfsFile", "value": {"path": f.item.name, "algo": "sha256", "oid": f.sha256,
                                                          "size": f.item.size}})
            else:
                lines.append({"key": "file", "value": {"content": base64.b64encode(f.content()).decode("ascii"),
                                                       "path": f.item.name, "encoding": "base64"}})
        body = b"".join(json.dumps(line).encode("utf-8") + b"\n" for line in lines)
        return self.request("POST", f"{self.endpoint}/api/models/{self.repo_id}/commit/{self.revision}",
                            headers={"Content-Type": "application/x-ndjson"}, body=body).json()


# --- the push --------------------------------------------------------------------------------------------------------
def send(plan: PushPlan, token: str, report: Report | None = None, retry: Retry | None = None) -> Transfer:
    """Create the repo, upload `plan`'s large files as LFS objects (those the Hub holds already are not sent), then
    commit every file in one commit. Raises huggingface_hub's errors (`push.push` words them) and `PushInterrupted`."""
    from huggingface_hub import HfApi, constants

    report, retry = report or Silent(), retry or RETRY
    transfer = Transfer()
    api = HfApi(token=token)
    client = HubClient(plan.repo_id, token, str(api.endpoint or constants.ENDPOINT).rstrip("/"))
    try:
        repo = _retrying(lambda: api.create_repo(repo_id=plan.repo_id, private=plan.private, exist_ok=True,
                                                 repo_type="model"), "creating the repo", retry, report)
        transfer.url = str(getattr(repo, "url", None) or "")
        files = _files(plan, transfer, report)
        _ask(client, files, retry, report)
        report.planned(transfer)
        for f in files:
            if f.item.lfs and not f.item.uploaded:
                _send_object(client, f, transfer, retry, report)
        _retrying(lambda: client.commit(plan.commit_message, files), "the commit", retry, report)
        transfer.committed = True
        return transfer
    except KeyboardInterrupt:
        raise PushInterrupted(_interrupted(plan, transfer)) from None


def _files(plan: PushPlan, transfer: Transfer, report: Report) -> list[_File]:
    """Every file of `plan`, hashed (a file the record vouches for must hash to its recorded sha256)."""
    rendered = {CARD: plan.card, SPEC_FILE: plan.record_text}  # sent from memory: OUT is never written
    files = []
    for entry in plan.selection.sent:
        data = rendered.get(entry.name)
        if data is not None:
            item = Item(entry.name, len(data))
            files.append(_File(item, hashlib.sha256(data).hexdigest(), data[:SAMPLE_BYTES], data=data))
        else:
            item = Item(entry.name, os.stat(entry.path).st_size)
            report.hashing(item)
            digest = sha256(entry.path)
            _check_recorded(plan, entry.name, digest)
            with open(entry.path, "rb") as handle:
                sample = handle.read(SAMPLE_BYTES)
            files.append(_File(item, digest, sample, path=entry.path))
        transfer.items.append(item)
    return files


def _ask(client: HubClient, files: list[_File], retry: Retry, report: Report) -> None:
    """Which files are large (the preupload endpoint: the Hub's rule), and which of their objects the Hub holds."""
    for start in range(0, len(files), PREUPLOAD_FILES):
        chunk = files[start:start + PREUPLOAD_FILES]
        modes = _retrying(lambda chunk=chunk: client.upload_modes(chunk), "asking which files are large", retry,
                          report)
        for f in chunk:
            mode, ignored = modes.get(f.item.name, ("regular", False))
            f.item.lfs = mode == "lfs" and f.item.size > 0  # an empty file cannot be an LFS object
            f.item.ignored = ignored
    large = [f for f in files if f.item.lfs and not f.item.ignored]
    for start in range(0, len(large), BATCH_FILES):
        chunk = large[start:start + BATCH_FILES]
        answers = _retrying(lambda chunk=chunk: client.batch(chunk), "asking which files the Hub holds", retry,
                            report)
        for f in chunk:
            if answers.get(f.sha256, {}).get("actions") is None:
                f.item.present = f.item.uploaded = True


def _send_object(client: HubClient, f: _File, transfer: Transfer, retry: Retry, report: Report) -> None:
    """One large file as an LFS object: in the parts the Hub asks for (each retried alone), then completed, then
    checked against the sha256 it was announced with."""
    item, name = f.item, shown_name(f.item.name)
    report.start(item, transfer)
    action = _retrying(lambda: client.batch([f]).get(f.sha256, {}), f"asking where to send {name}", retry, report)
    actions = action.get("actions") or {}
    if "upload" not in actions:  # the store got it meanwhile
        item.uploaded = True
        item.done = item.size
        report.finish(item, transfer)
        return
    upload = actions["upload"]
    header = upload.get("header") or {}
    reader = _Reader(f.path, _progress(item, transfer, report))
    try:
        if header.get("chunk_size") is not None:
            chunk = int(header["chunk_size"])
            urls = [url for _, url in sorted((int(key), url) for key, url in header.items() if key.isdigit())]
            if len(urls) != math.ceil(item.size / chunk):
                raise CheckpointError(f"the Hub answered {len(urls)} part URLs for {name}, which has "
                                      f"{math.ceil(item.size / chunk)} parts of {chunk} bytes; nothing was committed")
            etags = []
            for number, url in enumerate(urls, start=1):
                start = (number - 1) * chunk
                response = _retrying(lambda url=url, start=start: client.put(
                    url, _Part(reader, start, min(chunk, item.size - start))), f"{name}, part {number}", retry, report)
                etags.append(response.headers.get("etag") or "")
            _retrying(lambda: client.complete(upload["href"], f.sha256, etags), f"completing {name}", retry, report)
        else:
            _retrying(lambda: client.put(client.hub_url(upload["href"]), _Part(reader, 0, item.size)), name, retry,
                      report)
        if actions.get("verify") is not None:
            _retrying(lambda: client.verify(actions["verify"], f.sha256, item.size), f"verifying {name}", retry,
                      report)
        if reader.hashed == item.size and reader.digest.hexdigest() != f.sha256:
            raise CheckpointError(f"{name} changed while it was being sent (its bytes no longer hash to what was "
                                  "read before); nothing was committed")
    finally:
        reader.close()
    item.uploaded = True
    item.done = item.size
    report.finish(item, transfer)


def _progress(item: Item, transfer: Transfer, report: Report) -> Callable[[int, int], None]:
    def on_read(position: int, count: int) -> None:
        item.done = max(item.done, min(position, item.size))
        transfer.sent += count
        report.advance(item, transfer)

    return on_read


def _check_recorded(plan: PushPlan, name: str, sha: str) -> None:
    """A file the record vouches for by its sha256 goes up only with those bytes."""
    record = plan.selection.record
    entry = record.entries.get(name) if record is not None else None
    if name == CARD and plan.selection.card_edited:
        return  # the user's card, sent as written
    if entry is not None and entry.sha256 is not None and name != SPEC_FILE and entry.sha256 != sha:
        raise CheckpointError(f"{shown_name(name)} of OUT changed since rope-extend verified it (its sha256 is not the "
                              f"recorded one), so nothing was committed; `rope-extend verify {plan.folder}` "
                              "re-verifies OUT as it is now")


def _retrying(call: Callable, what: str, retry: Retry, report: Report):
    """`call()`, retried as the module docstring says (`RETRY`); the last failure is raised as it came."""
    for attempt in range(1, retry.attempts + 1):
        try:
            return call()
        except Exception as exc:
            if not retryable(exc) or attempt == retry.attempts:
                raise
            status = status_of(exc)
            response = getattr(exc, "response", None) if status is not None else None
            wait = retry.wait(attempt, _retry_after(response))
            why = f"HTTP {status}" if status is not None else type(exc).__name__
        report.retry(what, why, wait, attempt, retry.attempts)
        sleep(wait)
    raise AssertionError("unreachable")


def _retry_after(response) -> float | None:
    """The `Retry-After` header in seconds (a number or an HTTP date), or None."""
    value = (getattr(response, "headers", None) or {}).get("Retry-After")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(when.timestamp() - time.time(), 0.0)


def size_text(count: float) -> str:
    """'512 B', '1.5 MB', '140.0 GB' (decimal units, as the Hub shows sizes)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} TB"


def _interrupted(plan: PushPlan, transfer: Transfer) -> str:
    """The interruption's line: what the Hub holds, that nothing was committed, the command that resumes."""
    if transfer.committed:
        return f"interrupted after the commit: {plan.repo_id} holds the pushed checkpoint"
    done = sum(1 for item in transfer.items if item.lfs and item.uploaded)
    large = sum(1 for item in transfer.items if item.lfs)
    held = (f"{done} of {large} large files ({size_text(transfer.on_hub)} of "
            f"{size_text(sum(item.size for item in transfer.items if item.lfs))}) are on the Hub as objects no "
            "commit names yet" if large else "nothing was sent in this run")
    return (f"push interrupted: {held}; nothing was committed, so {plan.repo_id} shows no part of this checkpoint, "
            f"and OUT is as it was; `{plan.later}` resumes, sending only what the Hub does not hold")
