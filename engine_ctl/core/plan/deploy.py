"""`engine-ctl deploy model --file FILE`: seed 003's deploy, which separates saving a revision from starting it.
Pure: values in, values out (the shell is engine_ctl.cli.deploy_cmd).

- Without --activate, deploy saves the revision: its units are written and loaded, never started, and the
  deployment is held stopped (core.plan.operator) with LAST OPERATION `saved, not started`: the gateway answers its
  requests with deployment_stopped, and `engine-ctl start deployment NAME [--wait]` starts it. A deployment that
  already runs is updated as apply updates it (a change restarts its engine).
- With --activate, deploy is apply for the file's deployments, and it returns when the model answers.
- --revision N: optimistic concurrency. The update goes ahead only while the recorded revision is still N (the
  REVISION column of `engine-ctl list`); otherwise revision_mismatch (exit 26), and nothing is changed.
- A first start fingerprints the checkpoint: the checkpoint digest (core.weights.checkpoint_digest: sha256 over
  each file's path and sha256) of a model engine-ctl did not fetch is measured on the host before it starts.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable, Sequence

from engine_ctl.core.diagnostics import Diagnostic, Location
from engine_ctl.core.record.model import SHA256, DeploymentRecord
from engine_ctl.core.weights import checkpoint_digest

SAVED = "saved, not started"
"""The LAST OPERATION of a deployment deploy saved without starting it (its operator hold is `stopped`)."""
DIGEST_WAIT_S = 900
"""Seed 003: how long a start waits for the checkpoint digest to be measured."""
BEING_MEASURED = "being measured"


def is_saved(rec: DeploymentRecord | None) -> bool:
    """A deployment deploy saved and nothing has started since (start clears its hold)."""
    held = rec.operator if rec is not None else None
    return held is not None and held.verb == "stopped" and rec is not None and rec.last_operation == SAVED


def rows(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Seed 003's two aligned columns: each label, padded to the longest one and three spaces, then its value."""
    width = max((len(label) for label, _ in pairs), default=0) + 3
    return [f"  {label.ljust(width)}{value}".rstrip() for label, value in pairs]


def digest_text(digests: Iterable[str]) -> str:
    """The Checkpoint digest row: the digest (its first 12 hex digits, as the plan shows it), several when the
    hosts measured different files, or `being measured` while any replica's is not known yet."""
    found = list(digests)
    if not found or any(not d for d in found):
        return BEING_MEASURED
    return ", ".join(d[:12] for d in dict.fromkeys(found))


def digest_hint(name: str, digest: str) -> str | None:
    """The seed's line under a saved deployment whose checkpoint digest is not known yet."""
    if digest != BEING_MEASURED:
        return None
    return (f"the checkpoint digest of {name} is being measured; `engine-ctl start deployment {name} --wait` waits "
            "for it and starts the deployment")  # fmt: skip


def saved_block(name: str, verb: str, revision: int, deployment_id: str, operation: str,
                digest: str) -> list[str]:  # fmt: skip
    """`Deployment NAME created (revision 1)` (`verb`: created, updated, or unchanged when its documents did not
    change), its ID, the operation, the checkpoint digest, and while the digest is not known, the hint."""
    head = f"Deployment {name} {verb} (revision {revision})"
    out = [head, "", *rows([("Deployment ID", deployment_id), ("Operation", operation), ("Checkpoint digest",
                                                                                          digest)])]  # fmt: skip
    hint = digest_hint(name, digest)
    return [*out, hint] if hint else out


def saved_verb(before: DeploymentRecord | None, after: DeploymentRecord) -> str:
    """created (it was not recorded), updated (its revision moved) or unchanged."""
    if before is None:
        return "created"
    return "updated" if after.revision != before.revision else "unchanged"


def deployed_block(name: str, revision: int, hosts: Sequence[str], ready: int, replicas: int, startup: str,
                   context: int | None, operation: str) -> list[str]:  # fmt: skip
    """`Deployed NAME: ready` and its rows, after deploy --activate."""
    state = "ready" if replicas and ready >= replicas else "not ready"
    return [f"Deployed {name}: {state}", "", *rows([
        ("Revision", str(revision)), ("Hosts", ", ".join(hosts) or "-"), ("Ready", f"{ready}/{replicas}"),
        ("Startup", startup), ("Context", f"{context} tokens" if context else "-"), ("Operation", operation or "-"),
    ])]  # fmt: skip


def waiting_for_digest(name: str) -> str:
    return f"Waiting for the checkpoint digest of {name} to be measured (at most {DIGEST_WAIT_S}s)"


def revision_refusal(name: str, given: int | None, recorded: DeploymentRecord | None, where: str) -> Diagnostic | None:
    """--revision N against the recorded revision (0: not recorded yet): revision_mismatch (exit 26) when someone
    deployed a change since it was read, or when it names a revision of a deployment that does not exist yet."""
    if given is None:
        return None
    have = recorded.revision if recorded is not None else 0
    if have == given:
        return None
    now = f"at revision {have}" if have else "not deployed yet (revision 0)"
    hint = (f"run `engine-ctl list` to see revision {have}, check what changed since, then deploy again with "
            f"--revision {have}" if have else "leave --revision out to create it")  # fmt: skip
    return Diagnostic(Location(where), "", f"{name} is {now}, not revision {given}: a change was deployed since you "
                      "read it; nothing was changed", hint=hint, code="revision_mismatch")  # fmt: skip


# --- fingerprinting a checkpoint on its host ------------------------------------------------------------------
def fingerprint_script(path: str) -> list[str]:
    """The sha256 of each file of the checkpoint at `path` (a .gguf file, or a directory of files), as
    `sha256sum` prints them, each path relative to the checkpoint's directory."""
    q = shlex.quote(path)
    each = "find . -type f ! -name '.*' -print0 | sort -z | xargs -0 -r sha256sum"
    one = 'cd "$(dirname "$p")" && sha256sum -- "./$(basename "$p")"'
    return ["sh", "-c", f'p={q}; if [ -d "$p" ]; then cd "$p" && {each}; else {one}; fi']


def parse_fingerprint(output: str) -> str | None:
    """fingerprint_script's output -> the checkpoint digest (None when it lists no file or a line is not
    sha256sum's)."""
    files: dict[str, str] = {}
    for line in output.splitlines():
        digest, _, name = line.partition("  ")
        if not SHA256.fullmatch(digest) or not name:
            return None
        files[posixpath.normpath(name.removeprefix("./"))] = digest
    return checkpoint_digest(files) if files else None


__all__ = [
    "BEING_MEASURED", "DIGEST_WAIT_S", "SAVED", "deployed_block", "digest_text", "fingerprint_script", "is_saved",
    "parse_fingerprint", "revision_refusal", "rows", "saved_block", "saved_verb", "waiting_for_digest",
]  # fmt: skip
