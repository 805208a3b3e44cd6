"""An hf: model on the real fleet: plan pins it through the hub's API, apply fetches the tiny real GGUF onto a
fleet host from there, and the real llama-server serves it.

The hub cannot be reached from here, so the hub is tests/hubdouble.py, listening on the fleet's bridge address:
its API shapes come from huggingface_hub's source (src/huggingface_hub/hf_api.py model_info with
files_metadata, file_download.py's resolve URL and X-Repo-Commit/ETag headers), and tests/test_hub_double.py
checks them against huggingface_hub's own client."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.weights import checkpoint_digest
from tests.fleet import SUBNET, Fleet
from tests.fleetproject import MODELS_DIR, ROOT, Project
from tests.hubdouble import HubDouble, RepoFile, tiny_repo_files
from tests.llama import tiny_model

pytestmark = pytest.mark.fleet

REPO = "tiny-org/tiny-gguf"
TOKEN = "hf_fleet_test_token_never_written"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubDouble]:
    with HubDouble(host=f"{SUBNET}.1") as double:
        double.add(REPO, tiny_repo_files(tiny_model()), private_token=TOKEN)
        monkeypatch.setenv("HF_ENDPOINT", double.endpoint)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield double


@pytest.fixture
def hf_project(tmp_path: Path, fleet: Fleet) -> Iterator[Project]:
    p = Project(tmp_path, fleet, "t-hf-weights")
    host = fleet.hosts[-1].name
    (tmp_path / "docs.yaml").write_text(textwrap.dedent(f"""
        kind: Model
        metadata: {{name: tiny-hf}}
        spec:
          format: gguf
          hf: {REPO}
          file: tiny.gguf
          parameters: 4170048
          context_length: 2048
          architecture: {{layers: 2, kv_heads: 2, heads: 4, embedding_length: 64}}
        ---
        metadata: {{name: {p.name}}}
        spec: {{model: tiny-hf, accelerator: cpu, host: {host}, context_length: 512}}
        """))  # fmt: skip
    yield p
    if p.state_file.exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(fleet.host(host), f"rm -rf {MODELS_DIR}/sources/tiny-org", check=False)


def test_plan_pins_the_reference_apply_fetches_it_onto_the_host_and_the_replica_serves_it(
    hub: HubDouble, hf_project: Project
) -> None:
    p = hf_project
    commit = hub.repos[REPO].commit
    planned = p.cli("plan", "--json", check=True)
    (change,) = json.loads(planned.stdout)["changes"]
    assert change["model"]["hf"] == {"repo": REPO, "commit": commit}  # pinned to the commit main points at
    (fetch,) = change["fetches"]
    dest = f"{MODELS_DIR}/sources/{REPO}/{commit}"
    size = tiny_model().stat().st_size
    assert (fetch["dest"], fetch["total_bytes"], fetch["in_place"], fetch["digest"]) == (dest, size, False, None)
    assert [f["path"] for f in fetch["files"]] == ["tiny.gguf"]
    (replica,) = change["replicas"]
    assert f"{dest}/tiny.gguf" in replica["argv"]
    human = p.cli("plan", check=True).stdout
    assert f"weights {REPO}@{commit[:12]} on {replica['host']}: fetch" in human and "digest pending" in human
    markdown = p.cli("plan", "--markdown", check=True).stdout  # the PR review sees the fetch too
    assert f"weights {REPO}@{commit[:12]} on {replica['host']}: fetch 17.4 MB" in markdown

    hub.rate = 4_000_000  # bytes/s: the 17 MB take about 4 s, long enough to see the replica wait
    applied, reasons = _apply_watching(p)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert any(r.startswith("Waiting for the weights: ") and r.endswith(" of 17.4 MB") for r in reasons), reasons
    assert f"weights {REPO}@{commit[:12]} on {replica['host']}: fetched" in applied.stdout
    assert "tiny.gguf" in applied.stdout  # the plain progress lines (stdout is not a terminal)
    state = p.state()
    record = state["deployments"][p.name]
    assert record["model"]["hf"] == {"repo": REPO, "commit": commit}
    (served,) = record["replicas"]
    expected = checkpoint_digest({"tiny.gguf": hashlib.sha256(tiny_model().read_bytes()).hexdigest()})
    assert served["status"] == "serving" and served["checkpoint_digest"] == expected
    assert p.chat(served)["model"] == p.name  # the real llama-server serves the fetched weights
    on_host = p.fleet.ssh(p.host_of(served), f"sha256sum {dest}/tiny.gguf; ls -a {dest}; stat -c %a {dest}/tiny.gguf")
    assert hashlib.sha256(tiny_model().read_bytes()).hexdigest() in on_host.stdout
    assert ".engine-ctl-checkpoint.json" in on_host.stdout and on_host.stdout.strip().endswith("644")
    assert any(r.path == f"/{REPO}/resolve/{commit}/tiny.gguf" for r in hub.requests)

    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    # the token went to the hub, and nowhere engine-ctl writes
    assert TOKEN in hub.tokens_seen
    assert TOKEN not in p.state_file.read_text() + planned.stdout + human + applied.stdout + applied.stderr
    journal = p.fleet.ssh(p.host_of(served), "journalctl --no-pager -o cat | grep -c hf_fleet || true").stdout
    assert journal.strip() == "0"


def _apply_watching(p: Project) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """plan --out, then apply PLANFILE, with the deployment's recorded reasons seen while it runs."""
    saved = p.path / "reviewed.plan.json"  # the PR workflow: the reviewed plan, applied exactly
    p.cli("plan", "--out", str(saved), check=True)
    argv = [sys.executable, "-m", "engine_ctl", "apply", str(saved)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    reasons: list[str] = []
    while proc.poll() is None:
        try:
            reason = p.state()["deployments"][p.name]["reason"]
        except (OSError, ValueError, KeyError):
            reason = None
        if reason and reason not in reasons:
            reasons.append(reason)
        time.sleep(0.1)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), reasons


