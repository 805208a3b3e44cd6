"""The weights fetch (engine_ctl/shell/remote/fetch_weights.py) run for real on this machine (transport: local,
the same script and stdin an SSH host gets) against the hub double (tests/hubdouble.py: the hub's real shapes,
taken from huggingface_hub's source and checked against its client in tests/test_hub_double.py): a full
download, refusal at the cap and on low disk, resume after kill -9 mid-file, a corrupted file refused by its
digest."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Downloads, Host, Inventory
from engine_ctl.core.model import HfRef, Model
from engine_ctl.core.plan.fetching import weights_drift
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.weights import WeightsFetch, checkout_dir, checkpoint_digest
from engine_ctl.shell.fetch import BOOTSTRAP, PYTHON, FetchFailed, FetchProgress, fetch_input, fetch_weights
from engine_ctl.shell.gather import gather_one
from engine_ctl.shell.hub import Hub
from engine_ctl.shell.transport import LocalTransport
from tests.hubdouble import HubDouble, RepoFile
from tests.llama import tiny_model

BIG = os.urandom(3_000_000)
README = b"---\nlibrary_name: gguf\n---\n# m\n"
REPO = "org/model"


@pytest.fixture
def hub() -> Iterator[HubDouble]:
    with HubDouble() as double:
        double.add(REPO, {"m.gguf": RepoFile(BIG), "README.md": RepoFile(README, lfs=False)})
        yield double


def _fetch(hub: HubDouble, models_dir: Path) -> tuple[WeightsFetch, Host]:
    commit, files = Hub(hub.endpoint).revision(REPO, "main")
    host = Host(name="here", address="127.0.0.1", transport="local", models_dir=str(models_dir))
    fetch = WeightsFetch(
        host="here", repo=REPO, commit=commit, dest=checkout_dir(str(models_dir), REPO, commit), files=list(files),
        total_bytes=sum(f.size for f in files),
    )  # fmt: skip
    return fetch, host


def _run(hub: HubDouble, fetch: WeightsFetch, host: Host, downloads: Downloads | None = None) -> tuple[str, list]:  # type: ignore[type-arg]
    seen: list[FetchProgress] = []
    got = fetch_weights(LocalTransport(host), fetch, host, downloads or Downloads(), hub.endpoint, None, seen.append)
    return got.digest, seen


def _file_gets(hub: HubDouble) -> list[str]:
    return [r.path for r in hub.requests if "/resolve/" in r.path]


def test_a_full_download_is_verified_put_in_place_whole_and_its_digest_measured(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    digest, seen = _run(hub, fetch, host)
    dest = Path(fetch.dest)
    assert (dest / "m.gguf").read_bytes() == BIG and (dest / "README.md").read_bytes() == README
    assert digest == checkpoint_digest({"m.gguf": hashlib.sha256(BIG).hexdigest(),
                                        "README.md": hashlib.sha256(README).hexdigest()})  # fmt: skip
    assert not Path(fetch.dest + ".partial").exists()
    assert dest.parent == tmp_path / "models" / "sources" / "org" / "model"
    assert oct((dest / "m.gguf").stat().st_mode & 0o777) == "0o644"  # the units' dynamic users read it
    assert seen[-1].done == seen[-1].total == len(BIG) + len(README)
    assert {p.file for p in seen} >= {"m.gguf", "README.md"}
    assert sorted(_file_gets(hub)) == sorted(f"/{REPO}/resolve/{fetch.commit}/{p}" for p in ("m.gguf", "README.md"))
    # in place: the next apply reads back the digest, fetching nothing
    hub.requests.clear()
    again, _ = _run(hub, fetch, host)
    assert again == digest and _file_gets(hub) == []


def test_a_download_past_the_cap_is_refused_with_the_figures_before_any_byte(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    sources = tmp_path / "models" / "sources" / "other"
    sources.mkdir(parents=True)
    (sources / "old.gguf").write_bytes(b"x" * 1_000_000)
    with pytest.raises(FetchFailed) as refused:
        _run(hub, fetch, host, Downloads(cap_bytes=3_500_000))
    said = str(refused.value)
    assert "the download of 3.0 MB would take all downloads to 4.0 MB, past the cap of 3.5 MB (1.0 MB already" in said
    assert "raise downloads.cap" in said
    assert _file_gets(hub) == [] and not Path(fetch.dest).exists()
    digest, _ = _run(hub, fetch, host, Downloads(cap_bytes=None))  # cap off
    assert Path(fetch.dest, "m.gguf").exists() and digest


def test_downloads_turned_off_are_refused(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    with pytest.raises(FetchFailed, match="downloads are off"):
        _run(hub, fetch, host, Downloads(enabled=False))
    assert _file_gets(hub) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB file system (tmpfs): smaller than the 3 MB download."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_download_larger_than_the_free_space_is_refused_with_the_figures(hub: HubDouble, small_disk: Path) -> None:
    fetch, host = _fetch(hub, small_disk / "models")
    with pytest.raises(FetchFailed, match=r"the download of 3\.0 MB does not fit: 2\.1 MB free; free some space"):
        _run(hub, fetch, host)
    assert _file_gets(hub) == []


def test_a_fetch_killed_mid_file_resumes_where_it_stopped(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    hub.rate = 1_000_000  # bytes/s: the 3 MB file takes 3 s
    proc = subprocess.Popen([PYTHON, "-I", "-S", "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(fetch_input(fetch, host, Downloads(), hub.endpoint, None))
    proc.stdin.close()
    part = Path(fetch.dest + ".partial") / "m.gguf.part"
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size > 500_000) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    had = part.stat().st_size
    assert 0 < had < len(BIG) and not Path(fetch.dest).exists()
    hub.rate = 0
    hub.requests.clear()
    digest, _ = _run(hub, fetch, host)
    ranges = [r.range for r in hub.requests if r.path.endswith("/m.gguf")]
    assert ranges == [f"bytes={had}-"]  # only the rest was asked for
    assert Path(fetch.dest, "m.gguf").read_bytes() == BIG and not part.exists()
    assert digest == checkpoint_digest({"m.gguf": hashlib.sha256(BIG).hexdigest(),
                                        "README.md": hashlib.sha256(README).hexdigest()})  # fmt: skip


def test_a_corrupted_file_is_refused_by_its_digest_and_never_put_in_place(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    bad = bytearray(BIG)
    bad[1_000_000] ^= 0xFF
    hub.repos[REPO].served["m.gguf"] = bytes(bad)  # same size, one byte changed on the way
    with pytest.raises(FetchFailed) as refused:
        _run(hub, fetch, host)
    said = str(refused.value)
    assert "m.gguf does not match the digest the hub gives" in said and hashlib.sha256(BIG).hexdigest() in said
    assert hashlib.sha256(bad).hexdigest() in said
    assert not Path(fetch.dest).exists() and not (Path(fetch.dest + ".partial") / "m.gguf.part").exists()


def test_a_git_file_is_verified_by_its_blob_id(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    hub.repos[REPO].served["README.md"] = README.replace(b"# m", b"# n")
    with pytest.raises(FetchFailed, match=r"README\.md does not match the digest the hub gives"):
        _run(hub, fetch, host)


def test_the_token_reaches_the_hub_and_never_the_command_line(tmp_path: Path) -> None:
    with HubDouble() as double:
        double.add(REPO, {"m.gguf": RepoFile(BIG[:1000])}, private_token="hf_secret_token")
        commit, files = Hub(double.endpoint, "hf_secret_token").revision(REPO, "main")
        host = Host(name="here", address="127.0.0.1", transport="local", models_dir=str(tmp_path))
        fetch = WeightsFetch(host="here", repo=REPO, commit=commit, dest=checkout_dir(str(tmp_path), REPO, commit),
                             files=list(files), total_bytes=1000)  # fmt: skip
        fetch_weights(LocalTransport(host), fetch, host, Downloads(), double.endpoint, "hf_secret_token",
                      lambda _p: None)  # fmt: skip
        assert double.tokens_seen.count("hf_secret_token") == 2  # the pin, then the file
    assert "hf_secret_token" not in BOOTSTRAP + PYTHON
    assert not any("hf_secret_token" in p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()
                   and p.suffix != ".gguf")  # fmt: skip


def test_a_checkpoint_changed_on_disk_is_drift_and_the_next_fetch_puts_it_right(hub: HubDouble, tmp_path: Path) -> None:
    fetch, host = _fetch(hub, tmp_path / "models")
    digest, _ = _run(hub, fetch, host)
    gguf = Path(fetch.dest, "m.gguf")
    facts = gather_one(LocalTransport(host), [str(gguf)])  # the real facts probe, as plan runs it
    assert facts.checkpoints == {fetch.dest: digest}
    changed = bytearray(gguf.read_bytes())
    changed[10] ^= 0xFF
    gguf.write_bytes(bytes(changed))
    measured = gather_one(LocalTransport(host), [str(gguf)]).checkpoints[fetch.dest]
    assert measured != digest
    state = State(deployments={"d": DeploymentRecord(
        name="d", model=Model(name="m", format="gguf", hf=HfRef(repo=REPO, commit=fetch.commit)),
        replicas=[ReplicaRecord(index=0, host="here", unit="engine-ctl-d-0a.service", port=8000, unit_sha256="",
                                revision=1, checkpoint_digest=digest)],
    )})  # fmt: skip
    inventory = Inventory(hosts=(host,))
    (drift,) = weights_drift(
        state, inventory, {"here": facts.model_copy(update={"checkpoints": {fetch.dest: measured}})}
    )
    assert drift.kind == "weights-changed" and drift.deployment == "d"
    assert f"recorded {digest[:12]}, measured {measured[:12]}" in drift.detail
    assert weights_drift(state, inventory, {"here": facts}) == []  # unchanged: no drift
    hub.requests.clear()
    again, _ = _run(hub, fetch, host)
    assert again == digest and gguf.read_bytes() == BIG
    assert [r.path for r in hub.requests if "/resolve/" in r.path] == [f"/{REPO}/resolve/{fetch.commit}/m.gguf"]


def test_a_checkpoint_file_replaced_with_its_size_and_mtime_kept_is_measured_again(
    hub: HubDouble, tmp_path: Path
) -> None:
    """Other bytes of the same size renamed over a checkout's file with its old mtime (`cp -p`, `rsync -a`): the
    probe re-hashes a file whose inode changed too (before: only size and mtime, so the digest read "unchanged").
    A file only hard-linked again (engine-ctl links shared files between checkouts) keeps its inode: not re-read."""
    fetch, host = _fetch(hub, tmp_path / "models")
    digest, _ = _run(hub, fetch, host)
    gguf = Path(fetch.dest, "m.gguf")
    os.link(gguf, tmp_path / "another-link")  # the link count moves, the inode does not
    assert gather_one(LocalTransport(host), [str(gguf)]).checkpoints == {fetch.dest: digest}
    before = gguf.stat()
    changed = bytearray(gguf.read_bytes())
    changed[10] ^= 0xFF
    swap = gguf.with_name(".swap")
    swap.write_bytes(bytes(changed))
    os.utime(swap, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(swap, gguf)
    assert (gguf.stat().st_size, gguf.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert gather_one(LocalTransport(host), [str(gguf)]).checkpoints[fetch.dest] != digest


def test_a_model_directory_other_users_may_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "snapshot"
    folder.mkdir()
    model = folder / "tiny.gguf"
    shutil.copy(tiny_model(), model)
    host = Host(name="here", address="127.0.0.1", transport="local", models_dir=str(tmp_path))
    folder.chmod(0o777)
    facts = gather_one(LocalTransport(host), [str(model)])
    assert facts.model_problems[str(model)] == (
        f"{folder} is writable by other users: refused; remove their write access (chmod o-w {folder})"
    )
    assert str(model) not in facts.models
    folder.chmod(0o1777)  # sticky, as /tmp: others cannot replace the files
    model.chmod(0o666)
    assert "writable by other users" in gather_one(LocalTransport(host), [str(model)]).model_problems[str(model)]
    model.chmod(0o644)
    folder.chmod(0o755)
    facts = gather_one(LocalTransport(host), [str(model)])
    assert str(model) in facts.models and not facts.model_problems
