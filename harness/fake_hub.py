"""A Hugging Face Hub stand-in on 127.0.0.1: just the HTTP API that huggingface_hub's listing and file
downloads use, with the same headers and error codes, and faults on demand.

- GET /api/models/{repo}/revision/{rev}: model info (`id`, `sha`, `siblings`); 404 with
  `X-Error-Code: RepoNotFound` for an unknown repo, `RevisionNotFound` for an unknown revision.
- GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...: the file listing (`type`, `path`, `size`,
  `oid` = the git blob id, `lfs` {oid = sha256, size, pointerSize} for large files).
- HEAD/GET /{repo}/resolve/{rev}/{file}: `X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`;
  a Range request gets 206 with `Content-Range`.
Faults: `slow[file]` serves a file at a MiB per that many seconds; `cut(file, n)` makes the next GET of `file` send n bytes of its body and drop the connection,
after which the hub answers 503 until `available` is set again; `listed_size[file]` is the size the listing
gives instead of the true one (the content served and its hashes stay true); `extra[file]` is sent after the
file's bytes, as a broken or hostile server would (Content-Length counts it). Every request is recorded.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_MIN = 1024  # files at least this big are stored as LFS objects (the Hub's threshold is larger)


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""
    revisions: tuple[str, ...] = ("main",)

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in self.files.items()))
                                  .encode()).hexdigest()
            self.commit = digest


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    available: bool = True
    slow: dict[str, float] = field(default_factory=dict)  # file -> seconds per MiB served
    listed_size: dict[str, int] = field(default_factory=dict)  # file -> the size the listing claims
    extra: dict[str, bytes] = field(default_factory=dict)  # file -> bytes served after its content
    _cuts: dict[str, int] = field(default_factory=dict)

    def cut(self, file: str, after: int) -> None:
        self._cuts[file] = after

    def gets(self, file: str) -> list[Request]:
        """The GET requests for one file's content, in order."""
        return [r for r in self.requests if r.method == "GET" and (m := _RESOLVE.fullmatch(r.path))
                and unquote(m["file"]) == file]


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rest>.+)")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, status: int, data, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
            self._send(status, json.dumps({"error": message}).encode(),
                       {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message},
                       head=head)

        def _repo(self, name: str, rev: str, head: bool = False) -> Repo | None:
            repo = hub.repos.get(name)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return None
            if rev not in repo.revisions and rev != repo.commit:
                self._error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
                return None
            return repo

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _serve(self, head: bool) -> None:
            url = urlsplit(self.path)
            hub.requests.append(Request(self.command, url.path, {k.lower(): v for k, v in self.headers.items()}))
            if not hub.available:
                self._send(503, b"Service Unavailable", head=head)
                return
            if m := _API.fullmatch(url.path):
                rev, _, sub = m["rest"].partition("/")
                repo = self._repo(m["repo"], unquote(rev))
                if repo is None:
                    return
                if m["kind"] == "revision":
                    self._json(200, {"id": m["repo"], "modelId": m["repo"], "sha": repo.commit, "private": False,
                                     "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
                    return
                prefix = unquote(sub)
                entries = []
                for path, data in sorted(repo.files.items()):
                    if prefix and not path.startswith(prefix + "/"):
                        continue
                    size = hub.listed_size.get(path, len(data))
                    entry = {"type": "file", "oid": blob_id(data), "size": size, "path": path}
                    if len(data) >= LFS_MIN:
                        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
                        entry["size"] = size
                    entries.append(entry)
                self._json(200, entries)
                return
            if m := _RESOLVE.fullmatch(url.path):
                repo = self._repo(m["repo"], unquote(m["rev"]), head)
                if repo is None:
                    return
                file = unquote(m["file"])
                data = repo.files.get(file)
                if data is None:
                    self._error(404, "EntryNotFound", f"{file} does not exist", head)
                    return
                etag = f'"{hashlib.sha256(data).hexdigest() if len(data) >= LFS_MIN else blob_id(data)}"'
                headers = {"X-Repo-Commit": repo.commit, "ETag": etag, "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}
                start = 0
                rng = self.headers.get("Range")
                status = 200
                if rng:
                    rm = re.fullmatch(r"bytes=(\d+)-", rng.strip())
                    if rm is None or int(rm[1]) >= len(data):
                        self._send(416, b"", {"Content-Range": f"bytes */{len(data)}", **headers}, head=head)
                        return
                    start, status = int(rm[1]), 206
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                body = data[start:] + hub.extra.get(file, b"")
                headers["Content-Length"] = str(len(body))
                cut = hub._cuts.pop(file, None) if not head else None
                if cut is None and file in hub.slow and not head:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    for i in range(0, len(body), 2**20):
                        try:
                            self.wfile.write(body[i:i + 2**20])
                            self.wfile.flush()
                        except OSError:  # the client went away
                            return
                        time.sleep(hub.slow[file])
                    return
                if cut is None:
                    self._send(status, body, headers, head=head)
                    return
                # the fault: the promised body stops after `cut` bytes and the connection drops
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body[:cut])
                self.wfile.flush()
                hub.available = False
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            self._error(404, "NotFound", "no such route")

    return Handler


class HubServer:
    """The fake hub served from a thread on 127.0.0.1 (a free port)."""

    def __init__(self, hub: FakeHub):
        self.hub = hub
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
