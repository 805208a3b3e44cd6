"""Output a reviewer reads once (issue 16 §4), without hosts: plans on synthetic facts (recorded GPU formats, as
tests/test_plan_core.py builds them) and the real CLI in-process. The fleet half (a unit edited on a real host,
destroy end to end) is tests/test_fleet_output.py."""

from __future__ import annotations

import io
import os
import re
import select
from pathlib import Path

import click
import pytest
from rich.console import Console

from engine_ctl.cli.main import COMMANDS, cli, load_command
from engine_ctl.cli.plan_cmd import for_destroy, outcome_line, show_plan
from engine_ctl.cli.render_cmd import print_render
from engine_ctl.cli.views.plan import plan_json, plan_markdown, plan_text, render_plan
from engine_ctl.cli.views.status import deployment_table, instance_table, list_table, units_line
from engine_ctl.core.diagnostics import Diagnostic, Location, by_place
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.pipeline import render_deployment
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.plan.status import DeploymentStatus, InstanceStatus
from engine_ctl.core.plan.unitdiff import hide_secrets
from engine_ctl.core.record.model import State
from engine_ctl.core.sizes import human_bytes
from engine_ctl.shell.gather import facts_from_probe
from tests.fleetfacts import cpu_host, h100x8
from tests.helpers import run, write
from tests.test_ci_surface import LINEAGE, assert_well_formed
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world

SECRET = "hf_secret_pasted_by_hand"
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _applied(spec: str, *hosts: HostFacts) -> tuple[State, dict[str, HostFacts]]:
    """The state and the hosts' units after `spec` was applied; each unit fact carries its file's text."""
    first = plan_for(spec, State(lineage=LINEAGE), *hosts)
    state, facts = applied(first, State(lineage=LINEAGE), {h.host: h for h in hosts})
    texts = {r.unit: r.unit_text for c in first.changes for r in c.replicas}
    return state, {
        name: f.model_copy(update={"units": tuple(u.model_copy(update={"text": texts.get(u.name)}) for u in f.units)})
        for name, f in facts.items()
    }


def _replan(spec: str, state: State, facts: dict[str, HostFacts]) -> Plan:
    return make_plan(desired(spec), state, world(*facts.values())[0], facts, {"m": SHAPE})


# --- replicas: a scale-down, a repair, the closing line ------------------------------------------------------
def test_a_scale_down_reads_replicas_2_to_1_and_the_closing_line_counts_replicas() -> None:
    state, facts = _applied("gpus: 1, replicas: {min: 2, max: 2}", h100x8())
    down = _replan("gpus: 1, replicas: {min: 1, max: 1}", state, facts)
    (c,) = down.changes
    (removed,) = c.replicas
    assert removed.action == ["delete"] and removed.reason == "replicas 2 → 1"
    text = plan_text(down)
    assert "(replicas 2 → 1)" in text and "replicas 1 → 1" not in text
    assert text.rstrip().endswith("Plan: 0 to add, 1 to change, 0 to destroy. Replicas: 1 to remove.")
    assert "Replicas: 1 to remove." in plan_markdown(down)
    assert plan_json(down)["summary"] == {
        "add": 0, "change": 1, "destroy": 0, "replicas": {"start": 0, "replace": 0, "repair": 0, "remove": 1,
                                                      "install": 0}
    }  # fmt: skip
    first = plan_for("gpus: 1, replicas: {min: 2, max: 2}", State(), h100x8())
    assert plan_text(first).rstrip().endswith("Plan: 1 to add, 0 to change, 0 to destroy. Replicas: 2 to start.")


def test_a_repair_says_its_revision_stays_and_never_reads_n_to_n() -> None:
    state, facts = _applied("gpus: 1", h100x8())
    (host,) = facts.values()
    (unit,) = host.units
    edited = unit.model_copy(
        update={"sha256": "0" * 64, "text": (unit.text or "").replace("RestartSec=5", "RestartSec=1")}
    )
    facts = {host.host: host.model_copy(update={"units": (edited,)})}
    plan = _replan("gpus: 1", state, facts)
    (c,) = plan.changes
    assert c.action == ["update"] and c.old_revision == c.revision == 1
    text = plan_text(plan)
    assert "will be updated in place (revision 1 stays: the documents did not change)" in text
    assert "revision 1 → 1" not in text and "revision 1 → 1" not in plan_markdown(plan)
    assert "Replicas: 1 to repair." in text
    rolled = _replan("gpus: 1, context_length: 4096", state, facts)
    assert "revision 1 → 2" in plan_text(rolled)


