"""More than one environment from one repository: --env NAME (ENGINE_CTL_ENV) chooses hosts.NAME.yaml and a state
of its own; a hosts.yaml beside the documents is found without --inventory; the README and the PR example say
how. The hosts are this machine (transport: local), named differently in each environment's inventory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from engine_ctl.cli.environments import env_of_inventory, state_file_name, state_for_env
from tests.helpers import models_with_tiny, run

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"
PR_REVIEW = ROOT / "examples" / "pr-review"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository: deploy/ with the documents and one inventory per environment, no hosts.yaml."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("chat.yaml", "models.yaml"):
        shutil.copy(QUICKSTART / name, deploy / name)
    models = models_with_tiny(tmp_path)  # the weights are there: the plans are not Pending (exit 0)
    (deploy / "hosts.staging.yaml").write_text(f"defaults: {{models_dir: {models}}}\nhosts:\n"
                                               "  - {name: stage-box, transport: local}\n")  # fmt: skip
    (deploy / "hosts.production.yaml").write_text(f"defaults: {{models_dir: {models}}}\nhosts:\n"
                                                  "  - {name: prod-box, transport: local}\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for variable in ("ENGINE_CTL_ENV", "ENGINE_CTL_STATE", "ENGINE_CTL_INVENTORY"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path


def planned(*args: str) -> dict:  # type: ignore[type-arg]
    result = run("plan", "deploy", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def hosts_of(plan: dict) -> set[str]:  # type: ignore[type-arg]
    return {h for c in plan["changes"] for h in [*c["waiting"], *(r["host"] for r in c["replicas"])]}


def test_env_chooses_its_inventory_and_a_state_of_its_own(repo: Path) -> None:
    staging = planned("--env", "staging")
    assert staging["context"]["inventory"] == str(repo / "deploy" / "hosts.staging.yaml")
    assert staging["context"]["state"] == str(repo / "deploy" / "engine-ctl.staging.state.json")
    assert staging["context"]["env"] == "staging" and hosts_of(staging) == {"stage-box"}
    production = planned("--env", "production")
    assert production["context"]["inventory"] == str(repo / "deploy" / "hosts.production.yaml")
    assert production["context"]["state"] == str(repo / "deploy" / "engine-ctl.production.state.json")
    assert hosts_of(production) == {"prod-box"}


def test_the_plan_header_names_the_environment(repo: Path) -> None:
    """Issue 26: on hosts that environments share, the plan says which one it is for (terminal and Markdown)."""
    shown = run("plan", "deploy", "--env", "staging")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0] == "Environment: staging", shown.stdout
    markdown = run("plan", "deploy", "--env", "staging", "--markdown")
    assert markdown.stdout.startswith("### engine-ctl plan (`staging`):"), markdown.stdout
    plain = run("plan", "deploy", "--inventory", "deploy/hosts.staging.yaml")
    assert "Environment:" not in plain.stdout, plain.stdout


def test_engine_ctl_env_is_the_environment_and_the_flag_wins(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_CTL_ENV", "production")
    assert hosts_of(planned()) == {"prod-box"}
    assert hosts_of(planned("--env", "staging")) == {"stage-box"}
    listed = run("state", "list", "deploy")
    assert listed.output.startswith("# deploy/engine-ctl.production.state.json:"), listed.output


def test_without_env_another_environments_inventory_is_never_used(repo: Path) -> None:
    refused = run("plan", "deploy")
    assert refused.exit_code == 1
    assert "no inventory: no hosts.yaml in deploy" in refused.output
    assert "environments found: production, staging; choose one with --env NAME" in refused.output
    assert run("plan", "deploy", "--env", "qa").exit_code == 1  # an environment with no inventory: an error
    bad = run("plan", "deploy", "--env", "Prod!")
    assert bad.exit_code == 1 and "an environment is lowercase letters" in bad.output


def test_a_hosts_yaml_beside_the_documents_is_found_without_inventory(repo: Path, tmp_path: Path) -> None:
    models = repo / "models"
    (repo / "deploy" / "hosts.yaml").write_text(f"defaults: {{models_dir: {models}}}\nhosts:\n"
                                                "  - {name: beside, transport: local}\n")  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the directory, or the document files by name from another directory: the hosts.yaml beside them is used
    assert hosts_of(planned()) == {"beside"}
    by_file = run("plan", str(repo / "deploy" / "chat.yaml"), str(repo / "deploy" / "models.yaml"), "--json")
    assert by_file.exit_code == 0, by_file.output
    assert hosts_of(json.loads(by_file.stdout)) == {"beside"}
    assert hosts_of(planned("--env", "staging")) == {"stage-box"}  # an environment still takes its own


def test_an_explicit_state_becomes_the_environments_own_in_that_backend(repo: Path) -> None:
    listed = run("state", "list", "--state", str(repo / "shared.json"), "--env", "staging")
    assert listed.output.startswith(f"# {repo / 'shared.staging.json'}:"), listed.output
    assert state_for_env("postgresql://u@db/engine#prod", "staging") == "postgresql://u@db/engine#prod-staging"
    assert state_for_env("postgresql://u@db/engine", "production") == "postgresql://u@db/engine#production"
    assert state_for_env("/srv/state.json", None) == "/srv/state.json"
    assert state_file_name("staging", "engine-ctl.state.json") == "engine-ctl.staging.state.json"
    assert env_of_inventory("deploy/hosts.staging.yaml") == "staging" and env_of_inventory("hosts.yaml") is None


def test_a_saved_plan_is_applied_only_in_its_own_environment(repo: Path) -> None:
    saved = run("plan", "deploy", "--env", "staging", "--out", "staging.plan.json")
    assert saved.exit_code == 0, saved.output
    refused = run("apply", "staging.plan.json", "--env", "production")
    assert refused.exit_code == 1
    assert "the saved plan was made for staging, and this is production" in refused.output


def test_the_docs_say_how_environments_work_and_not_to_commit_the_state() -> None:
    readme = (ROOT / "docs" / "state.md").read_text()
    section = readme.split("## Environments", 1)[1].split("\n## ", 1)[0]
    for said in ("--env", "ENGINE_CTL_ENV", "hosts.staging.yaml", "engine-ctl.staging.state.json", ".gitignore"):
        assert said in section, said
    assert "engine-ctl*.state.json*" in section  # the line to put in .gitignore


def test_the_pr_example_plans_and_applies_staging_and_production() -> None:
    flow = YAML(typ="safe").load((PR_REVIEW / "workflow.yml").read_text())
    for job in ("plan", "apply"):
        assert flow["jobs"][job]["strategy"]["matrix"]["env"] == ["staging", "production"]
        assert flow["jobs"][job]["env"]["ENGINE_CTL_ENV"] == "${{ matrix.env }}"
    assert flow["jobs"]["apply"]["environment"] == "${{ matrix.env }}"  # GitHub's protection rules per env
    for env in ("staging", "production"):
        inventory = PR_REVIEW / f"hosts.{env}.yaml"
        assert inventory.is_file()
        checked = run("validate", "--inventory", str(inventory), str(PR_REVIEW / "deploy"))
        assert checked.exit_code == 0, checked.output
    assert "--env" in (PR_REVIEW / "README.md").read_text()


def test_validate_checks_spec_host_against_the_environments_inventory(repo: Path) -> None:
    chat = repo / "deploy" / "chat.yaml"
    chat.write_text(chat.read_text().replace("  accelerator: cpu\n", "  accelerator: cpu\n  host: stage-box\n"))
    assert run("validate", "deploy").exit_code == 0  # no default inventory: spec.host is checked at plan
    assert run("validate", "deploy", "--env", "staging").exit_code == 0
    wrong = run("validate", "deploy", "--env", "production")
    assert wrong.exit_code == 1
    assert 'spec.host "stage-box": no host of that name in the inventory' in wrong.output
    assert "hosts.production.yaml" in wrong.output
    none = run("validate", "deploy", "--env", "qa", "--json")
    assert none.exit_code == 1 and json.loads(none.stdout)["error"]["details"][0]["code"] == "no_inventory"


def test_the_pr_workflow_installs_from_a_checkout_and_keeps_the_key_off_the_runners_disk() -> None:
    flow = YAML(typ="safe").load((PR_REVIEW / "workflow.yml").read_text())
    for name in ("plan", "apply"):
        steps = flow["jobs"][name]["steps"]
        runs = "\n".join(s.get("run", "") for s in steps)
        installs = [s["run"] for s in steps if "pip install" in s.get("run", "")]
        assert installs == ["python3 -m venv .venv && .venv/bin/pip install './.engine-ctl[postgres]'"]
        checkout = next(s for s in steps if s.get("with", {}).get("path") == ".engine-ctl")
        assert (
            checkout["uses"].startswith("actions/checkout@")
            and "ENGINE_CTL_REPOSITORY" in checkout["with"]["repository"]
        )
        assert "ssh-add - <<<" in runs and "secrets.DEPLOY_SSH_KEY" in runs
        assert "id_ed25519" not in runs and "id_rsa" not in runs  # the key is never written to a file
        assert '~/.ssh/known_hosts <<< "${{ secrets.DEPLOY_KNOWN_HOSTS }}"' in runs
        last = steps[-1]
        assert last["if"] == "always()" and "ssh-agent -k" in last["run"]
