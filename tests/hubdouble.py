"""A test double of the Hugging Face hub: the hub cannot be reached from here, so this small HTTP server speaks
the parts of its API engine-ctl uses, in the hub's own shapes, serving real files (the tiny real GGUF model).

Where the shapes come from (huggingface_hub, github.com/huggingface/huggingface_hub):
- GET /api/models/{repo}/revision/{revision}?blobs=true: src/huggingface_hub/hf_api.py, HfApi.model_info
  (files_metadata=True sends blobs=true) read by ModelInfo: `id`, `sha` (the commit), `siblings` with
  `rfilename`, `size`, `blobId` and, for a Git LFS file, `lfs: {size, sha256, pointerSize}` (RepoSibling,
  BlobLfsInfo). An unknown repository answers 404 with X-Error-Code: RepoNotFound, an unknown revision
  X-Error-Code: RevisionNotFound (src/huggingface_hub/utils/_http.py, hf_raise_for_status).
- GET/HEAD /{repo}/resolve/{revision}/{file}: src/huggingface_hub/constants.py HUGGINGFACE_CO_URL_TEMPLATE and
  file_download.py get_hf_file_metadata: headers X-Repo-Commit, ETag (the LFS sha256, or the git blob id), for
  LFS files X-Linked-Etag and X-Linked-Size; Range requests answer 206 with Content-Range (http_get resumes so).
- A private repository without the right `Authorization: Bearer` token answers 401.

tests/test_hub_double.py checks these shapes against the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import json
import re
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class RepoFile:
    data: bytes
    lfs: bool = True

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        """The git blob id: sha1 of "blob <size>\\0" + content (what git stores; an LFS file's blob is its pointer)."""
        body = self.pointer if self.lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()


@dataclass
class Repo:
    commit: str
    files: dict[str, RepoFile]
    branches: dict[str, str] = field(default_factory=dict)
    private_token: str | None = None
    served: dict[str, bytes] = field(default_factory=dict)
    """Bytes served in place of a file's own (a corrupted mirror): its listed size and sha256 stay the file's."""


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorized: bool


class HubDouble:
    """Serves `repos` on host:port (port 0: any free one); `rate` caps bytes/s of file bodies (0: no cap)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.tokens_seen: list[str] = []
        self.rate = 0
        self.redirect_files_to: str | None = None
        """A CDN: each file request is answered 302 to this endpoint with the same path (the hub's LFS files are)."""
        self.cuts: list[int] = []
        """The next file bodies are cut after this many bytes each: the connection closes cleanly mid-body."""
        self.failures: list[tuple[int, int | None]] = []
        """The next requests are answered with this status (and Retry-After seconds, when not None)."""
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                double._handle(self, body=True)

            def do_HEAD(self) -> None:
                double._handle(self, body=False)

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> HubDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, name: str, files: dict[str, RepoFile], commit: str | None = None, **kw: object) -> Repo:
        commit = commit or hashlib.sha1(name.encode() + b"".join(f.data[:64] for f in files.values())).hexdigest()
        repo = Repo(commit=commit, files=files, branches={"main": commit}, **kw)  # type: ignore[arg-type]
        self.repos[name] = repo
        return repo

    # --- handling -------------------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlsplit(h.path)
        auth = h.headers.get("Authorization") or ""
        if auth:
            self.tokens_seen.append(auth.removeprefix("Bearer "))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", url.path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path)
        name = (info or resolve).group(1) if (info or resolve) else ""
        repo = self.repos.get(name)
        self.requests.append(Request(h.command, url.path, h.headers.get("Range"), bool(auth)))
        if self.failures:
            status, after = self.failures.pop(0)
            return self._error(h, status, None, "try again", body, retry_after=after)
        if resolve and self.redirect_files_to:
            h.send_response(302)
            h.send_header("Location", self.redirect_files_to + h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        if repo is None:
            return self._error(h, 404, "RepoNotFound", "Repository not found", body)
        if repo.private_token and auth != f"Bearer {repo.private_token}":
            return self._error(h, 401, "GatedRepo" if auth else None, "Invalid credentials in Authorization header",
                               body)  # fmt: skip
        assert info or resolve
        revision = unquote((info or resolve).group(2))  # type: ignore[union-attr]
        commit = repo.branches.get(revision) or (revision if revision == repo.commit else None)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
        if info:
            return self._info(h, name, repo, body)
        assert resolve
        return self._file(h, repo, unquote(resolve.group(3)), body)

    def _error(self, h: BaseHTTPRequestHandler, code: int, error_code: str | None, message: str, body: bool,
               retry_after: int | None = None) -> None:  # fmt: skip
        data = json.dumps({"error": message}).encode()
        h.send_response(code)
        if retry_after is not None:
            h.send_header("Retry-After", str(retry_after))
        if error_code:
            h.send_header("X-Error-Code", error_code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _info(self, h: BaseHTTPRequestHandler, name: str, repo: Repo, body: bool) -> None:
        siblings = []
        for path, f in sorted(repo.files.items()):
            sibling: dict[str, object] = {"rfilename": path, "blobId": f.blob_id, "size": len(f.data)}
            if f.lfs:
                sibling["size"] = len(f.data)
                sibling["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": len(f.pointer)}
            siblings.append(sibling)
        doc = {
            "_id": hashlib.md5(name.encode()).hexdigest()[:24], "id": name, "modelId": name,
            "author": name.split("/")[0], "sha": repo.commit, "lastModified": "2026-11-02T10:00:00.000Z",
            "private": repo.private_token is not None, "gated": False, "disabled": False, "tags": ["gguf"],
            "library_name": "gguf", "siblings": siblings, "createdAt": "2026-11-01T10:00:00.000Z",
        }  # fmt: skip
        data = json.dumps(doc).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _file(self, h: BaseHTTPRequestHandler, repo: Repo, path: str, body: bool) -> None:
        f = repo.files.get(path)
        if f is None:
            return self._error(h, 404, "EntryNotFound", f'{path} does not exist on "{repo.commit}"', body)
        data = repo.served.get(path, f.data)
        start, status = 0, 200
        wanted = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        if wanted:
            start = int(wanted.group(1))
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            status = 206
        h.send_response(status)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{f.sha256 if f.lfs else f.blob_id}"')
        if f.lfs:
            h.send_header("X-Linked-Etag", f'"{f.sha256}"')
            h.send_header("X-Linked-Size", str(len(f.data)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if body:
            cut = self.cuts.pop(0) if self.cuts else None
            self._send(h, data[start:] if cut is None else data[start : start + cut])
            if cut is not None:
                h.close_connection = True

    def _send(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        step = 64 * 1024
        try:
            for i in range(0, len(data), step):
                h.wfile.write(data[i : i + step])
                if self.rate:
                    time.sleep(step / self.rate)
        except (BrokenPipeError, ConnectionResetError):
            return


def tiny_repo_files(model: Path) -> dict[str, RepoFile]:
    """The tiny real GGUF model as an LFS file, with a README kept in git, as a GGUF repository has."""
    return {
        "tiny.gguf": RepoFile(model.read_bytes(), lfs=True),
        "README.md": RepoFile(b"---\nlibrary_name: gguf\n---\n# tiny\nA tiny llama for tests.\n", lfs=False),
    }
