"""The weights fetch at the hub's edge, run for real on this machine (the same script and stdin an SSH host gets)
against the hub double (tests/hubdouble.py, the hub's real shapes): the token never follows a redirect to another
host (the hub redirects LFS files to a CDN, and huggingface_hub drops the token there); a body cut short resumes
with Range; 429 and 5xx are retried honouring Retry-After; retries end in a failure that keeps the part."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Downloads, Host
from engine_ctl.core.weights import WeightsFetch, checkout_dir
from engine_ctl.shell.fetch import BOOTSTRAP, PYTHON, FetchFailed, fetch_input, fetch_weights
from engine_ctl.shell.hub import Hub
from engine_ctl.shell.transport import LocalTransport
from tests.hubdouble import HubDouble, RepoFile

BIG = bytes(range(256)) * 12_000  # 3,072,000 bytes
REPO = "org/model"
TOKEN = "hf_secret_token_for_tests"


@pytest.fixture
def hub() -> Iterator[HubDouble]:
    with HubDouble() as double:
        double.add(REPO, {"m.gguf": RepoFile(BIG)})
        yield double


def _fetch(hub: HubDouble, models: Path, token: str | None = None) -> tuple[WeightsFetch, Host]:
    commit, files = Hub(hub.endpoint, token).revision(REPO, "main")
    host = Host(name="here", address="127.0.0.1", transport="local", models_dir=str(models))
    fetch = WeightsFetch(host="here", repo=REPO, commit=commit, dest=checkout_dir(str(models), REPO, commit),
                         files=list(files), total_bytes=sum(f.size for f in files))  # fmt: skip
    return fetch, host


def _raw(hub: HubDouble, fetch: WeightsFetch, host: Host, backoff_s: float) -> tuple[int, list[dict]]:  # type: ignore[type-arg]
    """The remote fetch as a process, with its backoff shortened (its only knob a test turns)."""
    text = fetch_input(fetch, host, Downloads(), hub.endpoint, None)
    head, source_and_args = text.split("\n", 1)
    source, args_line = source_and_args[: int(head)], source_and_args[int(head) :]
    args = json.loads(args_line)
    args["backoff_s"] = backoff_s
    done = subprocess.run([PYTHON, "-I", "-S", "-c", BOOTSTRAP], input=f"{head}\n{source}{json.dumps(args)}\n",
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_token_is_sent_to_the_hub_and_never_to_the_host_a_redirect_names(tmp_path: Path) -> None:
    with HubDouble() as cdn, HubDouble() as hub:
        hub.add(REPO, {"m.gguf": RepoFile(BIG)})
        cdn.add(REPO, {"m.gguf": RepoFile(BIG)})
        hub.redirect_files_to = cdn.endpoint  # another host:port, as the hub's CDN is
        fetch, host = _fetch(hub, tmp_path, TOKEN)
        got = fetch_weights(LocalTransport(host), fetch, host, Downloads(), hub.endpoint, TOKEN, lambda _p: None)
        assert Path(fetch.dest, "m.gguf").read_bytes() == BIG and got.digest
        assert hub.tokens_seen == [TOKEN, TOKEN]  # the pin and the file request, at the hub
        assert [r.path for r in cdn.requests] == [f"/{REPO}/resolve/{fetch.commit}/m.gguf"]
        assert cdn.tokens_seen == [] and not cdn.requests[0].authorized


def test_a_body_cut_short_resumes_with_range_and_is_not_called_corrupt(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path)
    hub.cuts = [1_500_000]  # the server closes cleanly after half the file
    code, events = _raw(hub, fetch, host, backoff_s=0.05)
    assert code == 0, events
    assert Path(fetch.dest, "m.gguf").read_bytes() == BIG
    ranges = [r.range for r in hub.requests if r.path.endswith("/m.gguf")]
    assert ranges == [None, "bytes=1500000-"]  # the rest only
    assert [e["event"] for e in events if e["event"] in ("retry", "corrupt")] == ["retry"]


def test_a_body_cut_short_every_time_fails_after_5_retries_keeping_the_part(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path)
    hub.cuts = [100_000] * 10
    code, events = _raw(hub, fetch, host, backoff_s=0.01)
    assert code == 5, events
    assert events[-1]["event"] == "failed" and "after 5 retries" in events[-1]["reason"]
    assert sum(e["event"] == "retry" for e in events) == 5
    part = Path(fetch.dest + ".partial", "m.gguf.part")
    assert part.stat().st_size == 600_000  # six bodies of 100,000 bytes, none thrown away
    hub.cuts = []
    code, _ = _raw(hub, fetch, host, backoff_s=0.01)  # the next fetch takes it from there
    assert code == 0 and Path(fetch.dest, "m.gguf").read_bytes() == BIG
    assert [r.range for r in hub.requests if r.path.endswith("/m.gguf")][-1] == "bytes=600000-"


def test_429_and_503_are_retried_honouring_retry_after(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path)
    hub.failures = [(429, 1), (503, 1)]
    started = time.monotonic()
    code, events = _raw(hub, fetch, host, backoff_s=0.01)  # the server's Retry-After wins over the backoff
    assert code == 0, events
    assert time.monotonic() - started >= 2.0
    assert [e["reason"] for e in events if e["event"] == "retry"] == ["HTTP 429", "HTTP 503"]


def test_a_404_is_not_retried(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path)
    hub.failures = [(404, None)]
    code, events = _raw(hub, fetch, host, backoff_s=0.01)
    assert code == 5 and not any(e["event"] == "retry" for e in events)


def test_a_complete_body_with_the_wrong_digest_stays_corruption(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path)
    bad = bytearray(BIG)
    bad[7] ^= 1
    hub.repos[REPO].served["m.gguf"] = bytes(bad)
    with pytest.raises(FetchFailed, match="does not match the digest the hub gives"):
        fetch_weights(LocalTransport(host), fetch, host, Downloads(), hub.endpoint, None, lambda _p: None)


def test_a_new_commit_fetches_only_the_files_that_changed(hub: HubDouble, tmp_path: Path) -> None:
    hub.add(REPO, {"m.gguf": RepoFile(BIG), "README.md": RepoFile(b"# one\n", lfs=False)})
    first, host = _fetch(hub, tmp_path)
    fetch_weights(LocalTransport(host), first, host, Downloads(), hub.endpoint, None, lambda _p: None)
    hub.add(REPO, {"m.gguf": RepoFile(BIG), "README.md": RepoFile(b"# two\n", lfs=False)})  # a new commit
    hub.requests.clear()
    second, _ = _fetch(hub, tmp_path)
    assert second.commit != first.commit
    got = fetch_weights(LocalTransport(host), second, host, Downloads(), hub.endpoint, None, lambda _p: None)
    assert [r.path for r in hub.requests if "/resolve/" in r.path] == [f"/{REPO}/resolve/{second.commit}/README.md"]
    assert got.fetched_bytes == len(b"# two\n")
    old, new = Path(first.dest, "m.gguf"), Path(second.dest, "m.gguf")
    assert new.read_bytes() == BIG and new.stat().st_ino == old.stat().st_ino  # one copy on disk
    assert Path(second.dest, "README.md").read_bytes() == b"# two\n"
