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
a multipart upload interrupted between two runs starts that file again; within a run, huggingface_hub retries a
failed part, not the file.

**Integrity.** Objects are addressed by the sha256 of the bytes read now: bytes sent before an interruption can only
be reused for a file whose bytes are the same, never mixed into another. A file the record vouches for by its sha256
is checked against it when hashed (a file changed between `select` and the upload is refused) and while it is sent.

**Faults.** Every request (create the repo, upload modes, the batch, each file, the commit) is retried on 408, 429
and 5xx and on a dropped connection, waiting `Retry-After` when the Hub says it, else 1, 2, 4... s, at most
`Retry.attempts` times; other statuses (401, 403, 404...) fail at once. huggingface_hub's own `http_backoff` also
retries each part of a file (honouring `Retry-After` too).

huggingface_hub's pieces used: `CommitOperationAdd` over a file object (`_Reader`: progress and the streaming check;
a file object also keeps the upload on the LFS protocol, whose batch API answers what exists), `_fetch_upload_modes`
(the preupload endpoint: regular or LFS), `lfs.post_lfs_batch_info`, `lfs.lfs_upload` and `create_commit` with the
operations marked uploaded.
"""

from __future__ import annotations

import email.utils
import hashlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .errors import CheckpointError

if TYPE_CHECKING:
    from .hub import PushPlan

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


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


@dataclass
class Item:
    """One file of the push: its name in the repo, size, whether it travels as an LFS object, and what happened."""

    name: str
    size: int
    lfs: bool = False
    present: bool = False  # the Hub held the object before this run
    done: int = 0  # bytes of it on the Hub (this run's position in the file while it is sent)
    uploaded: bool = False  # fully on the Hub (present or sent now)


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


class _Reader(io.BufferedIOBase):
    """A file of OUT as huggingface_hub reads it: counts the bytes read while `counting` (progress), and hashes the
    bytes read in order from the start, so that what was sent can be checked against the object's sha256."""

    def __init__(self, path: Path, on_read: Callable[[int, int], None]):
        super().__init__()
        self._file = open(path, "rb")  # closed by close()
        self._on_read = on_read
        self.counting = False
        self.digest = hashlib.sha256()
        self.hashed = 0  # bytes [0, hashed) fed to `digest`

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def read(self, size: int | None = -1) -> bytes:
        start = self._file.tell()
        data = self._file.read(-1 if size is None else size)
        if self.counting and data:
            if start <= self.hashed < start + len(data):
                self.digest.update(memoryview(data)[self.hashed - start:])
                self.hashed = start + len(data)
            self._on_read(start + len(data), len(data))
        return data

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def send(plan: PushPlan, token: str, report: Report | None = None, retry: Retry | None = None) -> Transfer:
    """Create the repo, upload `plan`'s large files as LFS objects (those the Hub holds already are not sent), then
    commit every file in one commit. Raises huggingface_hub's errors (hub.push words them) and `PushInterrupted`."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from .record import CARD, SPEC_FILE

    report, retry = report or Silent(), retry or RETRY
    transfer = Transfer()
    api = HfApi(token=token)
    readers: list[_Reader] = []
    try:
        repo = _retrying(lambda: api.create_repo(repo_id=plan.repo_id, private=plan.private, exist_ok=True,
                                                 repo_type="model"), "creating the repo", retry, report)
        transfer.url = str(getattr(repo, "url", None) or "")
        rendered = {CARD: plan.card, SPEC_FILE: plan.record_text}  # sent from memory: OUT is never written
        operations = []
        for entry in plan.selection.sent:
            data = rendered.get(entry.name)
            item = Item(entry.name, len(data) if data is not None else os.stat(entry.path).st_size)
            transfer.items.append(item)
            if data is not None:
                operations.append(CommitOperationAdd(path_in_repo=entry.name, path_or_fileobj=data))
                continue
            report.hashing(item)
            reader = _Reader(entry.path, _progress(item, transfer, report))
            readers.append(reader)
            operation = CommitOperationAdd(path_in_repo=entry.name, path_or_fileobj=reader)  # hashes it
            _check_recorded(plan, entry.name, operation.upload_info.sha256.hex())
            operations.append(operation)
        _upload(api, plan, operations, transfer, report, retry)
        _retrying(lambda: api.create_commit(repo_id=plan.repo_id, operations=operations,
                                            commit_message=plan.commit_message, repo_type="model"),
                  "the commit", retry, report)
        transfer.committed = True
        return transfer
    except KeyboardInterrupt:
        raise PushInterrupted(_interrupted(plan, transfer)) from None
    finally:
        for reader in readers:
            reader.close()


def _upload(api, plan: PushPlan, operations: list, transfer: Transfer, report: Report, retry: Retry) -> None:
    """Ask the Hub which files are LFS and which objects it holds; send the others one at a time."""
    from huggingface_hub import constants
    from huggingface_hub._commit_api import _fetch_upload_modes
    from huggingface_hub.lfs import lfs_upload, post_lfs_batch_info

    headers = api._build_hf_headers(token=api.token)
    endpoint = api.endpoint or constants.ENDPOINT
    _retrying(lambda: _fetch_upload_modes(additions=operations, repo_type="model", repo_id=plan.repo_id,
                                          headers=headers, revision=constants.DEFAULT_REVISION, endpoint=endpoint),
              "asking which files are large", retry, report)
    by_name = {item.name: item for item in transfer.items}
    large = [op for op in operations if op._upload_mode == "lfs" and not op._should_ignore]

    def batch(ops):
        return _retrying(lambda: post_lfs_batch_info(
            upload_infos=[op.upload_info for op in ops], token=None, repo_type="model", repo_id=plan.repo_id,
            revision=constants.DEFAULT_REVISION, endpoint=endpoint, headers=headers, transfers=["basic", "multipart"],
        ), "asking which files the Hub holds", retry, report)

    actions = {}
    for start in range(0, len(large), 100):
        found, errors = batch(large[start:start + 100])[:2]
        if errors:
            raise CheckpointError("the Hub's LFS batch API refused " + ", ".join(
                f"{e.get('oid', '?')[:12]} ({e.get('error', {}).get('message', '?')})" for e in errors[:4]))
        actions.update({action["oid"]: action for action in found})
    for op in large:
        item = by_name[op.path_in_repo]
        item.lfs = True
        if actions.get(op.upload_info.sha256.hex(), {}).get("actions") is None:
            item.present = item.uploaded = True
            op._is_uploaded = True
    report.planned(transfer)
    for op in large:
        if op._is_uploaded:
            continue
        item = by_name[op.path_in_repo]
        reader = op.path_or_fileobj
        report.start(item, transfer)

        def one_file(op=op, reader=reader, item=item):
            action = batch([op])[0][0]  # fresh URLs on every try (they expire)
            reader.seek(0)  # a failed try may have left it anywhere
            reader.counting = True
            try:
                lfs_upload(operation=op, lfs_batch_action=action, headers=headers, endpoint=endpoint)
            finally:
                reader.counting = False
            if reader.hashed == item.size and reader.digest.hexdigest() != op.upload_info.sha256.hex():
                raise CheckpointError(f"{_shown(item.name)} changed while it was being sent (its bytes no longer "
                                      "hash to what was read before); nothing was committed")

        _retrying(one_file, _shown(item.name), retry, report)
        op._is_uploaded = item.uploaded = True
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
    from .record import CARD, SPEC_FILE

    record = plan.selection.record
    entry = record.entries.get(name) if record is not None else None
    if name == CARD and plan.selection.card_edited:
        return  # the user's card, sent as written
    if entry is not None and entry.sha256 is not None and name != SPEC_FILE and entry.sha256 != sha:
        raise CheckpointError(f"{_shown(name)} of OUT changed since rope-extend verified it (its sha256 is not the "
                              f"recorded one), so nothing was committed; `rope-extend verify {plan.folder}` "
                              "re-verifies OUT as it is now")


def _retrying(call: Callable, what: str, retry: Retry, report: Report):
    """`call()`, retried as the module docstring says; the last failure is raised as it came."""
    from huggingface_hub.errors import HfHubHTTPError


    for attempt in range(1, retry.attempts + 1):
        try:
            return call()
        except HfHubHTTPError as exc:
            response = getattr(exc, "response", None)
            status = getattr(response, "status_code", None)
            if status not in RETRY_STATUSES or attempt == retry.attempts:
                raise
            wait, why = retry.wait(attempt, _retry_after(response)), f"HTTP {status}"
        except Exception as exc:
            if not network_error(exc) or attempt == retry.attempts:
                raise
            wait, why = retry.wait(attempt, None), type(exc).__name__
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


def _shown(name: str) -> str:
    from .record import shown_name

    return shown_name(name)


def _interrupted(plan: PushPlan, transfer: Transfer) -> str:
    """The interruption's line: what the Hub holds, that nothing was committed, the command that resumes."""
    if transfer.committed:
        return f"interrupted after the commit: {plan.repo_id} holds the pushed checkpoint"
    done = sum(1 for item in transfer.items if item.lfs and item.uploaded)
    large = sum(1 for item in transfer.items if item.lfs)
    held = (f"{done} of {large} large files ({size_text(transfer.on_hub)} of "
            f"{size_text(sum(item.size for item in transfer.items if item.lfs))}) are on the Hub as objects no commit names yet" if large else "nothing was sent in this run")
    return (f"push interrupted: {held}; nothing was committed, so {plan.repo_id} shows no part of this checkpoint, "
            f"and OUT is as it was; `{plan.later}` resumes, sending only what the Hub does not hold")


def network_error(exc: BaseException) -> bool:
    """A connection error or a timeout (requests' are OSErrors; httpx's derive from its TransportError)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, (OSError, TimeoutError)) or bool(names & {"TransportError", "TimeoutException"})
