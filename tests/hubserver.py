"""A local HTTP server that speaks the part of the Hugging Face Hub API a push uses.

huggingface_hub's `create_repo` and `create_commit` (0.36 on the transformers 4.x line, 2.x on 5.x; `upload_folder`
ends in the same calls) send, and `rope_extend.publish.upload` sends itself (each request once, its own retries), for small
files:

- `POST /api/repos/create` (JSON: name, organization, `private` (0.x) or `visibility` (2.x), type), 409 if it exists;
- `POST /api/validate-yaml` (the README's metadata; 0.x's single-commit path);
- `POST /api/models/{org}/{name}/preupload/{revision}` (JSON: path, size, sample per file): "lfs" for a file of
  at least `lfs_from` bytes or a `.safetensors` (the Hub's rule: large or binary), "regular" otherwise (its bytes
  travel base64 in the commit);
- `POST /{org}/{name}.git/info/lfs/objects/batch` (the LFS batch API): for each object (sha256, size) either
  nothing to do (the store holds it: no `actions`) or a multipart upload of `part_size` parts
  (`PUT /lfs/{oid}/{part}`, each answering an ETag) completed by `POST /lfs/{oid}/complete`, where the server checks
  the sha256 of the parts joined and stores the object;
- `POST /api/models/{org}/{name}/commit/{revision}` (NDJSON: a header line with the commit message, then one line
  per file: `file` with its base64 content, or `lfsFile` naming an object the store must hold).

Everything else is a 404, recorded like the rest, so a test sees any request it did not expect. Writes need an
`Authorization: Bearer <token>` header (401 otherwise). `GET /api/models/{org}/{name}` answers the repo's
visibility. Runs in a thread on 127.0.0.1, port 0 (the OS picks one).

Fault injection: `fail_commit = STATUS` answers every commit with that HTTP status; `fault(Fault(...))` fails the
Nth request whose path contains a text with a status (`Retry-After` optional) or a connection reset, once or from then
on; `cut_after = N` resets the connection of the upload request during which the N-th byte of uploads arrives (read
up to that byte), then clears itself, or, with `interrupt=True`, raises KeyboardInterrupt in the main thread there
(a Ctrl-C at that moment). `received` counts the body bytes of every upload request (parts cut short included).
Objects live in memory (`keep_bytes`) or, for a bench, as their sha256 and size only.
"""

from __future__ import annotations

import _thread
import base64
import hashlib
import json
import math
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = r"(?P<repo>[^/]+/[^/]+)"
PREUPLOAD = re.compile(rf"^/api/models/{REPO}/preupload/(?P<rev>[^/?]+)")
COMMIT = re.compile(rf"^/api/models/{REPO}/commit/(?P<rev>[^/?]+)")
REPO_INFO = re.compile(rf"^/api/models/{REPO}(/revision/(?P<rev>[^/?]+))?/?$")
BATCH = re.compile(rf"^/{REPO}\.git/info/lfs/objects/batch$")
PART = re.compile(r"^/lfs/(?P<repo>[^/]+--[^/]+)/(?P<oid>[0-9a-f]{64})/(?P<part>\d+)$")
COMPLETE = re.compile(r"^/lfs/(?P<repo>[^/]+--[^/]+)/(?P<oid>[0-9a-f]{64})/complete$")
READ = 1 << 16


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes  # empty for uploads (their size is in `received`)


@dataclass
class Fault:
    """Fail the `nth` request (1-based) whose path contains `path`: with `status` (and `retry_after` seconds in the
    Retry-After header) or, `status=None`, by resetting the connection; `times` requests in a row (None: every one
    from then on)."""

    nth: int
    status: int | None = 500
    path: str = ""
    retry_after: float | None = None
    times: int | None = 1
    seen: int = 0
    fired: int = 0

    def fires(self, path: str) -> bool:
        if self.path not in path:
            return False
        self.seen += 1
        if self.seen >= self.nth and (self.times is None or self.fired < self.times):
            self.fired += 1
            return True
        return False


@dataclass
class Repo:
    private: bool
    objects: dict[str, bytes | int] = field(default_factory=dict)  # LFS store: sha256 -> bytes (or size only)
    tree: dict[str, tuple[str, object]] = field(default_factory=dict)  # name -> ("file", bytes) / ("lfs", oid)
    commits: list[str] = field(default_factory=list)  # commit messages (summaries), oldest first
    uploads: dict[str, dict] = field(default_factory=dict)  # oid -> multipart upload in progress

    @property
    def files(self) -> dict[str, bytes]:
        """Every file of the last commit, its bytes (an LFS file's from the store)."""
        return {name: value if kind == "file" else self.objects[value] for name, (kind, value) in self.tree.items()}

    def sha256s(self) -> dict[str, str]:
        return {name: value if kind == "lfs" else hashlib.sha256(value).hexdigest()
                for name, (kind, value) in self.tree.items()}


