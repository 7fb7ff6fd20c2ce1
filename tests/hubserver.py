"""A local HTTP server that speaks the part of the Hugging Face Hub API a push uses.

huggingface_hub's `create_repo` and `create_commit` (0.36 on the transformers 4.x line, 2.x on 5.x; `upload_folder`
ends in the same calls) send, for small files:

- `POST /api/repos/create` (JSON: name, organization, `private` (0.x) or `visibility` (2.x), type), 409 if it exists;
- `POST /api/validate-yaml` (the README's metadata; 0.x's single-commit path);
- `POST /api/models/{org}/{name}/preupload/{revision}` (JSON: path, size, sample per file): answered "regular"
  for every file, so the bytes travel in the commit itself (no LFS or Xet storage to imitate);
- `POST /api/models/{org}/{name}/commit/{revision}` (NDJSON: a header line with the commit message, then one line
  per file with its base64 content).

Everything else is a 404, recorded like the rest, so a test sees any request it did not expect. Writes need an
`Authorization: Bearer <token>` header (401 otherwise). `fail_commit = STATUS` answers every commit with that
HTTP status (a Hub error after the repo exists). `GET /api/models/{org}/{name}` answers the repo's visibility.
Runs in a thread on 127.0.0.1, port 0 (the OS picks one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = r"(?P<repo>[^/]+/[^/]+)"
PREUPLOAD = re.compile(rf"^/api/models/{REPO}/preupload/(?P<rev>[^/?]+)")
COMMIT = re.compile(rf"^/api/models/{REPO}/commit/(?P<rev>[^/?]+)")
REPO_INFO = re.compile(rf"^/api/models/{REPO}(/revision/(?P<rev>[^/?]+))?/?$")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)  # commit messages (summaries), oldest first


class HubServer:
    """`with HubServer() as hub:` -> `hub.endpoint` (http://127.0.0.1:PORT), `hub.requests`, `hub.repos`."""

    def __init__(self):
        self.requests: list[Request] = []
        self.repos: dict[str, Repo] = {}
        self.fail_commit: int | None = None
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: pytest shows the assertions
                pass

            def do_GET(self):
                server._handle(self)

            def do_POST(self):
                server._handle(self)

            def do_PUT(self):
                server._handle(self)

            def do_HEAD(self):
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- the API ---------------------------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        path = h.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(Request(h.command, h.path, {k.lower(): v for k, v in h.headers.items()}, body))
        token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if h.command == "POST" and not token:
            return self._reply(h, 401, {"error": "Invalid credentials in Authorization header"})
        if h.command == "POST" and path == "/api/repos/create":
            return self._create(h, json.loads(body))
        if h.command == "POST" and path == "/api/validate-yaml":
            return self._reply(h, 200, {"errors": [], "warnings": []})
        match = PREUPLOAD.match(path)
        if h.command == "POST" and match:
            return self._preupload(h, match["repo"], json.loads(body))
        match = COMMIT.match(path)
        if h.command == "POST" and match and self.fail_commit:
            return self._reply(h, self.fail_commit, {"error": f"the test Hub answers {self.fail_commit}"})
        if h.command == "POST" and match:
            return self._commit(h, match["repo"], body)
        match = REPO_INFO.match(path)
        if h.command == "GET" and match and match["repo"] in self.repos:
            repo = self.repos[match["repo"]]
            return self._reply(h, 200, {"id": match["repo"], "private": repo.private, "sha": _oid(repo.commits),
                                        "siblings": [{"rfilename": name} for name in sorted(repo.files)]})
        return self._reply(h, 404, {"error": f"not served by the test Hub: {h.command} {path}"})

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
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                 for f in payload["files"]]
        return self._reply(h, 200, {"files": files, "commitOid": _oid(self.repos[repo_id].commits)})

    def _commit(self, h, repo_id: str, body: bytes) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._reply(h, 404, {"error": "Repository not found"})
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        for line in lines:
            if line["key"] == "file":
                value = line["value"]
                assert value["encoding"] == "base64", value
                repo.files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] != "header":  # lfsFile, deletedFile...: not expected from a push of small files
                return self._reply(h, 400, {"error": f"unexpected commit operation {line['key']!r}"})
        repo.commits.append(header["summary"])
        oid = _oid(repo.commits)
        return self._reply(h, 200, {"commitUrl": f"{self._url(repo_id)}/commit/{oid}", "commitOid": oid,
                                    "pullRequestUrl": None})

    def _url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    @staticmethod
    def _reply(h, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


def _oid(commits: list[str]) -> str:
    """A commit id that changes with each commit (40 hex digits, like git's)."""
    return hashlib.sha1("\n".join(commits).encode()).hexdigest()