# --- a hand-edited unit is a diff of its text ----------------------------------------------------------------
def _edited_plan() -> Plan:
    state, facts = _applied("gpus: 1", h100x8())
    (host,) = facts.values()
    (unit,) = host.units
    text = (
        (unit.text or "")
        .replace("RestartSec=5", "RestartSec=1")
        .replace("[Service]\n", f"[Service]\nEnvironment=HF_TOKEN={SECRET} LANG=C\n")
    )
    edited = unit.model_copy(update={"sha256": "1" * 64, "text": text})
    return _replan("gpus: 1", state, {host.host: host.model_copy(update={"units": (edited,)})})


def test_a_hand_edited_unit_shows_the_diff_of_its_text_with_secrets_hidden() -> None:
    plan = _edited_plan()
    (drift,) = plan.drift
    assert drift.kind == "edited"
    assert drift.diff[0] == f"--- gpu-h100:/etc/systemd/system/{drift.unit} (edited by hand)"
    assert "-RestartSec=1" in drift.diff and "+RestartSec=5" in drift.diff
    assert "-Environment=HF_TOKEN=(sensitive) LANG=C" in drift.diff
    for shown in (plan_text(plan), plan_markdown(plan), plan.model_dump_json(), str(plan_json(plan))):
        assert SECRET not in shown
    text = plan_text(plan)
    assert text.index("      +RestartSec=5") < text.index("engine-ctl will perform the following actions:")


def test_markdown_puts_the_warnings_first_then_the_unit_diff_then_the_sections() -> None:
    markdown = plan_markdown(_edited_plan())
    order = [markdown.index(s) for s in ("[!WARNING]", "its diff is below", "```diff\n---", "<b>chat</b>")]
    assert order == sorted(order), markdown
    alert = markdown[markdown.index("[!WARNING]") : markdown.index("\n\n", markdown.index("[!WARNING]"))]
    assert "```" not in alert  # no diff block inside the warnings
    assert "<details><summary>Edited by hand: <code>gpu-h100</code>" in markdown


def test_golden_markdown_of_a_repair_with_a_unit_diff_and_a_scale_down() -> None:
    """tests/golden/plan-repair.md: a unit edited by hand (its diff, a token hidden) repaired at its revision."""
    text = plan_markdown(_edited_plan(), "pr.plan.json")
    path = GOLDEN / "plan-repair.md"
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), "plan-repair: rerun with UPDATE_GOLDEN=1 after checking the change"
    assert_well_formed(text)


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("Environment=HF_TOKEN=abc HOME=/var/cache", "Environment=HF_TOKEN=(sensitive) HOME=/var/cache"),
        ('Environment="API_KEY=a b" "LANG=C"', 'Environment="API_KEY=(sensitive)" "LANG=C"'),
        ("SetCredential=db-password:hunter2 more", "SetCredential=db-password:(sensitive)"),
        ("SetCredential=chat-template:{{ x }}", "SetCredential=chat-template:{{ x }}"),
        ("ExecStart=/bin/x --api-key abc --port 8000", "ExecStart=/bin/x --api-key (sensitive) --port 8000"),
        ('ExecStart=/bin/x "--api-key" "abc" "--port" "1"', 'ExecStart=/bin/x "--api-key" "(sensitive)" "--port" "1"'),
        ("ExecStart=/bin/x --hf-token=abc", "ExecStart=/bin/x --hf-token=(sensitive)"),
        ("RestartSec=5", "RestartSec=5"),
    ],
)  # fmt: skip
def test_values_that_look_secret_are_hidden_in_a_unit_diff(line: str, shown: str) -> None:
    assert hide_secrets(line) == shown


def test_the_facts_keep_a_units_text_with_its_secrets_hidden() -> None:
    """The probe's JSON (engine_ctl/shell/remote/facts_probe.py's units()) as gather reads it: the text keeps no
    token, so neither `facts --json` nor a plan can show one; the sha256 is the file's own."""
    text = f"[Service]\nEnvironment=HF_TOKEN={SECRET} LANG=C\nRestartSec=5\n"
    unit = {"Id": "engine-ctl-chat-0a.service", "sha256": "a" * 64, "ActiveState": "active", "text": text}
    probe = {"cpu": {"cores": 2}, "memory": {"total": 2**30, "available": 2**30}, "units": [unit]}
    (fact,) = facts_from_probe("h1", probe).units
    assert fact.text == "[Service]\nEnvironment=HF_TOKEN=(sensitive) LANG=C\nRestartSec=5\n"
    assert fact.sha256 == "a" * 64
    without = facts_from_probe("h1", {**probe, "units": [{**unit, "text": None}]})
    assert without.units[0].text is None and without.fingerprint() == facts_from_probe("h1", probe).fingerprint()


