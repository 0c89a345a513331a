"""A stand-in for the Hugging Face Hub: a real HTTP server on 127.0.0.1 that answers exactly the part of
the Hub API huggingface_hub uses to pin and download a model file:

- `POST /api/models/{org}/{repo}/paths-info/{revision}` (form `paths=…&expand=…`) → JSON list of
  `{type, path, size, oid, lfs: {oid: <sha256>, size, pointerSize}}` for the paths that exist
  (HfApi.get_paths_info);
- `HEAD` and `GET /{org}/{repo}/resolve/{revision}/{path}` → the file, with the headers
  hf_hub_download reads: `X-Repo-Commit`, `X-Linked-Etag` ("<sha256>"), `X-Linked-Size`, `ETag`,
  `Content-Length` (a `Range: bytes=N-` request resumes);
- `GET /api/agent-harnesses` → an empty registry (huggingface_hub fetches it once a day for its
  user agent; answering keeps it from retrying);
- errors as the Hub sends them: 404 with `X-Error-Code: RepoNotFound | RevisionNotFound |
  EntryNotFound`, 401 when a token is required and missing or wrong.

`tamper(path)` makes it serve other bytes of the same length for a path while still reporting the
original sha256: what a corrupted mirror or a swapped file looks like to the client.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    def __init__(self, token: str | None = None):
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> revision -> path -> bytes
        self.tampered: set[tuple[str, str]] = set()
        self.token = token
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.auth_seen: list[str | None] = []
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: pytest shows failures, not every request
                pass

            def do_HEAD(self):
                stand_in._resolve(self, body=False)

            def do_GET(self):
                stand_in._resolve(self, body=True)

            def do_POST(self):
                stand_in._paths_info(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)

    # ---- content ------------------------------------------------------------------------------
    def add(self, repo: str, revision: str, path: str, data: bytes) -> None:
        self.repos.setdefault(repo, {}).setdefault(revision, {})[path] = data

    def tamper(self, repo: str, path: str) -> None:
        self.tampered.add((repo, path))

    def downloads(self, path_suffix: str = "") -> int:
        """GET requests of files (not HEADs): how many times bytes were actually sent."""
        with self._lock:
            return sum(1 for m, p in self.requests if m == "GET" and "/resolve/" in p and p.endswith(path_suffix))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    # ---- protocol -----------------------------------------------------------------------------
    def _record(self, h) -> bool:
        path = urlsplit(h.path).path
        with self._lock:
            self.requests.append((h.command, path))
            if path != "/api/agent-harnesses":  # public on the Hub: the client sends no token there
                self.auth_seen.append(h.headers.get("Authorization"))
        if path == "/api/agent-harnesses":
            return True
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._error(h, 401, "RepoNotFound", "Invalid credentials in Authorization header")
            return False
        return True

    def _error(self, h, status: int, code: str, message: str, body: bool = True) -> None:
        payload = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body and h.command != "HEAD":
            h.wfile.write(payload)

    def _lookup(self, h, repo: str, revision: str):
        if repo not in self.repos:
            self._error(h, 404, "RepoNotFound", "Repository not found")
            return None
        files = self.repos[repo].get(revision)
        if files is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return files

    def _paths_info(self, h) -> None:
        if not self._record(h):
            return
        length = int(h.headers.get("Content-Length") or 0)
        form = parse_qs(h.rfile.read(length).decode())
        parts = unquote(urlsplit(h.path).path).split("/")
        # /api/models/{org}/{repo}/paths-info/{revision}
        if len(parts) != 7 or parts[1:3] != ["api", "models"] or parts[5] != "paths-info":
            return self._error(h, 404, "EntryNotFound", "no such API")
        files = self._lookup(h, f"{parts[3]}/{parts[4]}", parts[6])
        if files is None:
            return
        out = []
        for path in form.get("paths", []):
            if path in files:
                data = files[path]
                out.append({"type": "file", "path": path, "size": len(data), "oid": git_blob_oid(data),
                            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}})
        payload = json.dumps(out).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _resolve(self, h, body: bool) -> None:
        if not self._record(h):
            return
        if urlsplit(h.path).path == "/api/agent-harnesses":
            payload = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if body:
                h.wfile.write(payload)
            return
        parts = unquote(urlsplit(h.path).path).split("/")
        # /{org}/{repo}/resolve/{revision}/{path...}
        if len(parts) < 6 or parts[3] != "resolve":
            return self._error(h, 404, "EntryNotFound", "no such route")
        repo, revision, path = f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
        files = self._lookup(h, repo, revision)
        if files is None:
            return
        if path not in files:
            return self._error(h, 404, "EntryNotFound", f"{path} does not exist at {revision}")
        data = files[path]
        sha = hashlib.sha256(data).hexdigest()
        if (repo, path) in self.tampered:
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
        start = 0
        rng = h.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
            start = min(int(rng[6:].split("-")[0]), len(data))
        h.send_response(206 if start else 200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("X-Repo-Commit", revision)
        h.send_header("X-Linked-Etag", f'"{sha}"')
        h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("ETag", f'"{sha}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if body:
            h.wfile.write(data[start:])