def test_an_unpinned_reference_the_hub_refuses_stops_the_plan_with_its_field(
    hub: HubDouble, hf_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    out = hf_project.cli("plan")
    assert out.returncode == 1
    assert "docs.yaml:6:7: error: spec.hf: the hub at" in out.stderr and "HTTP 401" in out.stderr
    assert "validate works offline" not in out.stderr  # the hub's refusal is the error, said once
    assert "hf_wrong" not in out.stdout + out.stderr


def test_a_checkout_no_deployment_uses_any_more_is_pruned_by_apply_and_the_plan_says_what_it_frees(
    hub: HubDouble, hf_project: Project
) -> None:
    """Issue 29: a new commit rolls the replica onto a new checkout (the unchanged GGUF linked from the old one,
    not downloaded again); the plan lists the old checkout to prune with what deleting it frees at most; apply
    deletes it after the roll; then plan says No changes, and the served weights are whole."""
    p = hf_project
    first = hub.repos[REPO].commit
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (served,) = p.state()["deployments"][p.name]["replicas"]
    host = p.host_of(served)
    old = f"{MODELS_DIR}/sources/{REPO}/{first}"
    files = tiny_repo_files(tiny_model())
    files["README.md"] = RepoFile(b"# tiny\nA second commit: the README changed, the weights did not.\n", lfs=False)
    second = hub.add(REPO, files, private_token=TOKEN).commit
    assert second != first

    planned = p.cli("plan", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    (prune,) = json.loads(planned.stdout)["prunes"]
    size = tiny_model().stat().st_size
    assert (prune["host"], prune["repo"], prune["commit"], prune["path"]) == (served["host"], REPO, first, old)
    assert prune["freed_bytes"] >= size  # today nothing else links its GGUF: deleting it would free all of it
    human = p.cli("plan").stdout
    assert f"- checkout {served['host']}: {REPO}@{first[:12]} ({old}), frees up to " in human, human
    assert "Weights to prune: 1 checkout, frees up to" in human

    rolled = p.cli("apply", "--auto-approve")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert f"weights {served['host']}: pruned {REPO}@{first[:12]}" in rolled.stdout, rolled.stdout
    new = f"{MODELS_DIR}/sources/{REPO}/{second}"
    listing = p.fleet.ssh(host, f"ls {MODELS_DIR}/sources/{REPO}; stat -c %h {new}/tiny.gguf").stdout.split()
    # the old checkout and its fetch's lock gone; the GGUF it shared is the new checkout's alone
    assert listing == [second, f"{second}.lock", "1"], listing
    assert not any(r.path == f"/{REPO}/resolve/{second}/tiny.gguf" for r in hub.requests)  # linked, not fetched
    (replica,) = p.state()["deployments"][p.name]["replicas"]
    assert p.chat(replica)["model"] == p.name
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes" in again.stdout
