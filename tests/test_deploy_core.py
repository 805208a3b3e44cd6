"""`engine-ctl deploy model --file FILE`'s pure parts (engine_ctl.core.plan.deploy): seed 003's message blocks,
verbatim, the --revision check, the checkpoint's fingerprint (from the real sha256sum's output), and the refusals
the command makes before any host is asked. The fleet test is tests/test_fleet_deploy.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from engine_ctl.state import LocalState

from engine_ctl.cli.lifecycle_cmd import waiting_line
from engine_ctl.core.diagnostics import EXIT_STATUSES
from engine_ctl.core.plan.deploy import (
    BEING_MEASURED,
    SAVED,
    deployed_block,
    digest_text,
    fingerprint_script,
    is_saved,
    parse_fingerprint,
    revision_refusal,
    rows,
    saved_block,
    saved_verb,
    waiting_for_digest,
)
from engine_ctl.core.record.model import DeploymentRecord, OperatorAction, State
from engine_ctl.core.weights import checkpoint_digest
from tests.helpers import run

DIGEST = "ab" * 32


def test_the_created_block_is_the_seeds_with_its_hint_while_the_digest_is_measured() -> None:
    # seed 003, "Deploy and start": capyctl deploy model --file other-model.yaml
    shown = saved_block("other-model", "created", 1, "01M3R7A6YJW402N962HH17A66W", "01M3R7A6YJFV3HDFWQNZTWQTN0",
                        BEING_MEASURED)  # fmt: skip
    assert shown == [
        "Deployment other-model created (revision 1)",
        "",
        "  Deployment ID       01M3R7A6YJW402N962HH17A66W",
        "  Operation           01M3R7A6YJFV3HDFWQNZTWQTN0",
        "  Checkpoint digest   being measured",
        "the checkpoint digest of other-model is being measured; `engine-ctl start deployment other-model --wait` "
        "waits for it and starts the deployment",
    ]


def test_the_updated_block_shows_a_known_digest_and_no_hint() -> None:
    # seed 003: capyctl deploy model --file my-model.yaml --revision 1
    shown = saved_block("my-model", "updated", 2, "01M3R7A6YJW402N962HH17A66W", "01M3R7DDR0S1GTBW8DGQ55SPMG",
                        digest_text([DIGEST]))  # fmt: skip
    assert shown == [
        "Deployment my-model updated (revision 2)",
        "",
        "  Deployment ID       01M3R7A6YJW402N962HH17A66W",
        "  Operation           01M3R7DDR0S1GTBW8DGQ55SPMG",
        "  Checkpoint digest   abababababab",
    ]


def test_the_deployed_block_is_the_seeds() -> None:
    # seed 003: capyctl deploy model --file my-model.yaml --activate --wait
    assert deployed_block("my-model", 1, ["gpu-box"], 1, 1, "28.5 GiB", 26752, "initialize succeeded") == [
        "Deployed my-model: ready",
        "",
        "  Revision    1",
        "  Hosts       gpu-box",
        "  Ready       1/1",
        "  Startup     28.5 GiB",
        "  Context     26752 tokens",
        "  Operation   initialize succeeded",
    ]
    assert deployed_block("m", 1, [], 0, 1, "-", None, "")[0] == "Deployed m: not ready"


def test_rows_align_on_the_longest_label_plus_three_spaces() -> None:
    assert rows([("Ready", "1/1"), ("Operation", "x")]) == ["  Ready       1/1", "  Operation   x"]
    assert rows([]) == []


def test_the_digest_row_is_being_measured_until_every_replica_has_one() -> None:
    assert digest_text([]) == digest_text(["", DIGEST]) == BEING_MEASURED
    assert digest_text([DIGEST, DIGEST]) == "abababababab"
    assert digest_text([DIGEST, "cd" * 32]) == "abababababab, cdcdcdcdcdcd"


def test_the_waiting_line_is_the_seeds() -> None:
    said = "Waiting for the checkpoint digest of my-model to be measured (at most 900s)"
    assert waiting_for_digest("my-model") == waiting_line("digest", "my-model") == said
    assert waiting_line("stop", "m") == "Waiting for the stop of m to finish (at most 160s)"  # unchanged


def test_a_revision_check_passes_only_at_the_recorded_revision() -> None:
    rec = DeploymentRecord(name="my-model", revision=2)
    assert revision_refusal("my-model", None, rec, "s.json") is None
    assert revision_refusal("my-model", 2, rec, "s.json") is None
    stale = revision_refusal("my-model", 1, rec, "s.json")
    assert stale is not None and stale.code == "revision_mismatch" and EXIT_STATUSES[stale.code] == 26
    assert stale.message == ("my-model is at revision 2, not revision 1: a change was deployed since you read it; "
                             "nothing was changed")  # fmt: skip
    assert stale.hint is not None and "deploy again with --revision 2" in stale.hint
    new = revision_refusal("other", 1, None, "s.json")
    assert new is not None and "other is not deployed yet (revision 0)" in new.message
    assert revision_refusal("other", 0, None, "s.json") is None


def test_saved_means_held_stopped_by_a_deploy_and_not_started_since() -> None:
    held = OperatorAction(verb="stopped", when="2026-12-04T20:00:00+00:00")
    assert is_saved(DeploymentRecord(name="a", operator=held, last_operation=SAVED))
    assert not is_saved(DeploymentRecord(name="a", operator=held, last_operation="initialize succeeded"))
    assert not is_saved(DeploymentRecord(name="a", last_operation=SAVED))  # started: the hold is gone
    assert not is_saved(None)
    before, after = DeploymentRecord(name="a", revision=1), DeploymentRecord(name="a", revision=2)
    assert (saved_verb(None, before), saved_verb(before, after), saved_verb(after, after)) == (
        "created", "updated", "unchanged")  # fmt: skip


def test_the_fingerprint_of_a_file_and_of_a_directory_is_the_checkpoint_digest(tmp_path: Path) -> None:
    """The script runs here under the real sh and sha256sum, as it runs on a host."""
    gguf = tmp_path / "tiny" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (tmp_path / "tiny" / "other.gguf").write_bytes(b"not part of the checkpoint")
    out = subprocess.run(fingerprint_script(str(gguf)), capture_output=True, text=True, check=True).stdout
    assert parse_fingerprint(out) == checkpoint_digest({"tiny.gguf": hashlib.sha256(gguf.read_bytes()).hexdigest()})
    checkout = tmp_path / "weights dir"  # a space in the path: quoted
    (checkout / "sub").mkdir(parents=True)
    (checkout / "model.safetensors").write_bytes(b"w" * 1000)
    (checkout / "sub" / "config.json").write_text("{}")
    (checkout / ".marker").write_text("engine-ctl's own file: not the checkpoint's")
    out = subprocess.run(fingerprint_script(str(checkout)), capture_output=True, text=True, check=True).stdout
    files = {"model.safetensors": b"w" * 1000, "sub/config.json": b"{}"}
    assert parse_fingerprint(out) == checkpoint_digest({n: hashlib.sha256(b).hexdigest() for n, b in files.items()})
    assert parse_fingerprint("") is None and parse_fingerprint("not a digest  x\n") is None


# --- the command's refusals, before any host is asked -------------------------------------------------------
DOCS = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
CHAT = "metadata: {name: chat}\nspec: {model: tiny, accelerator: cpu}\n"


def _project(tmp_path: Path) -> Path:
    (tmp_path / "models.yaml").write_text(DOCS)
    (tmp_path / "chat.yaml").write_text(CHAT)
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: h1, address: 198.18.255.254}\n")
    return tmp_path


def test_a_stale_revision_is_refused_with_exit_26_and_nothing_changes(tmp_path: Path) -> None:
    _project(tmp_path)
    state_file = tmp_path / "engine-ctl.state.json"
    LocalState(state_file).write(State(deployments={"chat": DeploymentRecord(name="chat", revision=3)}))
    before = state_file.read_text()
    result = run("deploy", "model", "--file", str(tmp_path / "chat.yaml"), "--revision", "2")
    assert result.exit_code == 26, result.output
    assert result.stderr.startswith("Request identity: ")
    assert (f"{state_file}: error: chat is at revision 3, not revision 2: a change was deployed since you read it; "
            "nothing was changed") in result.stderr  # fmt: skip
    assert "hint: run `engine-ctl list` to see revision 3" in result.stderr
    assert state_file.read_text() == before


def test_a_held_deployment_parked_or_deleted_is_refused(tmp_path: Path) -> None:
    _project(tmp_path)
    parked = OperatorAction(verb="parked", when="2026-12-04T20:00:00+00:00")
    LocalState(tmp_path / "engine-ctl.state.json").write(
        State(deployments={"chat": DeploymentRecord(name="chat", revision=1, operator=parked)}))  # fmt: skip
    result = run("deploy", "model", "--file", str(tmp_path / "chat.yaml"))
    assert result.exit_code == 1, result.output
    assert "chat is parked by an operator; nothing was deployed" in result.stderr
    assert "run `engine-ctl start deployment chat` first" in result.stderr


def test_a_file_without_a_deployment_or_that_is_missing_is_a_clear_error(tmp_path: Path) -> None:
    _project(tmp_path)
    result = run("deploy", "model", "--file", str(tmp_path / "models.yaml"))
    assert result.exit_code == 1 and "models.yaml holds no deployment document" in result.stderr, result.output
    missing = run("deploy", "model", "--file", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "nope.yaml: no such file" in missing.stderr, missing.output
    assert not (tmp_path / "engine-ctl.state.json").exists()
    json.dumps(result.stderr)  # plain text, no traceback
    assert "Traceback" not in result.stderr + missing.stderr


def test_wait_without_activate_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    _project(tmp_path)
    result = run("deploy", "model", "--file", str(tmp_path / "chat.yaml"), "--wait")
    assert result.exit_code == 1, result.output
    assert "--wait: error: --wait waits for the start, and deploy starts nothing without --activate" in result.stderr
    assert "start it later with `engine-ctl start deployment NAME --wait`" in result.stderr
    assert not (tmp_path / "engine-ctl.state.json").exists()
