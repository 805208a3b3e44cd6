"""hf: references pinned at plan: the pure parts (the hub's answer parsed, the files chosen, the documents pinned,
the figures a download is refused with) and the hub client against the hub double (tests/hubdouble.py, whose
shapes come from huggingface_hub's source and are checked against its client in tests/test_hub_double.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import DEFAULT_DOWNLOAD_CAP, load_inventory
from engine_ctl.core.model import HfRef, Model
from engine_ctl.core.weights import (
    HubError,
    HubFile,
    checkpoint_digest,
    parse_revision_info,
    refusal,
    safe_repo_path,
    select_files,
    waiting_reason,
)
from engine_ctl.shell.hub import Hub
from engine_ctl.shell.pinning import Pinner
from tests.helpers import load, messages, run, write
from tests.hubdouble import HubDouble, RepoFile

GGUF = os.urandom(200_000)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FLAT = """
name: tiny-hf
engine: llamacpp
model: {hf: org/tiny}
engine_config: {llamacpp: {gguf_file: tiny.gguf}}
"""


def _double() -> HubDouble:
    hub = HubDouble()
    hub.add("org/tiny", {"tiny.gguf": RepoFile(GGUF), "README.md": RepoFile(b"# tiny\n", lfs=False)}, commit=COMMIT)
    return hub


def test_the_hubs_model_info_gives_the_commit_and_each_files_size_and_digest() -> None:
    lfs = "a" * 64
    body = {"id": "org/m", "sha": COMMIT, "siblings": [
        {"rfilename": "m.gguf", "size": 10, "blobId": "b" * 40, "lfs": {"sha256": lfs, "size": 10, "pointerSize": 9}},
        {"rfilename": "config.json", "size": 3, "blobId": "c" * 40},
    ]}  # fmt: skip
    commit, files = parse_revision_info("org/m", body)
    assert commit == COMMIT
    assert files == (
        HubFile(path="m.gguf", size=10, sha256=lfs),
        HubFile(path="config.json", size=3, git_blob="c" * 40),
    )


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"sha": "main", "siblings": []}, "names no commit"),
        ({"sha": COMMIT}, "no file list"),
        ({"sha": COMMIT, "siblings": [{"rfilename": "x"}]}, "no size and blob id"),
        ({"sha": COMMIT, "siblings": [{"rfilename": "../etc/passwd", "size": 1, "blobId": "c" * 40}]}, "outside"),
        ({"sha": COMMIT, "siblings": [{"rfilename": "a", "size": 1, "lfs": {"sha256": "x", "size": 1}}]}, "LFS"),
    ],
)
def test_an_answer_that_is_not_the_hubs_shape_is_refused_with_why(body: dict, said: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(HubError, match=said):
        parse_revision_info("org/m", body)


def test_only_plain_relative_paths_may_land_under_the_checkout() -> None:
    assert safe_repo_path("tiny.gguf") and safe_repo_path("sub/model-00001-of-00002.safetensors")
    for bad in ("/etc/passwd", "../x", "a/../../x", ".git/config", "a//b", "a/./b", "", "a b"):
        assert not safe_repo_path(bad), bad


def test_the_files_a_host_fetches_are_the_gguf_named_or_the_safetensors_checkpoint() -> None:
    files = [HubFile(path=p, size=1, git_blob="c" * 40) for p in
             ("a.gguf", "b.gguf", "config.json", "model.safetensors", "pytorch_model.bin", "README.md")]  # fmt: skip
    gguf = Model(name="m", format="gguf", hf=HfRef(repo="o/m"), file="b.gguf")
    assert [f.path for f in select_files(gguf, files)] == ["b.gguf"]
    with pytest.raises(HubError, match="has 2 GGUF files"):
        select_files(gguf.model_copy(update={"file": None}), files)
    with pytest.raises(HubError, match=r"no file 'c\.gguf'"):
        select_files(gguf.model_copy(update={"file": "c.gguf"}), files)
    st = Model(name="m", format="safetensors", hf=HfRef(repo="o/m"))
    assert [f.path for f in select_files(st, files)] == ["config.json", "model.safetensors", "README.md"]


def test_the_refusals_give_the_figures() -> None:
    g = 1000**3
    assert refusal(10 * g, 100 * g, 0, 500 * 1024**3) is None
    assert refusal(10 * g, 5 * g, 0, None) == "the download of 10.0 GB does not fit: 5.0 GB free; free some space"
    capped = refusal(10 * g, 100 * g, 495 * g, 500 * g)
    assert capped is not None and "505.0 GB, past the cap of 500.0 GB (495.0 GB already downloaded)" in capped
    assert waiting_reason(3_100_000_000, 8_000_000_000) == "Waiting for the weights: 3.1 of 8.0 GB"
    assert waiting_reason(8_400_000, 17_000_000) == "Waiting for the weights: 8.4 of 17.0 MB"


def test_the_checkpoint_digest_depends_on_every_file_and_not_on_order() -> None:
    a = checkpoint_digest({"x": "1" * 64, "y": "2" * 64})
    assert a == checkpoint_digest({"y": "2" * 64, "x": "1" * 64})
    assert a != checkpoint_digest({"x": "1" * 64, "y": "3" * 64})
    assert a != checkpoint_digest({"x": "1" * 64, "z": "2" * 64})


def test_the_hub_client_resolves_the_default_branch_to_its_commit_and_lists_the_files() -> None:
    with _double() as double:
        commit, files = Hub(double.endpoint).revision("org/tiny", "main")
        again = Hub(double.endpoint).revision("org/tiny", COMMIT)
    assert commit == COMMIT and again[0] == COMMIT
    by_path = {f.path: f for f in files}
    assert by_path["tiny.gguf"].sha256 == RepoFile(GGUF).sha256 and by_path["tiny.gguf"].size == len(GGUF)
    assert by_path["README.md"].git_blob == RepoFile(b"# tiny\n", lfs=False).blob_id
    assert double.requests[0].path == "/api/models/org/tiny/revision/main"


def test_hf_endpoint_is_honoured_and_the_token_is_sent_but_never_said() -> None:
    with HubDouble() as double:
        double.add("org/private", {"m.gguf": RepoFile(GGUF)}, private_token="hf_right")
        env = {"HF_ENDPOINT": double.endpoint + "/", "HF_TOKEN": "hf_wrong"}
        hub = Hub.from_environment(env)
        assert hub.endpoint == double.endpoint and "hf_wrong" not in repr(hub)
        with pytest.raises(HubError) as refused:
            hub.revision("org/private", "main")
        assert "HTTP 401" in str(refused.value) and "hf_wrong" not in str(refused.value)
        with pytest.raises(HubError, match="a gated or private repository; set HF_TOKEN"):
            Hub(double.endpoint).revision("org/private", "main")
        assert Hub.from_environment({**env, "HF_TOKEN": "hf_right"}).revision("org/private", "main")[0]
        assert double.tokens_seen == ["hf_wrong", "hf_right"]
        with pytest.raises(HubError, match="no model repository or revision org/nothing@main"):
            hub.revision("org/nothing", "main")


def test_an_unreachable_hub_says_so_and_how_to_do_without_it() -> None:
    with pytest.raises(HubError, match=r"could not be reached to pin org/tiny@main.*pin the commit yourself"):
        Hub("http://127.0.0.1:9", timeout=2, backoff_s=0.01).revision("org/tiny", "main")  # retried, quickly


def test_the_pinner_writes_the_commit_into_the_documents_and_keeps_the_files() -> None:
    result, _ = load(FLAT)
    assert "validate works offline" in " ".join(messages(load(FLAT)[1]))  # unpinned: refused offline
    with _double() as double:
        pinner = Pinner(Hub(double.endpoint))
        pinned, problems = pinner(result.desired)
    assert problems == []
    (model,) = [m.model for m in pinned.models]
    assert model.hf == HfRef(repo="org/tiny", commit=COMMIT)
    checkout = pinner.checkouts[model.name]
    assert checkout.ref == f"org/tiny@{COMMIT}" and [f.path for f in checkout.files] == ["tiny.gguf"]


def test_a_reference_the_hub_does_not_know_is_an_error_at_its_field() -> None:
    result, _ = load(FLAT.replace("org/tiny", "org/gone"))
    with _double() as double:
        pinned, problems = Pinner(Hub(double.endpoint))(result.desired)
    (problem,) = problems
    assert problem.field == "model.hf" and problem.location.line == 4 and "HTTP 404" in problem.message
    assert pinned.models[0].model.hf == HfRef(repo="org/gone")


def test_validate_stays_offline_and_refuses_an_unpinned_reference(tmp_path: Path) -> None:
    doc = write(tmp_path, "d.yaml", FLAT)
    out = run("validate", str(doc), "--json")
    assert out.exit_code == 1 and "no commit; validate works offline" in out.output


def test_the_inventory_sets_the_download_cap_or_turns_downloads_off(tmp_path: Path) -> None:
    hosts = "hosts:\n  - {name: a, transport: local}\n"
    assert load_inventory(write(tmp_path, "h0.yaml", hosts)).downloads.cap_bytes == DEFAULT_DOWNLOAD_CAP
    capped = load_inventory(write(tmp_path, "h1.yaml", "downloads: {cap: 20GiB}\n" + hosts)).downloads
    assert capped.enabled and capped.cap_bytes == 20 * 1024**3
    assert load_inventory(write(tmp_path, "h2.yaml", "downloads: {cap: off}\n" + hosts)).downloads.cap_bytes is None
    assert not load_inventory(write(tmp_path, "h3.yaml", "downloads: {enabled: false}\n" + hosts)).downloads.enabled
    bad = run("facts", "--inventory", str(write(tmp_path, "h4.yaml", "downloads: {cap: lots}\n" + hosts)))
    assert bad.exit_code == 1 and "h4.yaml:1" in bad.output and "downloads.cap" in bad.output