# --- labels a reviewer reads without a manual ----------------------------------------------------------------
def test_sizes_are_never_zero_for_something_that_is_there() -> None:
    assert human_bytes(17_000_000) == "16.2 MiB"
    assert human_bytes(5 * 1024**3 + 1024**3 // 2) == "5.5 GiB"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B" and human_bytes(0) == "0 B"


def test_the_fit_says_what_its_basis_and_its_context_mean() -> None:
    plan = plan_for("gpus: 1", State(), h100x8())
    text = plan_text(plan)
    assert "(arch)" not in text
    assert "host memory     = 6.7 GiB (estimated from the model's shape: layers, KV heads and head size)" in text
    assert "context_length  = 8192 (tokens per request; --ctx-size 32768 is context_length × parallel" in text
    assert "--ctx-size 32768" in text  # the figure the note names is the one in the argv
    markdown = plan_markdown(plan)
    assert "--ctx-size 32768 is context\\_length × parallel" in markdown


def test_render_shows_a_small_model_in_mib_and_says_what_context_length_is(capsys: pytest.CaptureFixture[str]) -> None:
    h = cpu_host()
    tiny = ModelFacts(block_count=2, head_count=4, head_count_kv=4, embedding_length=64, weights_bytes=17_000_000)
    spec = "accelerator: cpu, context_length: 1024, parallel: 2"
    result = render_deployment(desired(spec), "chat", world(h)[0], {h.host: h}, tiny, all_model_facts={"m": tiny})
    print_render(result, None)
    out = capsys.readouterr().out
    assert "weights            16.2 MiB" in out and "0.0 GiB" not in out
    assert "context_length     1024 (tokens per request; --ctx-size 2048 is context_length × parallel" in out
    assert "--ctx-size 2048" in out
    assert "host memory        2.0 GiB (estimated from the model's shape" in out


# --- colour on a terminal only -------------------------------------------------------------------------------
def _on_a_terminal(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> str:
    """show_plan writing to a real pseudo-terminal; what the terminal received."""
    primary, secondary = os.openpty()
    with open(secondary, "w", closefd=True) as tty:
        monkeypatch.setattr("sys.stdout", tty)
        monkeypatch.setenv("TERM", "xterm-256color")
        show_plan(plan)
        tty.flush()
    data = b""
    while chunk := _read_available(primary):
        data += chunk
    os.close(primary)
    return data.decode()


def _read_available(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], 0.2)
    try:
        return os.read(fd, 65536) if ready else b""
    except OSError:  # EIO: the terminal's other end is closed and all was read
        return b""


def _roll() -> Plan:
    state, facts = _applied("gpus: 1, context_length: 4096", h100x8())
    return _replan("gpus: 1, context_length: 8192", state, facts)


def test_argv_lines_are_coloured_by_their_sign_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    shown = _on_a_terminal(_roll(), monkeypatch)
    red, green = re.escape("\x1b[31m"), re.escape("\x1b[32m")
    assert re.search(red + r"\s*- --ctx-size 16384", shown), shown
    assert re.search(green + r"\s*\+ --ctx-size 32768", shown), shown


def test_no_colour_with_no_color_or_without_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    shown = _on_a_terminal(_roll(), monkeypatch)
    assert "- --ctx-size 16384" in shown and "\x1b[" not in shown
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.undo()
    show_plan(_roll())  # captured: not a terminal
    out = capsys.readouterr().out
    assert "- --ctx-size 16384" in out and "\x1b[" not in out


def test_render_plan_styles_argv_lines_by_sign() -> None:
    lines = dict((line.strip(), style) for style, line in render_plan(_roll()))
    assert lines["- --ctx-size 16384"] == "destroy" and lines["+ --ctx-size 32768"] == "add"


# --- destroy speaks as destroy -------------------------------------------------------------------------------
def test_destroy_plans_and_reports_in_its_own_words() -> None:
    state, facts = _applied("gpus: 1, replicas: {min: 2, max: 2}", h100x8())
    everything_gone = make_plan(desired("gpus: 1").model_copy(update={"deployments": ()}), state,
                                world(*facts.values())[0], facts, {"m": SHAPE})  # fmt: skip
    plan = for_destroy(everything_gone)
    assert plan.absent == []
    text = plan_text(plan, "destroy")
    assert "engine-ctl destroy will stop and remove the units of these deployments:" in text
    assert "# chat will be destroyed: its units stopped and removed (the model stays)" in text
    assert "#   engine-ctl destroy destroys it" in text and "(destroyed)" in text
    assert "documents" not in text and "This plan destroys" not in text
    assert text.rstrip().endswith("Plan: 0 to add, 0 to change, 1 to destroy. Replicas: 2 to remove.")
    assert (
        outcome_line(plan, "destroy", 0, "destroyed")
        == "\nDestroy complete: destroyed. (1 deployment destroyed as planned)"
    )
    assert (
        outcome_line(plan, "destroy", 1, "failed: x")
        == "\nDestroy stopped: failed: x. (planned: 1 deployment to destroy)"
    )
    stopped = outcome_line(plan, "apply", 1, "failed: x")  # never counts as if all of it had been done
    assert stopped.startswith("\nApply stopped: failed: x. (planned: ") and "destroyed as planned" not in stopped
    assert outcome_line(plan, "apply", 0, "applied").startswith("\nApply complete: applied.")
    empty = for_destroy(
        make_plan(desired("gpus: 1").model_copy(update={"deployments": ()}), State(), *world(h100x8()), {})
    )
    assert "Nothing to destroy: the state has no deployments." in plan_text(empty, "destroy")
    assert "No changes" not in plan_text(empty, "destroy")


# --- errors, help, --target, --fanout ------------------------------------------------------------------------
def test_diagnostics_are_shown_in_reading_order() -> None:
    found = [
        Diagnostic(Location("b.yaml", 2, 1), "", "b2", code="out_of_range"),
        Diagnostic(Location("a.yaml", 9, 3), "", "a9", code="out_of_range"),
        Diagnostic(Location("a.yaml"), "", "a-whole", code="out_of_range"),
        Diagnostic(Location("a.yaml", 2, 5), "", "a2", code="out_of_range"),
    ]
    assert [d.message for d in by_place(found)] == ["a-whole", "a2", "a9", "b2"]


def test_validate_prints_errors_by_file_and_line(tmp_path: Path) -> None:
    """b.yaml's shape error is found while loading, a.yaml's rule errors afterwards: shown a.yaml first."""
    model = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf}\n"
    write(tmp_path, "m.yaml", model)
    write(tmp_path, "a.yaml", "metadata: {name: a}\nspec:\n  model: m\n  engine_args: [--port, '1']\n  gpus: 3\n")
    write(tmp_path, "b.yaml", "metadata: {name: b}\nspec:\n  model: m\n  replicaz: 2\n")
    result = run("validate", str(tmp_path))
    assert result.exit_code == 1
    places = re.findall(r"^(\S+\.yaml):(\d+):(\d+): error", result.stderr, re.MULTILINE)
    assert len(places) >= 3 and {Path(f).name for f, _, _ in places} == {"a.yaml", "b.yaml"}, result.stderr
    keys = [(f, int(line), int(col)) for f, line, col in places]
    assert keys == sorted(keys), result.stderr


