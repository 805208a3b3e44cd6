"""The Hugging Face hub, asked over its HTTP API from the machine that runs engine-ctl: which commit a reference
points at, and that commit's files with their sizes and digests.

As huggingface_hub does (src/huggingface_hub/constants.py, hf_api.py): the endpoint is HF_ENDPOINT (a mirror)
or https://huggingface.co; the token is HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), sent as
`Authorization: Bearer …` and never written anywhere: not in a message, a plan, the state or a log."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from urllib.parse import quote

from engine_ctl import __version__
from engine_ctl.core.weights import HubError, HubFile, parse_revision_info

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 20.0


def endpoint_from(env: Mapping[str, str]) -> str:
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_from(env: Mapping[str, str]) -> str | None:
    return env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None


class Hub:
    """One hub (endpoint and token): answers are cached per reference for one command."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = TIMEOUT_S) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self.timeout = timeout
        self._cache: dict[tuple[str, str], tuple[str, tuple[HubFile, ...]]] = {}

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Hub:
        env = os.environ if env is None else env
        return cls(endpoint_from(env), token_from(env))

    def __repr__(self) -> str:  # never the token
        return f"Hub({self.endpoint!r}, token={'set' if self._token else 'none'})"

    def revision(self, repo: str, revision: str) -> tuple[str, tuple[HubFile, ...]]:
        """The commit `revision` (a branch, a tag or a commit) of model `repo` points at, and its files."""
        key = (repo, revision)
        if key not in self._cache:
            url = f"{self.endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"
            self._cache[key] = parse_revision_info(repo, self._get_json(url, f"{repo}@{revision}"))
        return self._cache[key]

    def _get_json(self, url: str, what: str) -> object:
        import urllib.error  # only when a document has an hf: reference: other plans never load urllib.request
        import urllib.request

        headers = {"Accept": "application/json", "User-Agent": f"engine-ctl/{__version__}"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise HubError(self._http_message(exc.code, what)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise HubError(
                f"the hub at {self.endpoint} could not be reached to pin {what}: {reason}; check the network or "
                "HF_ENDPOINT, or pin the commit yourself (org/repo@<commit>) and put the files in place"
            ) from None
        try:
            return json.loads(body)
        except ValueError:
            raise HubError(f"the hub at {self.endpoint} answered {what} with something that is not JSON") from None

    def _http_message(self, code: int, what: str) -> str:
        if code in (401, 403):
            held = "the token in HF_TOKEN is not allowed to read it" if self._token else "set HF_TOKEN"
            return f"the hub at {self.endpoint} refused {what} (HTTP {code}): a gated or private repository; {held}"
        if code == 404:
            return f"the hub at {self.endpoint} has no model repository or revision {what} (HTTP 404)"
        return f"the hub at {self.endpoint} answered {what} with HTTP {code}; try again later"
