"""Fetching a plan's hf: weights on the host that runs them: the remote fetch (remote/fetch_weights.py) started
over the host's transport, its progress read line by line, its outcome returned or raised."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from engine_ctl.core.documents.inventory import Downloads, Host
from engine_ctl.core.plan.deploy import DIGEST_WAIT_S, fingerprint_script, parse_fingerprint
from engine_ctl.core.weights import WeightsFetch
from engine_ctl.shell.hub import DEFAULT_ENDPOINT, endpoint_from, token_from
from engine_ctl.shell.transport import CommandResult, Transport

PYTHON = "python3"
BOOTSTRAP = "import sys;n=int(sys.stdin.readline());exec(compile(sys.stdin.read(n),'fetch_weights','exec'))"
"""Reads the script (its length, then its text), which then reads its one line of arguments from stdin."""
SILENCE_S = 600.0


class FetchFailed(Exception):
    """The weights could not be put in place; the message says why, with the figures."""


@dataclass(frozen=True)
class Fetched:
    digest: str
    fetched_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class FetchProgress:
    file: str
    file_done: int
    file_size: int
    done: int
    total: int
    """Bytes of the whole checkout in place (done) and in all (total)."""


Progress = Callable[[FetchProgress], None]
Display = Callable[[str, str, FetchProgress], None]
"""(deployment, host, progress): a progress bar per file, on a terminal."""


@dataclass(frozen=True)
class HubAccess:
    """What apply's fetches use: the hub (HF_ENDPOINT, HF_TOKEN: never written anywhere), the inventory's
    downloads setting, and how progress is shown (a bar per file on a terminal, else a plain line at most
    every `every_s` seconds); the deployment's Pending reason is recorded every `record_every_s` seconds."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = field(default=None, repr=False)
    downloads: Downloads = field(default_factory=Downloads)
    display: Display | None = None
    every_s: float = 5.0
    record_every_s: float = 5.0

    @classmethod
    def from_environment(cls, downloads: Downloads, display: Display | None = None) -> HubAccess:
        env = os.environ
        return cls(endpoint_from(env), token_from(env), downloads, display)


def script_source() -> str:
    return resources.files("engine_ctl.shell.remote").joinpath("fetch_weights.py").read_text()


def fetch_input(fetch: WeightsFetch, host: Host, downloads: Downloads, endpoint: str, token: str | None) -> str:
    """What the remote fetch reads on stdin: its own text, then its arguments (the token only ever here)."""
    source = script_source()
    args = {
        "endpoint": endpoint, "token": token, "repo": fetch.repo, "commit": fetch.commit, "dest": fetch.dest,
        "sources": f"{host.models_dir.rstrip('/')}/sources", "enabled": downloads.enabled,
        "cap": downloads.cap_bytes, "files": [f.model_dump() for f in fetch.files],
    }  # fmt: skip
    return f"{len(source)}\n{source}{json.dumps(args)}\n"


def fetch_weights(
    transport: Transport, fetch: WeightsFetch, host: Host, downloads: Downloads, endpoint: str,
    token: str | None, progress: Progress,
) -> Fetched:  # fmt: skip
    """Put the checkout in place on the host (or find it there) and return its checkpoint digest."""
    outcome: dict[str, object] = {}
    said: list[str] = []

    def on_line(line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            said.append(line)
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == "progress":
            numbers = [int(event.get(k) or 0) for k in ("file_done", "file_size", "done", "total")]
            progress(FetchProgress(str(event.get("file") or ""), *numbers))
        elif event.get("event") == "retry":  # a transient failure, retried by the fetch itself
            said.append(f"retry {event.get('attempt')} of {event.get('file')}: {event.get('reason')}")
        else:
            outcome.update(event)

    code = transport.feed([PYTHON, "-I", "-S", "-c", BOOTSTRAP], fetch_input(fetch, host, downloads, endpoint,
                          token), on_line, SILENCE_S)  # fmt: skip
    kind = outcome.get("event")
    if kind == "done" and code == 0:
        return Fetched(str(outcome["digest"]), int(str(outcome.get("fetched") or 0)), fetch.total_bytes)
    where = f"{fetch.repo}@{fetch.commit[:12]} on {host.name}"
    if kind == "refused":
        raise FetchFailed(f"the weights {where} were refused: {outcome.get('reason')}")
    if kind == "corrupt":
        raise FetchFailed(
            f"the weights {where}: {outcome.get('file')} does not match the digest the hub gives "
            f"({outcome.get('expected')}; got sha256 {outcome.get('sha256')}): refused and deleted"
        )
    if kind == "failed":
        raise FetchFailed(f"the weights {where} could not be fetched: {outcome.get('reason')}")
    tail = f": {said[-1]}" if said else ""
    raise FetchFailed(f"the weights {where}: the fetch ended with exit status {code}{tail}")


def measure_checkpoint(t: Transport, path: str) -> tuple[str | None, CommandResult]:
    """A first start's fingerprint of the checkpoint at `path` on t's host (core.plan.deploy: its files read once,
    at most DIGEST_WAIT_S): the digest, or None, with the command's result to say why."""
    result = t.run(fingerprint_script(path), timeout=DIGEST_WAIT_S)
    return (parse_fingerprint(result.stdout) if result.exit_code == 0 else None), result