def _words(text: str) -> str:
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_the_top_level_help_shows_every_description_whole() -> None:
    shown = run_help_at(80)
    assert "..." not in shown.partition("Commands:")[2]
    for name, (_, short_help) in COMMANDS.items():
        assert _words(short_help) in _words(shown), name


def run_help_at(width: int) -> str:
    from click.testing import CliRunner

    return CliRunner().invoke(cli, ["--help"], terminal_width=width).output


def test_every_option_of_every_command_has_help() -> None:
    def options(name: str, command: click.Command) -> list[str]:
        found = [
            f"{name} {p.opts[0]}" for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help
        ]
        for sub, child in getattr(command, "commands", {}).items():
            found += options(f"{name} {sub}", child)
        return found

    missing = [o for n in COMMANDS for o in options(n, load_command(n))]
    assert missing == []
    assert "--json" in run("status", "--help").output and "versioned JSON" in run("list", "--help").output


def test_an_unknown_target_gets_a_did_you_mean_before_any_host_is_asked(tmp_path: Path) -> None:
    model = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf}\n"
    write(tmp_path, "d.yaml", model + "---\nmetadata: {name: tiny-chat}\nspec: {model: m, accelerator: cpu}\n")
    # an address nobody answers on: the error comes before any connection is tried
    write(tmp_path, "hosts.yaml", "hosts: [{name: h1, address: 198.18.0.250}]\n")
    result = run("plan", str(tmp_path), "--target", "tiny-chatt")
    assert result.exit_code == 1
    assert "--target: no deployment named 'tiny-chatt'" in result.stderr
    assert "hint: did you mean 'tiny-chat'? the deployments: tiny-chat" in result.stderr
    assert "h1" not in result.output  # no host was reached (it would have failed)


