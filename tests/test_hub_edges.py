"""The hub API as huggingface_hub's users expect it (tests/hubdouble.py speaks the hub's real shapes): the token
file `hf auth login` writes, HF_HUB_OFFLINE, a commit's file list kept so a pinned plan asks nothing twice, and
retries with backoff on 429 and 5xx honouring Retry-After."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.weights import HubError
from engine_ctl.shell.hub import Hub, token_from, token_path
from tests.hubdouble import HubDouble, RepoFile

REPO = "org/private"
TOKEN = "hf_from_the_login_file"


@pytest.fixture
def hub() -> Iterator[HubDouble]:
    with HubDouble() as double:
        double.add(REPO, {"m.gguf": RepoFile(b"GGUF" + bytes(1000))}, private_token=TOKEN)
        yield double


def _env(tmp_path: Path, hub: HubDouble, **more: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "HF_ENDPOINT": hub.endpoint, **more}


def test_the_token_file_hf_auth_login_writes_is_used(tmp_path: Path, hub: HubDouble) -> None:
    env = _env(tmp_path, hub, HF_HOME=str(tmp_path / "hf"))
    assert token_path(env) == tmp_path / "hf" / "token"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text(TOKEN + "\n")
    commit, files = Hub.from_environment(env).revision(REPO, "main")
    assert commit == hub.repos[REPO].commit and [f.path for f in files] == ["m.gguf"]
    assert hub.tokens_seen == [TOKEN]
    assert token_from({**env, "HF_TOKEN": "hf_env_wins"}) == "hf_env_wins"
    default = {"HOME": str(tmp_path / "home")}
    assert token_path(default) == tmp_path / "home" / ".cache" / "huggingface" / "token"
    assert token_path({**default, "HF_TOKEN_PATH": str(tmp_path / "t")}) == tmp_path / "t"


def test_offline_asks_the_hub_nothing_and_uses_a_commit_seen_before(tmp_path: Path, hub: HubDouble) -> None:
    env = _env(tmp_path, hub, HF_TOKEN=TOKEN)
    commit = hub.repos[REPO].commit
    with pytest.raises(HubError, match=f"HF_HUB_OFFLINE is set and this machine has not seen the files of {REPO}@main"):
        Hub.from_environment({**env, "HF_HUB_OFFLINE": "1"}).revision(REPO, "main")
    assert hub.requests == []
    online = Hub.from_environment(env).revision(REPO, "main")  # pins main, keeping the commit's file list
    hub.requests.clear()
    again = Hub.from_environment({**env, "HF_HUB_OFFLINE": "1"}).revision(REPO, commit)
    assert again == online and hub.requests == []
    assert Hub.from_environment(env).revision(REPO, commit) == online and hub.requests == []  # online too
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        Hub.from_environment({**env, "HF_HUB_OFFLINE": "1"}).revision(REPO, "main")  # a branch needs the hub


def test_429_and_503_are_retried_honouring_retry_after(tmp_path: Path, hub: HubDouble) -> None:
    hub.failures = [(429, 1), (503, None)]
    started = time.monotonic()
    commit, _ = Hub(hub.endpoint, TOKEN, backoff_s=0.01).revision(REPO, "main")
    assert commit == hub.repos[REPO].commit
    assert len(hub.requests) == 3 and time.monotonic() - started >= 1.0


def test_a_404_is_not_retried_and_retries_end(tmp_path: Path, hub: HubDouble) -> None:
    with pytest.raises(HubError, match="no model repository or revision org/none@main"):
        Hub(hub.endpoint, TOKEN, backoff_s=0.01).revision("org/none", "main")
    assert len(hub.requests) == 1
    hub.requests.clear()
    hub.failures = [(503, None)] * 10
    with pytest.raises(HubError, match="HTTP 503"):
        Hub(hub.endpoint, TOKEN, backoff_s=0.01).revision(REPO, "main")
    assert len(hub.requests) == 5  # the first try and 4 retries