class _Drop(Exception):
    """The connection was reset on purpose: no answer."""


class HubServer:
    """`with HubServer() as hub:` -> `hub.endpoint` (http://127.0.0.1:PORT), `hub.requests`, `hub.repos`,
    `hub.received` (upload bytes), `hub.fault(...)`, `hub.cut_after`."""

    def __init__(self, part_size: int = 1 << 20, lfs_from: int = 10 << 20, keep_bytes: bool = True):
        self.requests: list[Request] = []
        self.repos: dict[str, Repo] = {}
        self.fail_commit: int | None = None
        self.faults: list[Fault] = []
        self.cut_after: int | None = None
        self.interrupt = False
        self.received = 0
        self.part_size, self.lfs_from, self.keep_bytes = part_size, lfs_from, keep_bytes
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the Hub's

            def log_message(self, *args):  # quiet: pytest shows the assertions
                pass

            def _run(self):
                try:
                    server._handle(self)
                except _Drop:
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_HEAD = _run

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a reset on purpose, or the client gone
                pass

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def fault(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    # --- the API ---------------------------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        path = h.path.split("?", 1)[0]
        upload = h.command == "PUT"
        body = self._receive(h, length) if upload else (h.rfile.read(length) if length else b"")
        with self._lock:
            self.requests.append(Request(h.command, h.path, {k.lower(): v for k, v in h.headers.items()},
                                         b"" if upload else body))
            fault = next((f for f in self.faults if f.fires(path)), None)
        if fault is not None:
            if fault.status is None:
                self._reset(h)
            extra = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            return self._reply(h, fault.status, {"error": f"the test Hub answers {fault.status}"}, extra)
        token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if h.command == "POST" and not token and not COMPLETE.match(path):
            return self._reply(h, 401, {"error": "Invalid credentials in Authorization header"})
        if h.command == "POST" and path == "/api/repos/create":
            return self._create(h, json.loads(body))
        if h.command == "POST" and path == "/api/validate-yaml":
            return self._reply(h, 200, {"errors": [], "warnings": []})
        match = PREUPLOAD.match(path)
        if h.command == "POST" and match:
            return self._preupload(h, match["repo"], json.loads(body))
        match = BATCH.match(path)
        if h.command == "POST" and match:
            return self._batch(h, match["repo"], json.loads(body))
        match = PART.match(path)
        if upload and match:
            return self._part(h, match["repo"].replace("--", "/", 1), match["oid"], int(match["part"]), body)
        match = COMPLETE.match(path)
        if h.command == "POST" and match:
            return self._complete(h, match["repo"].replace("--", "/", 1), match["oid"], json.loads(body))
        match = COMMIT.match(path)
        if h.command == "POST" and match and self.fail_commit:
            return self._reply(h, self.fail_commit, {"error": f"the test Hub answers {self.fail_commit}"})
        if h.command == "POST" and match:
            return self._commit(h, match["repo"], body)
        match = REPO_INFO.match(path)
        if h.command == "GET" and match and match["repo"] in self.repos:
            repo = self.repos[match["repo"]]
            return self._reply(h, 200, {"id": match["repo"], "private": repo.private, "sha": _oid(repo.commits),
                                        "siblings": [{"rfilename": name} for name in sorted(repo.tree)]})
        return self._reply(h, 404, {"error": f"not served by the test Hub: {h.command} {path}"})

    def _receive(self, h, length: int) -> bytes:
        """An upload's body, counted into `received` as it arrives; `cut_after` resets it at that byte."""
        chunks, left = [], length
        while left:
            with self._lock:
                cut = None if self.cut_after is None else self.cut_after - self.received
            want = min(READ, left) if cut is None or cut <= 0 else min(READ, left, cut)
            if cut is not None and cut <= 0:
                with self._lock:
                    self.cut_after = None
                if self.interrupt:
                    self.interrupt = False
                    _thread.interrupt_main()  # Ctrl-C in the pushing (main) thread
                self._reset(h)
            data = h.rfile.read(want)
            if not data:
                raise _Drop()
            with self._lock:
                self.received += len(data)
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)

    @staticmethod
    def _reset(h) -> None:
        """Close the connection with a TCP reset, answering nothing."""
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.connection.close()
        raise _Drop()

    def _create(self, h, payload: dict) -> None:
        repo_id = f"{payload['organization']}/{payload['name']}"
        if repo_id in self.repos:
            return self._reply(h, 409, {"error": "You already created this model repo", "url": self._url(repo_id)})
        private = bool(payload.get("private")) or payload.get("visibility") == "private"
        self.repos[repo_id] = Repo(private=private)
        return self._reply(h, 200, {"url": self._url(repo_id), "name": repo_id, "id": repo_id})

    def _preupload(self, h, repo_id: str, payload: dict) -> None:
        if repo_id not in self.repos:
            return self._reply(h, 404, {"error": "Repository not found"})
        files = [{"path": f["path"], "shouldIgnore": False, "oid": None,
                  "uploadMode": "lfs" if f["size"] >= self.lfs_from or f["path"].endswith(".safetensors")
                  else "regular"} for f in payload["files"]]
        return self._reply(h, 200, {"files": files, "commitOid": _oid(self.repos[repo_id].commits)})

    def _batch(self, h, repo_id: str, payload: dict) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._reply(h, 404, {"error": "Repository not found"})
        objects = []
        for obj in payload["objects"]:
            oid, size = obj["oid"], obj["size"]
            if oid in repo.objects:
                objects.append({"oid": oid, "size": size})
                continue
            base = f"{self.endpoint}/lfs/{repo_id.replace('/', '--')}/{oid}"
            parts = {str(n): f"{base}/{n}" for n in range(1, math.ceil(size / self.part_size) + 1)}
            repo.uploads[oid] = {"parts": {}, "next": 1, "digest": hashlib.sha256()}  # a fresh multipart upload
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{base}/complete", "header": {"chunk_size": str(self.part_size), **parts}}}})
        return self._reply(h, 200, {"transfer": "multipart", "objects": objects, "hash_algo": "sha256"})

    def _part(self, h, repo_id: str, oid: str, number: int, body: bytes) -> None:
        upload = self.repos[repo_id].uploads.get(oid)
        if upload is None:
            return self._reply(h, 404, {"error": "no such upload"})
        if number == upload["next"]:
            upload["digest"].update(body)
            upload["next"] += 1
            upload["size"] = upload.get("size", 0) + len(body)
        elif number > upload["next"]:
            return self._reply(h, 400, {"error": f"part {number} before part {upload['next']}"})
        if self.keep_bytes:
            upload["parts"][number] = body
        return self._reply(h, 200, {}, {"ETag": f'"{oid[:8]}-{number}"'})

    def _complete(self, h, repo_id: str, oid: str, payload: dict) -> None:
        repo = self.repos[repo_id]
        upload = repo.uploads.pop(oid, None)
        if upload is None or upload["digest"].hexdigest() != oid:
            return self._reply(h, 400, {"error": "the parts joined do not hash to the object's oid"})
        parts = upload["parts"]
        repo.objects[oid] = b"".join(parts[n] for n in sorted(parts)) if self.keep_bytes else upload["size"]
        return self._reply(h, 200, {})

    def _commit(self, h, repo_id: str, body: bytes) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._reply(h, 404, {"error": "Repository not found"})
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        tree = dict(repo.tree)
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                assert value["encoding"] == "base64", value
                tree[value["path"]] = ("file", base64.b64decode(value["content"]))
            elif line["key"] == "lfsFile":
                if value["oid"] not in repo.objects:
                    return self._reply(h, 422, {"error": f"LFS object {value['oid']} of {value['path']} not found"})
                tree[value["path"]] = ("lfs", value["oid"])
            elif line["key"] != "header":  # deletedFile...: not expected from a push
                return self._reply(h, 400, {"error": f"unexpected commit operation {line['key']!r}"})
        repo.tree = tree
        repo.commits.append(header["summary"])
        oid = _oid(repo.commits)
        return self._reply(h, 200, {"commitUrl": f"{self._url(repo_id)}/commit/{oid}", "commitOid": oid,
                                    "pullRequestUrl": None})

    def _url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    @staticmethod
    def _reply(h, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


def _oid(commits: list[str]) -> str:
    """A commit id that changes with each commit (40 hex digits, like git's)."""
    return hashlib.sha1("\n".join(commits).encode()).hexdigest()