def test_fanout_is_the_hosts_contacted_at_once_and_parallel_is_a_deprecated_alias(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command = load_command("plan")
    shown = " ".join(run("plan", "--help").output.split())
    assert "--fanout" in shown and "ENGINE_CTL_FANOUT" in shown and "not a deployment's spec.parallel" in shown
    assert "--parallel" not in shown and "ENGINE_CTL_PARALLEL" not in shown

    def value(*args: str) -> int:
        return int(command.make_context("plan", list(args)).params["parallel"])

    assert value() == 32 and value("--fanout", "3") == 3
    assert capsys.readouterr().err == ""
    assert value("--parallel", "4") == 4
    assert "--parallel is deprecated and will be removed in the next release: use --fanout" in capsys.readouterr().err
    assert value("--parallel", "4", "--fanout", "5") == 5
    monkeypatch.setenv("ENGINE_CTL_PARALLEL", "6")
    assert value() == 6
    assert "ENGINE_CTL_PARALLEL is deprecated" in capsys.readouterr().err
    monkeypatch.setenv("ENGINE_CTL_FANOUT", "7")
    assert value() == 7 and value("--parallel", "8") == 8  # a flag wins over any variable
    bad = run("facts", "--parallel", "0")
    assert bad.exit_code == 1 and "Traceback" not in bad.output


# --- the status table fits 80 columns ------------------------------------------------------------------------
def test_the_status_tables_fit_80_columns_and_show_each_slot() -> None:
    long_error = (
        "restarted 3 time(s), last: exit status 1: llama_model_load: error loading model: tensor data out of bounds"
    )
    s = DeploymentStatus(
        name="qwen-coder-32b-instruct", state="Ready", ready=1, replicas=2, revision=3,
        reason="1 of 2 replicas serving; 1 of 2 at revision 3; last change failed: launch_failed: " + long_error,
        hosts=["gpu-h100-rack1-01", "gpu-h100-rack1-02"],
        instances=[
            InstanceStatus(index=0, host="gpu-h100-rack1-01", unit="engine-ctl-qwen-coder-32b-instruct-0b.service",
                           port=8001, gpus=[0, 1, 2, 3], state="ready", restarts=0),
            InstanceStatus(index=1, host="gpu-h100-rack1-02", unit="engine-ctl-qwen-coder-32b-instruct-1a.service",
                           port=8000, gpus=[4, 5, 6, 7], state="failed", restarts=3, last_error=long_error),
        ],
    )  # fmt: skip
    out = io.StringIO()
    terminal = Console(file=out, width=80, no_color=True)
    for shown in (deployment_table(s), instance_table(s), units_line(s), list_table([s])):
        terminal.print(shown)
    text = out.getvalue()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    rows = [line.split() for line in text.splitlines() if line.startswith(("0 ", "1 "))]
    assert [r[:3] for r in rows] == [["0", "gpu-h100-rack1-01", "ready"], ["1", "gpu-h100-rack1-02", "failed"]], text
    assert "engine-ctl-qwen-coder-32b-instruct-0b.service" in "".join(text.split())  # the unit, whole
    assert "Units: engine-ctl-qwen-coder-32b-instruct-<INSTANCE><SLOT>.service on each HOST" in text
    assert "tensor data out of bounds" in " ".join(text.split())  # the error wraps, whole


def test_a_hosts_unit_text_reaches_the_reader_with_its_control_characters_escaped() -> None:
    """A probe (session 16): a line appended to a unit on a host, `# ESC[2K ESC[1A ESC[2K No changes. … ESC[8m`,
    reached the terminal (and the pull request) raw: it erased the line above, printed a fake "No changes" and hid
    the rest of the plan. The diff shows each control character, and the bidirectional overrides, escaped."""
    from engine_ctl.core.plan.unitdiff import unit_diff

    edited = "[Service]\n# \x1b[2K\x1b[1A\x1b[2KNo changes. The hosts match the documents.\x1b[8m\nA=\u202eevil\n"
    lines = unit_diff("h1", "engine-ctl-x-0a.service", edited, "[Service]\n")
    removed = [ln for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    assert removed == ["-# \\x1b[2K\\x1b[1A\\x1b[2KNo changes. The hosts match the documents.\\x1b[8m",
                       "-A=\\u202eevil"]  # fmt: skip
    assert not any(c in "".join(lines) for c in "\x1b\u202e")
