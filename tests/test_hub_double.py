"""The hub double (tests/hubdouble.py) speaks the hub's real API: the real huggingface_hub client reads it.
huggingface_hub is the hub's own client (github.com/huggingface/huggingface_hub); if it parses the double's
answers as it parses huggingface.co's, the shapes engine-ctl's tests rely on are the hub's."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download

from tests.hubdouble import HubDouble, RepoFile

GGUF = os.urandom(300_000)
README = b"# a model\n"


def test_model_info_at_a_revision_reads_the_commit_and_every_file_with_its_size_and_digest() -> None:
    with HubDouble() as hub:
        repo = hub.add("org/model", {"m.gguf": RepoFile(GGUF), "README.md": RepoFile(README, lfs=False)})
        info = HfApi(endpoint=hub.endpoint).model_info("org/model", revision="main", files_metadata=True)
    assert info.id == "org/model" and info.sha == repo.commit
    by_name = {s.rfilename: s for s in info.siblings or []}
    assert by_name["m.gguf"].size == len(GGUF) and by_name["m.gguf"].lfs is not None
    assert by_name["m.gguf"].lfs.sha256 == RepoFile(GGUF).sha256
    assert by_name["README.md"].lfs is None and by_name["README.md"].blob_id == RepoFile(README, lfs=False).blob_id
    assert hub.requests[0].path == "/api/models/org/model/revision/main"


def test_hf_hub_download_fetches_a_file_at_the_commit_from_the_double(tmp_path: Path) -> None:
    with HubDouble() as hub:
        repo = hub.add("org/model", {"m.gguf": RepoFile(GGUF)})
        path = hf_hub_download(
            "org/model", "m.gguf", revision=repo.commit, endpoint=hub.endpoint, cache_dir=tmp_path, token=False
        )
    assert Path(path).read_bytes() == GGUF
    assert repo.commit in path  # the client filed it under the commit the double's X-Repo-Commit named


def test_a_private_repository_refuses_without_its_token() -> None:
    import pytest
    from huggingface_hub.errors import HfHubHTTPError

    with HubDouble() as hub:
        hub.add("org/private", {"m.gguf": RepoFile(GGUF)}, private_token="hf_secret")
        api = HfApi(endpoint=hub.endpoint)
        with pytest.raises(HfHubHTTPError):
            api.model_info("org/private", revision="main", token=False)
        assert api.model_info("org/private", revision="main", token="hf_secret").private is True
