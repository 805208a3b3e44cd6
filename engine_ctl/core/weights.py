"""`hf:` weights: a Hugging Face reference pinned to a commit, the files of that commit a host fetches, and the
figures a fetch is checked against. Pure: the hub's answers come in as values (engine_ctl.shell.hub asks for
them) and pinned documents go out.

The hub's answer is that of GET /api/models/{repo}/revision/{revision}?blobs=true, as huggingface_hub reads it
(src/huggingface_hub/hf_api.py: HfApi.model_info with files_metadata=True, ModelInfo and RepoSibling): `sha` is
the commit, `siblings` the files, each with `rfilename`, `size`, `blobId` (the git blob id) and, for a file kept
in Git LFS, `lfs: {sha256, size, pointerSize}`."""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.model import DesiredState, HfRef, LoadedModel, Model

COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_BLOB = re.compile(r"^[0-9a-f]{40}$")
SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")
OTHER_WEIGHT_FORMATS = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot", ".tflite", ".ckpt", ".gguf")
"""A safetensors checkpoint is fetched without its copies in other formats (as huggingface_hub's
ignore_patterns are commonly used): weights engine-ctl would never serve are never downloaded."""


class HubError(Exception):
    """The hub's answer cannot be used; the message says why and what to do."""


class HubFile(BaseModel):
    """One file of a commit: its path in the repository, its size, and the digest it is verified against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int
    sha256: str | None = None
    """The LFS sha256 (the content's own sha256), for a file kept in Git LFS."""
    git_blob: str | None = None
    """The git blob id (sha1 of "blob <size>\\0" + content), for a file kept in git itself."""


class Checkout(BaseModel):
    """The files of `repo` at `commit` that a host fetches for a model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.commit}"


def revision_of(ref: HfRef) -> str:
    """What the hub is asked to resolve: the commit written in the document, else the default branch."""
    return ref.commit or "main"


def pin(desired: DesiredState, commits: Mapping[str, str]) -> DesiredState:
    """The documents with every hf: reference pinned: `commits` maps a reference as written (org/repo or
    org/repo@rev) to the commit the hub resolved it to. A reference not in `commits` stays as it is."""

    def pinned(loaded: LoadedModel) -> LoadedModel:
        hf = loaded.model.hf
        if hf is None or str(hf) not in commits:
            return loaded
        model = loaded.model.model_copy(update={"hf": HfRef(repo=hf.repo, commit=commits[str(hf)])})
        return loaded.model_copy(update={"model": model})

    return desired.model_copy(update={"models": tuple(pinned(m) for m in desired.models)})


def _sibling(raw: Any, repo: str) -> HubFile:
    if not isinstance(raw, dict) or not isinstance(raw.get("rfilename"), str):
        raise HubError(f"the hub's file list of {repo} has an entry without rfilename: {str(raw)[:120]}")
    path = raw["rfilename"]
    lfs = raw.get("lfs")
    if isinstance(lfs, dict):
        size, sha = lfs.get("size"), lfs.get("sha256")
        if not isinstance(size, int) or not isinstance(sha, str) or not SHA256.match(sha):
            raise HubError(f"the hub gives {repo}'s {path} no usable LFS size and sha256")
        return HubFile(path=path, size=size, sha256=sha)
    size, blob = raw.get("size"), raw.get("blobId")
    if not isinstance(size, int) or not isinstance(blob, str) or not GIT_BLOB.match(blob):
        raise HubError(f"the hub gives {repo}'s {path} no size and blob id (was the model info asked with blobs=true?)")
    return HubFile(path=path, size=size, git_blob=blob)


def safe_repo_path(path: str) -> bool:
    """A path the hub names may only ever land under the checkout's directory: relative, no `..`, no dot files,
    each part of plain characters."""
    parts = path.split("/")
    return not path.startswith("/") and posixpath.normpath(path) == path and all(SAFE_PART.match(p) for p in parts)


def parse_revision_info(repo: str, body: Any) -> tuple[str, tuple[HubFile, ...]]:
    """The commit and the files from the hub's model info at a revision; HubError when it is not that."""
    if not isinstance(body, dict):
        raise HubError(f"the hub's answer for {repo} is not a model info object")
    commit = body.get("sha")
    if not isinstance(commit, str) or not COMMIT.match(commit):
        raise HubError(f"the hub's answer for {repo} names no commit (sha: {commit!r})")
    siblings = body.get("siblings")
    if not isinstance(siblings, list):
        raise HubError(f"the hub's answer for {repo} has no file list (siblings)")
    files = tuple(_sibling(s, repo) for s in siblings)
    unsafe = [f.path for f in files if not safe_repo_path(f.path)]
    if unsafe:
        raise HubError(f"the hub names a file of {repo} that would land outside its directory: {unsafe[0]!r}")
    return commit, files


def select_files(model: Model, files: Iterable[HubFile]) -> tuple[HubFile, ...]:
    """The files a host needs for the model: its GGUF file, or the safetensors checkpoint with its
    configuration and tokenizer (not the same weights in other formats). HubError when they are not there."""
    files = tuple(files)
    repo = model.hf.repo if model.hf else model.name
    if model.format == "gguf":
        ggufs = [f for f in files if f.path.endswith(".gguf")]
        wanted = model.file or (ggufs[0].path if len(ggufs) == 1 else None)
        if wanted is None:
            listed = ", ".join(f.path for f in ggufs[:8]) or "none"
            raise HubError(f"{repo} has {len(ggufs)} GGUF files ({listed}); say which one (the model's file, "
                           "or the GGUF file in the deployment's engine_config)")  # fmt: skip
        chosen = tuple(f for f in files if f.path == wanted)
        if not chosen:
            raise HubError(f"{repo} has no file {wanted!r} at this commit")
        extra = tuple(f for f in files if model.mmproj and f.path == model.mmproj)
        return chosen + extra
    chosen = tuple(f for f in files if not f.path.endswith(OTHER_WEIGHT_FORMATS) and not f.path.startswith("."))
    if not any(f.path.endswith(".safetensors") for f in chosen):
        raise HubError(f"{repo} has no .safetensors file at this commit")
    return chosen


def checkout_dir(models_dir: str, repo: str, commit: str) -> str:
    """Where a host keeps the checkout: <models_dir>/sources/<org>/<repo>/<commit> (what units point at)."""
    return posixpath.join(models_dir, "sources", repo, commit)


def is_checkout(repo: str, commit: str, path: str, models_dir: str) -> bool:
    """Whether `path` is exactly the checkout of `repo` at `commit` under the host's models folder
    (<models_dir>/sources/<org>/<repo>/<commit>): nothing else is ever deleted as one."""
    parts = repo.split("/")
    named = len(parts) == 2 and all(SAFE_PART.match(x) for x in parts) and COMMIT.match(commit) is not None
    return named and path == checkout_dir(models_dir, repo, commit)


def checkpoint_digest(file_digests: Mapping[str, str]) -> str:
    """The checkpoint's digest: sha256 over each file's path and content sha256, in path order. The host
    measures each file; the same files always give the same digest, any changed byte another one."""
    text = "".join(f"{file_digests[p]}  {p}\n" for p in sorted(file_digests))
    return hashlib.sha256(text.encode()).hexdigest()


UNITS = ((1000**4, "TB"), (1000**3, "GB"), (1000**2, "MB"), (1000, "kB"))


def unit_for(n_bytes: int) -> tuple[int, str]:
    return next(((f, u) for f, u in UNITS if n_bytes >= f), (1, "B"))


def human(n_bytes: int) -> str:
    """A size in decimal units, as the hub and disk tools show them: 3.1 GB, 17.0 MB."""
    factor, unit = unit_for(n_bytes)
    return f"{n_bytes / factor:.1f} {unit}"


def refusal(need: int, free: int | None, used: int, cap: int | None) -> str | None:
    """Why a download of `need` bytes is refused, with the figures; None when it fits. `used` is what the
    sources directory already holds (counted against the cap), `free` the file system's free bytes."""
    if cap is not None and used + need > cap:
        return (f"the download of {human(need)} would take all downloads to {human(used + need)}, past the cap "
                f"of {human(cap)} ({human(used)} already downloaded); raise downloads.cap in the inventory or free "
                "space under sources/")  # fmt: skip
    if free is not None and need > free:
        return f"the download of {human(need)} does not fit: {human(free)} free; free some space"
    return None


def waiting_reason(done: int, total: int) -> str:
    """A replica's reason while its weights come in (seed: Pending, waiting for the weights)."""
    factor, unit = unit_for(total)
    return f"Waiting for the weights: {done / factor:.1f} of {total / factor:.1f} {unit}"


class WeightsFetch(BaseModel):
    """In a plan: the checkout a host fetches before the deployment's new replicas start there."""

    model_config = ConfigDict(extra="forbid")

    host: str
    repo: str
    commit: str
    dest: str
    files: list[HubFile]
    total_bytes: int
    in_place: bool = False
    """The facts found the weights at `dest` already: apply only reads back their checkpoint digest."""
    digest: str | None = None
    """The checkpoint digest recorded for this host; None until measured there ("digest pending")."""
