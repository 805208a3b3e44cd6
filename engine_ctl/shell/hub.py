"""The Hugging Face hub, asked over its HTTP API from the machine that runs engine-ctl: which commit a reference
points at, and that commit's files with their sizes and digests.

As huggingface_hub does (src/huggingface_hub/constants.py, hf_api.py):
- the endpoint is HF_ENDPOINT (a mirror) or https://huggingface.co;
- the token is HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), else the file `hf auth login` writes
  (HF_TOKEN_PATH, default $HF_HOME/token, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or
  ~/.cache/huggingface); it is sent as `Authorization: Bearer …` and never written anywhere engine-ctl writes;
- HF_HUB_OFFLINE=1: the hub is never asked; a commit whose file list this machine has seen is answered from its
  cache, anything else is a clear error;
- connection errors, 429 and 5xx are retried with backoff, honouring Retry-After.

A commit's file list never changes, so each answer is kept by commit under $XDG_CACHE_HOME/engine-ctl/hub (or
~/.cache/engine-ctl/hub): a plan of pinned references asks the hub nothing twice."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from engine_ctl import __version__
from engine_ctl.core.weights import HubError, HubFile, parse_revision_info

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 20.0
RETRIES = 4
BACKOFF_S = 0.5
RETRY_AFTER_MAX_S = 30.0
RETRY_STATUSES = (429, 500, 502, 503, 504)
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
TRUE = ("1", "on", "yes", "true")


def endpoint_from(env: Mapping[str, str]) -> str:
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _cache_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")


def token_path(env: Mapping[str, str]) -> Path:
    """Where `hf auth login` keeps the token (huggingface_hub's HF_TOKEN_PATH)."""
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"]).expanduser()
    home = Path(env["HF_HOME"]).expanduser() if env.get("HF_HOME") else _cache_home(env) / "huggingface"
    return home / "token"


def token_from(env: Mapping[str, str]) -> str | None:
    found = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    if found:
        return found
    try:
        return token_path(env).read_text().strip() or None
    except OSError:
        return None


def offline(env: Mapping[str, str]) -> bool:
    return (env.get("HF_HUB_OFFLINE") or "").strip().lower() in TRUE


def retry_after_s(value: str | None) -> float | None:
    try:
        return min(max(float(value or ""), 0.0), RETRY_AFTER_MAX_S)
    except ValueError:
        return None


class Hub:
    """One hub (endpoint and token): answers are cached per reference for one command."""

    def __init__(
        self, endpoint: str, token: str | None = None, timeout: float = TIMEOUT_S, *, cache_dir: Path | None = None,
        offline: bool = False, backoff_s: float = BACKOFF_S,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self.timeout = timeout
        self.cache_dir = cache_dir
        self.offline = offline
        self.backoff_s = backoff_s
        self._cache: dict[tuple[str, str], tuple[str, tuple[HubFile, ...]]] = {}

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Hub:
        env = os.environ if env is None else env
        cache = _cache_home(env) / "engine-ctl" / "hub"
        return cls(endpoint_from(env), token_from(env), cache_dir=cache, offline=offline(env))

    def __repr__(self) -> str:  # never the token
        return f"Hub({self.endpoint!r}, token={'set' if self._token else 'none'})"

    def revision(self, repo: str, revision: str) -> tuple[str, tuple[HubFile, ...]]:
        """The commit `revision` (a branch, a tag or a commit) of model `repo` points at, and its files."""
        key = (repo, revision)
        if key not in self._cache:
            self._cache[key] = self._revision(repo, revision)
        return self._cache[key]

    def _kept(self, repo: str, commit: str) -> Path | None:
        if self.cache_dir is None:
            return None
        host = re.sub(r"[^\w.-]", "_", self.endpoint.split("://", 1)[-1])
        return self.cache_dir / host / repo.replace("/", "--") / f"{commit}.json"

    def _revision(self, repo: str, revision: str) -> tuple[str, tuple[HubFile, ...]]:
        kept = self._kept(repo, revision) if COMMIT_RE.fullmatch(revision) else None
        if kept is not None and kept.is_file():
            try:
                return parse_revision_info(repo, json.loads(kept.read_text()))
            except (OSError, ValueError, HubError):
                pass  # a damaged cache entry: ask the hub again
        if self.offline:
            raise HubError(
                f"HF_HUB_OFFLINE is set and this machine has not seen the files of {repo}@{revision}: pin a commit "
                "planned here before, or plan once with the hub reachable"
            )
        url = f"{self.endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"
        body = self._get_json(url, f"{repo}@{revision}")
        commit, files = parse_revision_info(repo, body)
        self._keep(repo, commit, body)
        return commit, files

    def _keep(self, repo: str, commit: str, body: object) -> None:
        kept = self._kept(repo, commit)
        if kept is None:
            return
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            temporary = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(body))
            temporary.replace(kept)
        except OSError:
            pass  # a cache that cannot be written only costs the next plan a request

    def _get_json(self, url: str, what: str) -> object:
        import urllib.error  # only when a document has an hf: reference: other plans never load urllib.request
        import urllib.request

        headers = {"Accept": "application/json", "User-Agent": f"engine-ctl/{__version__}"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, headers=headers)
        attempt = 0
        while True:
            wait: float | None = None
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                break
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRY_STATUSES or attempt >= RETRIES:
                    raise HubError(self._http_message(exc.code, what)) from None
                wait = retry_after_s(exc.headers.get("Retry-After"))
            except (urllib.error.URLError, OSError) as exc:
                if attempt >= RETRIES:
                    raise HubError(self._unreachable(what, getattr(exc, "reason", exc))) from None
            time.sleep(wait if wait is not None else self.backoff_s * 2**attempt)
            attempt += 1
        try:
            return json.loads(body)
        except ValueError:
            raise HubError(f"the hub at {self.endpoint} answered {what} with something that is not JSON") from None

    def _unreachable(self, what: str, reason: object) -> str:
        return (
            f"the hub at {self.endpoint} could not be reached to pin {what} (after {RETRIES} retries): {reason}; "
            "check the network or HF_ENDPOINT, or pin the commit yourself (org/repo@<commit>) and put the files in "
            "place"
        )

    def _http_message(self, code: int, what: str) -> str:
        if code in (401, 403):
            held = "the token in HF_TOKEN is not allowed to read it" if self._token else "set HF_TOKEN"
            return f"the hub at {self.endpoint} refused {what} (HTTP {code}): a gated or private repository; {held}"
        if code == 404:
            return f"the hub at {self.endpoint} has no model repository or revision {what} (HTTP 404)"
        return f"the hub at {self.endpoint} answered {what} with HTTP {code}; try again later"
