"""Issue 29: checkouts of hf: weights no deployment uses any more are pruned by apply, and the plan says how much
disk that frees. The rule (engine_ctl.core.plan.prune) is pure and tested on values here; the facts probe's
listing runs on a real directory tree with real hard links; the host-side delete runs in a real shell. The whole
path runs on the fleet in tests/test_fleet_weights.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from engine_ctl.cli.views.plan import plan_markdown, render_plan
from engine_ctl.core.fit.hostfacts import CheckoutFact, HostFacts, UnitFact
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.changes import DeploymentChange, Plan, Prune
from engine_ctl.core.plan.prune import names_path, prunes
from engine_ctl.core.weights import is_checkout
from engine_ctl.shell.remote.facts_probe import MARKER, checkouts
from engine_ctl.shell.systemd import PRUNE_NAMED, prune_checkout
from tests.fleetfacts import cpu_host
from tests.helpers import load

OLD, NEW = "a" * 40, "b" * 40
SOURCES = "/var/lib/engine-ctl/models/sources"
DOCS = f"""
kind: Model
metadata: {{name: tiny}}
spec: {{format: gguf, hf: "org/tiny@{NEW}", file: tiny.gguf, parameters: 4170048, context_length: 2048}}
---
metadata: {{name: chat}}
spec: {{model: tiny, accelerator: cpu, context_length: 512}}
"""


def _desired() -> DesiredState:
    result, problems = load(DOCS)
    assert [p for p in problems if p.severity == "error"] == [], problems
    return result.desired


def _checkout(commit: str, freed: int = 1000) -> CheckoutFact:
    return CheckoutFact(path=f"{SOURCES}/org/tiny/{commit}", repo="org/tiny", commit=commit, bytes=2000,
                        freed_bytes=freed)  # fmt: skip


def _unit(deployment: str, commit: str, text: bool = True) -> UnitFact:
    body = f"ExecStart=/usr/bin/llama-server -m {SOURCES}/org/tiny/{commit}/tiny.gguf --port 8001\n"
    return UnitFact(name=f"engine-ctl-{deployment}-0a.service", text=body if text else None)


def _host(*units: UnitFact, checkouts_: tuple[CheckoutFact, ...] = ()) -> dict[str, HostFacts]:
    return {"cpu-01": cpu_host("cpu-01").model_copy(update={"units": units, "checkouts": checkouts_})}


def test_the_old_commit_of_a_deployment_this_apply_rolls_is_pruned_the_documents_commit_is_kept() -> None:
    facts = _host(_unit("chat", OLD), checkouts_=(_checkout(OLD, 1234), _checkout(NEW)))
    (prune,) = prunes(_desired(), [DeploymentChange(name="chat", action=["update"])], facts)
    assert prune == Prune(
        host="cpu-01", repo="org/tiny", commit=OLD, path=f"{SOURCES}/org/tiny/{OLD}", freed_bytes=1234
    )


def test_a_checkout_a_unit_outside_the_roll_still_names_is_kept() -> None:
    facts = _host(_unit("chat", OLD), _unit("other", OLD), checkouts_=(_checkout(OLD),))
    rolled = [DeploymentChange(name="chat", action=["update"])]
    assert prunes(_desired(), rolled, facts) == []  # `other` is not converged by this apply: its weights stay


def test_held_pending_failed_or_blocked_deployments_keep_what_their_units_name() -> None:
    facts = _host(_unit("chat", OLD), checkouts_=(_checkout(OLD),))
    for held in (
        DeploymentChange(name="chat", action=["no-op"], operator="stopped by alice"),
        DeploymentChange(name="chat", action=["no-op"], pending_reason="Waiting for a machine"),
        DeploymentChange(name="chat", action=["no-op"], failed_reason="does not fit"),
        DeploymentChange(name="chat", action=["no-op"], blocked=["replica 0 could not be checked"]),
    ):
        assert prunes(_desired(), [held], facts) == [], held


def test_a_unit_whose_text_was_not_read_keeps_every_checkout_of_its_host() -> None:
    facts = _host(_unit("other", NEW, text=False), checkouts_=(_checkout(OLD),))
    assert prunes(_desired(), [], facts) == []
    assert [p.commit for p in prunes(_desired(), [], _host(checkouts_=(_checkout(OLD),)))] == [OLD]


def test_a_path_is_named_only_as_itself_or_a_folder_not_as_a_longer_sibling() -> None:
    path = f"{SOURCES}/org/tiny/{OLD}"
    assert names_path(f"-m {path}/tiny.gguf --port 1", path)
    assert names_path(f'--model "{path}"', path) and names_path(f"--model {path}", path)
    assert not names_path(f"-m {path}x/tiny.gguf", path)


def test_plan_shows_the_prune_and_is_not_no_changes() -> None:
    plan = Plan(state_serial=1, state_lineage="l", prunes=[Prune(host="cpu-01", repo="org/tiny", commit=OLD,
                path=f"{SOURCES}/org/tiny/{OLD}", freed_bytes=17_400_000)])  # fmt: skip
    assert plan.has_changes
    text = "\n".join(line for _, line in render_plan(plan))
    assert f"- checkout cpu-01: org/tiny@{OLD[:12]} ({SOURCES}/org/tiny/{OLD}), frees up to 17.4 MB" in text
    assert "No changes" not in text and "Weights to prune: 1 checkout, frees up to 17.4 MB." in text
    markdown = plan_markdown(plan)
    assert "No changes" not in markdown and "**Weights to prune** (1 checkout, frees up to 17.4 MB)" in markdown


def test_the_probe_lists_whole_checkouts_and_counts_only_unshared_bytes_as_freed(tmp_path: Path) -> None:
    sources = tmp_path / "sources" / "org" / "tiny"
    old, new = sources / OLD, sources / NEW
    for d in (old, new):
        d.mkdir(parents=True)
        (d / MARKER).write_text("{}")
    (old / "tiny.gguf").write_bytes(b"w" * 5000)
    os.link(old / "tiny.gguf", new / "tiny.gguf")  # the new commit's fetch linked the unchanged file
    (old / "README.md").write_bytes(b"r" * 100)
    (sources / (NEW[:-1] + "c.partial")).mkdir()  # a download under way: not a checkout
    (sources / ("d" * 40)).mkdir()  # no marker: not a whole checkout
    (sources / "main").mkdir()  # not a commit
    found = {c["commit"]: c for c in checkouts(str(tmp_path))}
    assert sorted(found) == [OLD, NEW]
    assert found[OLD]["bytes"] == 5000 + 100 + 2 and found[OLD]["freed"] == 100 + 2
    assert found[NEW] == {"path": str(new), "repo": "org/tiny", "commit": NEW, "bytes": 5002, "freed": 2}
    assert checkouts(str(tmp_path / "nothing-here")) == []


def test_the_host_side_delete_refuses_a_checkout_a_unit_names_and_tidies_empty_folders(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    checkout = tmp_path / "sources" / "org" / "tiny" / OLD
    checkout.mkdir(parents=True)
    (checkout / "tiny.gguf").write_bytes(b"w")
    Path(f"{checkout}.lock").write_text("")  # the fetch's lock beside it
    (units / "engine-ctl-chat-0a.service").write_text(f"ExecStart=/x -m {checkout}/tiny.gguf\n")
    named = subprocess.run(prune_checkout(str(checkout), str(units)), capture_output=True, text=True)
    assert named.returncode == PRUNE_NAMED and "engine-ctl-chat-0a.service" in named.stderr
    assert (checkout / "tiny.gguf").exists()
    (units / "engine-ctl-chat-0a.service").write_text("ExecStart=/x -m /elsewhere/tiny.gguf\n")
    done = subprocess.run(prune_checkout(str(checkout), str(units)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "sources" / "org").exists() and (tmp_path / "sources").exists()


def test_apply_deletes_only_the_checkout_of_the_repo_at_the_commit_under_the_models_folder() -> None:
    models = "/var/lib/engine-ctl/models"
    assert is_checkout("org/tiny", OLD, f"{models}/sources/org/tiny/{OLD}", models)
    for repo, commit, path in (
        ("org/tiny", OLD, "/"),  # a tampered plan file
        ("org/tiny", OLD, f"{models}/sources/org/tiny/{OLD}/.."),
        ("org/..", OLD, f"{models}/sources/org/../{OLD}"),
        ("org/tiny", "main", f"{models}/sources/org/tiny/main"),
        ("tiny", OLD, f"{models}/sources/tiny/{OLD}"),
    ):
        assert not is_checkout(repo, commit, path, models), path
