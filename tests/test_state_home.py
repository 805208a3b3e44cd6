"""One state, found the same way by every command (issue 26): the state is engine-ctl.state.json in the project's
root, the directory of the documents (or the current one without documents) or the nearest directory above it
that holds an inventory or a state, as git finds its repository. `apply deploy/` and `status`, `list`, `logs`,
`stop`, `start`, `park` and `delete` run from the same directory use one state; a command that finds no state
never makes one; `stop NAME` is `stop deployment NAME`, as `status NAME` is `status deployment NAME`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engine_ctl.state import LocalState

from engine_ctl.core.record.model import DeploymentRecord, State
from tests.helpers import run

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The README's layout: hosts.yaml at the root, the documents in deploy/, commands run from the root."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("chat.yaml", "models.yaml"):
        shutil.copy(QUICKSTART / name, deploy / name)
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: box, transport: local}\n")
    monkeypatch.chdir(tmp_path)
    for variable in ("ENGINE_CTL_ENV", "ENGINE_CTL_STATE", "ENGINE_CTL_INVENTORY"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path


def recorded(directory: Path) -> None:
    """A state as apply leaves it, with one deployment that runs nowhere (so no host is asked)."""
    record = DeploymentRecord(name="chat", revision=1, state="Failed", reason="does not fit any host")
    LocalState(directory / "engine-ctl.state.json").write(State(deployments={"chat": record}))


def test_plan_of_deploy_uses_the_state_at_the_projects_root_beside_the_inventory(repo: Path) -> None:
    planned = run("plan", "deploy/", "--json")
    # 1 is the plan's answer where this machine has not got the weights in place yet (Pending); any other 1 is not
    waiting = planned.exit_code == 1 and "Waiting for the weights of tiny-llama" in planned.stdout
    assert planned.exit_code in (0, 2) or waiting, planned.output
    context = json.loads(planned.stdout)["context"]
    assert Path(context["state"]).resolve() == (repo / "engine-ctl.state.json").resolve(), context
    assert Path(context["inventory"]).resolve() == (repo / "hosts.yaml").resolve()


def test_status_list_logs_and_state_list_from_the_root_or_below_find_the_roots_state(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded(repo)
    for args in (("status", "chat"), ("status", "deployment", "chat"), ("status", "chat", "deploy/")):
        shown = run(*args)
        assert shown.exit_code == 0 and "Reason    does not fit any host" in shown.stdout, (args, shown.output)
    listed = run("list")
    assert listed.exit_code == 0 and listed.stdout.splitlines()[1].split()[:2] == ["chat", "failed"], listed.output
    assert run("state", "list").stdout.startswith("# engine-ctl.state.json: serial 1")
    assert "chat has no replicas recorded" in run("logs", "chat").stderr  # found it (it runs nowhere)
    monkeypatch.chdir(repo / "deploy")  # from below: found upwards
    assert "does not fit any host" in run("status", "chat").stdout
    assert "chat  revision 1" in run("state", "list").stdout
    assert not (repo / "deploy" / "engine-ctl.state.json").exists()


def test_a_verb_that_finds_no_state_refuses_and_never_makes_one(repo: Path) -> None:
    for verb in ("stop", "start", "park", "delete"):
        for args in ((verb, "chat"), (verb, "deployment", "chat")):
            refused = run(*args)
            assert refused.exit_code == 1, refused.output
            assert "No such command" not in refused.output  # `stop chat` is `stop deployment chat`
            assert "no state at engine-ctl.state.json" in refused.stderr, refused.stderr
            assert list(repo.glob("engine-ctl.state.json*")) == [], args
    assert "no state here: no deployment 'chat'" in run("status", "chat").stderr
    assert "No state at engine-ctl.state.json" in run("list").stdout
    assert list(repo.glob("**/engine-ctl.state.json*")) == []


def test_the_short_verb_forms_reach_the_state_as_the_long_ones(repo: Path) -> None:
    recorded(repo)
    for args in (("stop", "nope"), ("stop", "deployment", "nope"), ("park", "nope"), ("delete", "nope")):
        refused = run(*args, "--inventory", "hosts.yaml")
        assert refused.exit_code == 1 and "nope" in refused.stderr and "No such command" not in refused.output
    text = " ".join(run("stop", "--help").stdout.split())
    assert "`engine-ctl stop NAME` and `engine-ctl stop deployment NAME` are the same" in text


def test_the_walk_up_stops_at_a_repositorys_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: box, transport: local}\n")
    recorded(tmp_path)
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "deploy").mkdir()
    monkeypatch.chdir(project / "deploy")
    monkeypatch.delenv("ENGINE_CTL_STATE", raising=False)
    shown = run("list")
    assert shown.exit_code == 0 and "No state at engine-ctl.state.json" in shown.stdout, shown.output


def test_a_state_an_earlier_engine_ctl_wrote_beside_the_documents_is_named_with_the_move(repo: Path) -> None:
    recorded(repo / "deploy")  # where the rule before the project's root wrote it (hosts.yaml at the root)
    shown = run("status", "chat")
    assert shown.exit_code == 1
    assert "found deploy/engine-ctl.state.json below: move it here" in " ".join(shown.stderr.split()), shown.stderr
    assert "mv deploy/engine-ctl.state.json* ./" in shown.stderr
    assert "found deploy/engine-ctl.state.json below" in " ".join(run("stop", "chat").stderr.split())
    assert "Reason    does not fit any host" in run("status", "chat", "deploy/").stdout  # passed: still found there
