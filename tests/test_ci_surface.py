"""What CI sees: ENGINE_CTL_* variables for every global option, `show PLANFILE`, and the pull-request Markdown
(golden files in tests/golden/plan-*.md, plans built from synthetic facts as tests/test_plan_core.py does)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click
import pytest

from engine_ctl.cli.common import ENVIRONMENT
from engine_ctl.cli.main import COMMANDS, load_command
from engine_ctl.cli.views.plan import COMMENT_LIMIT, argv_word_diff, plan_markdown
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import EngineInstall, UnitFact
from engine_ctl.core.plan.changes import PlanContext
from engine_ctl.core.plan.planner import DeploymentChange, Drift, FieldChange, Plan, make_plan
from engine_ctl.core.plan.savedplan import decode_plan
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from tests.fleetfacts import h100x8
from tests.helpers import quickstart_copy, run
from tests.test_plan_core import MODEL, SHAPE, applied, world

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
LINEAGE = "00000000-0000-4000-8000-000000000000"
QUICKSTART = ROOT / "examples" / "quickstart"


# --- configuration by environment -------------------------------------------------------------------------------


def every_command() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name in sorted(COMMANDS):
        command = load_command(name)
        if isinstance(command, click.Group):
            out += [(f"{name} {sub}", c) for sub, c in sorted(command.commands.items())]
        else:
            out.append((name, command))
    return out


def options_of(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def test_every_global_option_of_every_command_has_its_variable_shown_in_help() -> None:
    seen: set[str] = set()
    for name, command in every_command():
        for flag, variable in ENVIRONMENT.items():
            option = options_of(command).get(flag)
            if option is None:
                continue
            seen.add(flag)
            assert option.envvar == variable, f"engine-ctl {name} {flag} is not read from {variable}"
            assert option.show_envvar, f"engine-ctl {name} --help does not show {variable}"
            assert variable in run(*name.split(), "--help").output, name
    assert seen == set(ENVIRONMENT)  # each variable is used by some command
    assert set(options_of(load_command("apply"))) >= set(ENVIRONMENT)  # apply takes them all


VALUES = {
    "--state": ("/tmp/env.state.json", "/tmp/flag.state.json", "state_path"),
    "--inventory": ("/tmp/env-hosts.yaml", "/tmp/flag-hosts.yaml", "inventory_path"),
    "--fanout": ("7", "3", "parallel"),
    "--lock-timeout": ("2.5", "9", "lock_timeout"),
    "--target": ("alpha beta", "gamma", "targets"),
}
EXPECTED = {
    "--state": ("/tmp/env.state.json", "/tmp/flag.state.json"),
    "--inventory": (Path("/tmp/env-hosts.yaml"), Path("/tmp/flag-hosts.yaml")),
    "--fanout": (7, 3),
    "--lock-timeout": (2.5, 9.0),
    "--target": (("alpha", "beta"), ("gamma",)),
}


@pytest.mark.parametrize("flag", sorted(VALUES))
def test_the_variable_sets_the_option_and_the_flag_wins(flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    command = load_command("apply")
    env_value, flag_value, param = VALUES[flag]
    monkeypatch.setenv(ENVIRONMENT[flag], env_value)
    assert command.make_context("apply", []).params[param] == EXPECTED[flag][0]
    assert command.make_context("apply", [flag, flag_value]).params[param] == EXPECTED[flag][1]
    monkeypatch.delenv(ENVIRONMENT[flag])
    assert command.make_context("apply", []).params[param] in (None, (), 32, 0.0)


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("yes", True), ("0", False), ("", False)])
def test_accept_new_host_keys_from_the_environment(value: str, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_CTL_ACCEPT_NEW_HOST_KEYS", value)
    assert load_command("facts").make_context("facts", []).params["accept_new_host_keys"] is expected


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("ENGINE_CTL_PARALLEL", "many", "plan"),
        ("ENGINE_CTL_FANOUT", "0", "facts"),
        ("ENGINE_CTL_LOCK_TIMEOUT", "-1", "apply"),
        ("ENGINE_CTL_LOCK_TIMEOUT", "soon", "destroy"),
        ("ENGINE_CTL_ACCEPT_NEW_HOST_KEYS", "maybe", "status"),
    ],
)
def test_a_bad_value_in_a_variable_is_refused_naming_the_variable(
    variable: str, value: str, command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.chdir(tmp_path)
    result = run(command)
    assert result.exit_code != 0
    assert f"(env var: '{variable}')" in result.output and repr(value).strip("'") in result.output
    assert "Traceback" not in result.output


def test_engine_ctl_state_is_the_state_read_and_the_flag_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env_state, flag_state = tmp_path / "from-env.json", tmp_path / "from-flag.json"
    monkeypatch.setenv("ENGINE_CTL_STATE", str(env_state))
    assert run("state", "list").output.startswith(f"# {env_state}:")
    assert run("state", "list", "--state", str(flag_state)).output.startswith(f"# {flag_state}:")


def test_engine_ctl_inventory_is_the_inventory_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """facts with no --inventory reaches the hosts of ENGINE_CTL_INVENTORY (this machine, transport: local)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENGINE_CTL_INVENTORY", str(QUICKSTART / "hosts.yaml"))
    found = run("facts", "--json")
    assert found.exit_code == 0, found.output
    assert list(json.loads(found.stdout)["hosts"]) == ["localhost"]
    missing = run("facts", "--inventory", str(tmp_path / "flag-hosts.yaml"))
    assert missing.exit_code == 1 and "flag-hosts.yaml" in missing.output  # the flag wins


def test_engine_ctl_target_limits_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_CTL_TARGET", "no-such")
    monkeypatch.setenv("ENGINE_CTL_STATE", str(tmp_path / "state.json"))
    quickstart = quickstart_copy(tmp_path)
    refused = run("plan", str(quickstart))
    assert refused.exit_code == 1 and "no deployment named 'no-such'" in refused.output
    kept = run("plan", str(quickstart), "--target", "tiny-chat", "--json")
    assert kept.exit_code == 0, kept.output
    assert json.loads(kept.stdout)["targets"] == ["tiny-chat"]


# --- show PLANFILE ----------------------------------------------------------------------------------------------


def saved_quickstart(tmp_path: Path) -> tuple[Path, str]:
    """A real saved plan of the quickstart against this machine, and what plan --json printed with it."""
    out = tmp_path / "pr.plan.json"
    planned = run("plan", str(quickstart_copy(tmp_path)), "--state", str(tmp_path / "state.json"), "--out", str(out),
                  "--json")  # fmt: skip
    assert planned.exit_code == 0, planned.output
    return out, planned.stdout


def test_show_prints_exactly_the_saved_plan_without_hosts_or_state(tmp_path: Path) -> None:
    path, printed = saved_quickstart(tmp_path)
    assert not (tmp_path / "state.json").exists()
    assert path.stat().st_mode & 0o777 == 0o600  # it names hosts, addresses, ports and key names: its owner's only
    shown = run("show", str(path), "--json")
    assert shown.exit_code == 0 and shown.stdout == printed  # what plan --json printed, byte for byte
    plan = decode_plan(path.read_text())
    assert plan is not None
    markdown = run("show", str(path), "--markdown")
    assert markdown.stdout == plan_markdown(plan, full_plan=str(path))
    assert f"apply exactly it with `engine-ctl apply {path}`" in markdown.stdout
    text = run("show", str(path))
    assert text.stdout.startswith(f"Saved plan {path}: made {plan.created_at} against state serial 0")
    assert 'deployment "tiny-chat"' in text.stdout and "Plan: 1 to add, 0 to change, 0 to destroy." in text.stdout
    assert run("show", str(path), "--detailed-exitcode").exit_code == 2
    path.chmod(0o644)
    again = run("plan", str(tmp_path / "quickstart"), "--state", str(tmp_path / "state.json"), "--out", str(path))
    assert again.exit_code == 0, again.output
    assert path.stat().st_mode & 0o777 == 0o600  # saved again over a readable file: private again
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "state.json.lock").exists()


def test_show_reads_no_state_and_no_inventory(tmp_path: Path) -> None:
    """The plan's recorded inventory and state are gone: show still renders it (apply would refuse)."""
    plan = make_plan(desired(chat="gpus: 1"), State(lineage=LINEAGE), *world(h100x8()), {"m": SHAPE})
    plan.context = PlanContext(inventory=str(tmp_path / "gone.yaml"), state="postgresql://nobody@198.18.0.250/none")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan.model_dump(mode="json")))
    shown = run("show", str(path), "--markdown")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == plan_markdown(plan, full_plan=str(path))


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n", "engine-ctl documents (a model)"),
        ("hosts:\n  - {name: a, address: 198.18.0.11}\n", "engine-ctl documents (an inventory)"),
        ('{"format_version": 1, "serial": 3, "lineage": "x", "deployments": {}}', "an engine-ctl state"),
        ("### engine-ctl plan: 1 to add, 0 to change, 0 to destroy\n", "a plan's Markdown"),
        ('{"format_version": 1, "hosts": {}, "failures": {}}', "the output of engine-ctl facts --json"),
        ("[1, 2]", "JSON, a list"),
        ("", "empty"),
        ("key: [unclosed\n", "neither JSON nor YAML"),
    ],
)
def test_show_says_what_a_file_that_is_not_a_plan_is(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "thing.json"
    path.write_text(content)
    result = run("show", str(path))
    assert result.exit_code == 1
    assert f"{path}: error: is not a saved plan: it is {said}" in result.stderr, result.stderr
    assert "hint: save a plan with `engine-ctl plan PATHS --out FILE`" in result.stderr


def test_show_refuses_a_directory_a_missing_file_binary_and_a_newer_plan(tmp_path: Path) -> None:
    assert "is a directory, not a saved plan" in run("show", str(tmp_path)).stderr
    assert f"{tmp_path / 'nope'}: error: does not exist" in run("show", str(tmp_path / "nope")).stderr
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00garbage")
    assert "is not text (not UTF-8)" in run("show", str(tmp_path / "bin")).stderr
    (tmp_path / "new.json").write_text(json.dumps({"format_version": 99, "changes": [], "state_lineage": "x"}))
    newer = run("show", str(tmp_path / "new.json"))
    assert newer.exit_code == 1 and "a plan from a newer engine-ctl; upgrade engine-ctl" in newer.stderr
    both = run("show", str(tmp_path / "new.json"), "--json", "--markdown")
    assert both.exit_code == 1 and "choose one" in both.stderr


# --- the Markdown a reviewer reads ------------------------------------------------------------------------------


def desired(**specs: str):  # type: ignore[no-untyped-def]
    text = MODEL + "".join(f"---\nmetadata: {{name: {n}}}\nspec: {{model: m, {s}}}\n" for n, s in specs.items())
    return load_documents(parse_text(text, "d.yaml")[0]).desired


def plan_create() -> Plan:
    return make_plan(desired(chat="gpus: 1"), State(lineage=LINEAGE), *world(h100x8()), {"m": SHAPE})


def plan_roll() -> Plan:
    h = h100x8()
    first = make_plan(desired(chat="gpus: 4, context_length: 4096"), State(lineage=LINEAGE), *world(h), {"m": SHAPE})
    state, facts = applied(first, State(lineage=LINEAGE), {h.host: h})
    return make_plan(desired(chat="gpus: 4, context_length: 8192"), state, *world(*facts.values()), {"m": SHAPE})


def plan_no_changes() -> Plan:
    h = h100x8()
    first = plan_create()
    state, facts = applied(first, State(lineage=LINEAGE), {h.host: h})
    # the engine its replica runs is on the host (else the plan warns that the replica would not start again)
    argv0 = state.deployments["chat"].replicas[0].argv[0]
    engines = {"llama.cpp": EngineInstall(path=argv0, version="0.5.0", sha256="e" * 64)}
    facts = {n: f.model_copy(update={"engines": engines}) for n, f in facts.items()}
    return make_plan(desired(chat="gpus: 1"), state, *world(*facts.values()), {"m": SHAPE})


def plan_with_every_warning() -> Plan:
    """Downtime (stop-then-start of a single replica), pending, failed, not reconciled (a host out of reach),
    drift (a unit engine-ctl does not manage) and a deployment destroyed because its document is absent."""
    h = h100x8()
    first = make_plan(desired(big="gpus: 8, context_length: 4096"), State(lineage=LINEAGE), *world(h), {"m": SHAPE})
    state, facts = applied(first, State(lineage=LINEAGE), {h.host: h})
    state.deployments["edge"] = DeploymentRecord(
        name="edge", revision=2, state="Ready",
        replicas=[ReplicaRecord(index=0, host="gpu-b", unit="engine-ctl-edge-0a.service", port=8000,
                                unit_sha256="a" * 64, revision=2, status="serving")],
    )  # fmt: skip
    other = UnitFact(name="engine-ctl-other-0a.service", sha256="b" * 64, active_state="active", sub_state="running")
    now = facts[h.host].model_copy(update={"units": (*facts[h.host].units, other)})
    wanted = desired(big="gpus: 8, context_length: 8192", waits="gpus: 8", toolong="gpus: 1, context_length: 100000")
    unreachable = {"gpu-b": "cannot connect to 198.18.0.12:22: connection refused"}
    return make_plan(wanted, state, world(now)[0], {h.host: now}, {"m": SHAPE}, unreachable=unreachable)


GOLDEN_CASES = {
    "plan-create": lambda: plan_markdown(plan_create(), "pr.plan.json"),
    "plan-roll": lambda: plan_markdown(plan_roll(), "pr.plan.json"),
    "plan-no-changes": lambda: plan_markdown(plan_no_changes(), "pr.plan.json"),
    "plan-warnings": lambda: plan_markdown(plan_with_every_warning(), "pr.plan.json"),
    "plan-cut": lambda: plan_markdown(plan_with_every_warning(), "pr.plan.json", limit=2000),
    "plan-cut-unsaved": lambda: plan_markdown(plan_with_every_warning(), None, limit=1300),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_markdown(case: str) -> None:
    text = GOLDEN_CASES[case]()
    path = GOLDEN / f"{case}.md"
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{case}: rerun with UPDATE_GOLDEN=1 after checking the change"
    assert_well_formed(text)


def outside_code(text: str) -> str:
    """The text without its inline code spans (whose content is shown literally, tags and all)."""
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", text)


def assert_well_formed(text: str) -> None:
    """Every <details> closed, every fence closed, every table row of the right width."""
    assert outside_code(text).count("<details>") == outside_code(text).count("</details>")
    fences = [line for line in text.splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0, fences
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = re.split(r"(?<!\\)\|", line)
            width = 5 if line.count("|") - line.count("\\|") == 4 else 4
            assert len(cells) == width, line


def test_summary_and_warnings_come_before_any_deployment_section() -> None:
    text = plan_markdown(plan_with_every_warning())
    first_section = text.index("<details>")
    assert text.startswith("### engine-ctl plan: 1 to add, 1 to change, 1 to destroy\n")
    for label in ("**Downtime:**", "**Pending:**", "**Failed:**", "**Not reconciled:**", "**Drift**",
                  "**Unreachable:**", "**Destroyed because the documents are absent:**"):  # fmt: skip
        assert 0 < text.index(label) < first_section, label
    assert text.index("[!CAUTION]") < text.index("[!WARNING]")
    assert "is Failed:" not in text  # the Failed caution says it once
    for name in ("big", "edge", "waits"):
        assert f"<b>{name}</b>" in text


def test_the_argv_diff_marks_the_words_that_changed_within_the_whole_argv() -> None:
    old = ["/bin/llama-server", "--model", "/m.gguf", "--ctx-size", "1024", "--jinja", "--port", "8000"]
    new = [*old[:4], "2048", "--jinja", "--temp", "0.7", "--port", "8000"]
    assert argv_word_diff(old, new) == [
        "  /bin/llama-server", "  --model /m.gguf", "- --ctx-size 1024", "+ --ctx-size 2048", "  --jinja",
        "+ --temp 0.7", "  --port 8000",
    ]  # fmt: skip
    text = plan_markdown(plan_roll())
    assert "- --ctx-size 16384\n+ --ctx-size 32768\n" in text and "\n  --parallel 4\n" in text
    assert "| `spec.context_length` | `4096` | `8192` |" in text


def test_a_plan_past_the_comment_limit_is_cut_with_where_the_full_plan_is() -> None:
    engine = {"llama.cpp": EngineInstall(path="/usr/local/bin/llama-server")}

    def host(i: int):  # type: ignore[no-untyped-def]
        """The recorded 8×H100, with UUIDs of its own (GPUs are addressed by UUID across the fleet)."""
        h = h100x8(f"gpu-{i:02d}")
        gpus = tuple(g.model_copy(update={"uuid": f"{g.uuid}-{i:02d}"}) for g in h.gpus)
        return h.model_copy(update={"engines": engine, "gpus": gpus})

    hosts = [host(i) for i in range(40)]  # all placed
    many = {f"d{i:03d}": "gpus: 1, engine_args: [--temp, '0.7']" for i in range(300)}
    plan = make_plan(desired(**many), State(lineage=LINEAGE), *world(*hosts), {"m": SHAPE})
    whole = plan_markdown(plan, "pr.plan.json", limit=10**9)
    assert len(whole) > COMMENT_LIMIT
    text = plan_markdown(plan, "pr.plan.json")
    assert len(text.encode("utf-16-le")) // 2 <= COMMENT_LIMIT
    assert "**The plan is cut here:** it is longer than a GitHub comment (65,536 characters)" in text
    assert "The full plan: `engine-ctl show pr.plan.json`." in text
    shown = text.count("<details>")
    assert 0 < shown < 300 and f"{300 - shown} deployment section(s) not shown" in text
    assert text.endswith("apply exactly it with `engine-ctl apply pr.plan.json`.</sub>\n")
    assert_well_formed(text)
    assert whole.startswith(text[: text.index("\n---\n**The plan is cut here")])  # a prefix, cut between sections


def test_markdown_from_hostile_text_cannot_break_out_of_its_place() -> None:
    """Messages and values come from documents and hosts: no fence, HTML tag or table cell can be closed early."""
    change = DeploymentChange(
        name="chat", action=["update"], old_revision=1, revision=2, reasons=["a reason </details> <img src=x>"],
        field_changes=[FieldChange(path="spec.labels.team", old="a|b", new="```\n</details>")],
    )  # fmt: skip
    drift = Drift(host="h", unit="engine-ctl-chat-0a.service", kind="edited", detail="*bold* [link](x) ```")
    plan = Plan(state_serial=1, state_lineage=LINEAGE, changes=[change], drift=[drift])
    text = plan_markdown(plan)
    assert_well_formed(text)
    assert outside_code(text).count("</details>") == 1 and "a reason \\</details\\> \\<img src=x\\>" in text
    assert "\\*bold\\* \\[link\\](x) \\`\\`\\`" in text
    assert '| `spec.labels.team` | `"a\\|b"` | ````"```\\n</details>"```` |' in text


def test_the_old_diff_test_for_colours_still_holds_in_the_new_layout() -> None:
    text = plan_markdown(plan_create())
    assert "```diff\n+ /usr/local/bin/llama-server\n" in text


# --- replica logs, without hosts (tests/test_fleet_logs.py reads the real journal) ------------------------------


@pytest.mark.parametrize(
    ("given", "passed"),
    [("30s", "-30s"), ("10m", "-600s"), ("1h30m", "-5400s"), ("2d", "-172800s"), ("today", "today"),
     ("2024-05-01T12:00:00+00:00", "@1714564800"), ("2024-05-01 14:00:00+02:00", "@1714564800")],
)  # fmt: skip
def test_since_becomes_what_journalctl_parses(given: str, passed: str) -> None:
    from engine_ctl.cli.logs_cmd import since_argument

    assert since_argument(given) == passed


def test_journal_entries_are_the_replicas_lines_with_time_and_nothing_else() -> None:
    from engine_ctl.cli.logs_cmd import Replica, format_line, parse_entry

    r = Replica("fleet-1", "engine-ctl-chat-0a.service", 0)
    units = {r.unit: r}

    def entry(**fields: object) -> str:
        return json.dumps({"__REALTIME_TIMESTAMP": "1714564800123456", **fields})

    own = parse_entry(entry(MESSAGE="main: server is listening", _SYSTEMD_UNIT=r.unit), units)
    assert own == (1714564800123456, r, "main: server is listening")
    assert format_line(*own, 20) == "fleet-1 instance 0   | 2024-05-01T12:00:00.123Z main: server is listening"
    said = parse_entry(
        entry(MESSAGE="Started engine-ctl-chat-0a.service", _SYSTEMD_UNIT="init.scope", UNIT=r.unit), units
    )
    assert said is not None and said[2] == "systemd: Started engine-ctl-chat-0a.service"
    raw = parse_entry(entry(MESSAGE=[104, 105, 255], _SYSTEMD_UNIT=r.unit), units)  # not UTF-8: a list of bytes
    assert raw is not None and raw[2] == "hi\ufffd"
    hostile = parse_entry(entry(MESSAGE="\x1b[2J\x1b]0;owned\x07x", _SYSTEMD_UNIT=r.unit), units)
    assert hostile is not None and hostile[2] == "\\x1b[2J\\x1b]0;owned\\x07x"  # no escape reaches the terminal
    assert parse_entry(entry(MESSAGE="x", _SYSTEMD_UNIT="engine-ctl-other-0a.service"), units) is None
    assert parse_entry("No journal files were found.", units) is None
    from engine_ctl.cli.logs_cmd import json_line, parse_fields

    fields = parse_fields(entry(MESSAGE="Started x", _SYSTEMD_UNIT="init.scope", UNIT=r.unit), units)
    assert fields is not None
    assert json.loads(json_line(*fields, "chat")) == {
        "time": "2024-05-01T12:00:00.123Z", "deployment": "chat", "host": "fleet-1", "instance": 0,
        "unit": "engine-ctl-chat-0a.service", "source": "systemd", "message": "Started x",
    }  # fmt: skip


def test_the_local_stream_hands_over_lines_as_they_come_and_ends_the_process_on_stop(tmp_path: Path) -> None:
    import threading
    import time

    from engine_ctl.core.documents.inventory import Host
    from engine_ctl.shell.transport import LocalTransport

    transport = LocalTransport(Host(name="localhost", address="127.0.0.1", transport="local"))
    stop = threading.Event()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if len(lines) == 2:
            stop.set()

    started = time.monotonic()
    code = transport.stream(["sh", "-c", "echo $$; echo two; sleep 60; echo never"], on_line, stop)
    assert code is None and lines == [lines[0], "two"] and time.monotonic() - started < 10
    time.sleep(0.2)
    assert not Path(f"/proc/{lines[0]}").exists() or "zombie" in Path(f"/proc/{lines[0]}/status").read_text()
    ended: list[str] = []
    assert (
        transport.stream(
            ["sh", "-c", "echo a; printf 'b\\r\\nno newline'; exit 3"], ended.append, stop=threading.Event()
        )
        == 3
    )
    assert ended == ["a", "b", "no newline"]


def write_state(path: Path, host: str = "fleet-1") -> None:
    from engine_ctl.state.local import LocalState

    replicas = [ReplicaRecord(index=i, host=host, unit=f"engine-ctl-chat-{i}a.service", port=8000 + i,
                              unit_sha256="a" * 64, revision=1, status="serving") for i in (0, 1)]  # fmt: skip
    LocalState(path).write(State(deployments={"chat": DeploymentRecord(name="chat", revision=1, replicas=replicas)}))


def test_logs_refuses_what_it_cannot_read_with_a_hint(tmp_path: Path) -> None:
    state = tmp_path / "engine-ctl.state.json"
    write_state(state)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  - {name: other, address: 198.18.0.99}\n")
    base = ("--state", str(state), "--inventory", str(inventory))
    unknown = run("logs", "nope", *base)
    assert unknown.exit_code == 1 and "no deployment named 'nope' in the state" in unknown.stderr
    assert "hint: deployments: chat" in unknown.stderr
    instance = run("logs", "chat", "--instance", "7", *base)
    assert (
        instance.exit_code == 1
        and "chat has no instance 7" in instance.stderr
        and "its instances: 0, 1" in instance.stderr
    )
    since = run("logs", "chat", "--since", "last tuesday", *base)
    assert since.exit_code == 1 and "--since: 'last tuesday' is not a duration or a time" in since.stderr
    missing = run("logs", "chat", *base)
    assert (
        missing.exit_code == 1
        and f"{state}:" in missing.stderr  # at the state's place that names the host (issue 24)
        and "deployments.chat.replicas[0].host: host 'fleet-1', where replica 0 of chat runs as the state records "
        "it, is not in the inventory"
        in missing.stderr
    )
    for result in (unknown, instance, since, missing):
        assert "Traceback" not in result.output


def test_a_bad_variable_is_an_error_never_changes_present() -> None:
    """click exits 2 on a usage error, which --detailed-exitcode means as "changes present": engine-ctl says 1."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ENGINE_CTL_PARALLEL": "abc"}
    proc = subprocess.run([sys.executable, "-m", "engine_ctl", "plan", "examples/quickstart", "--detailed-exitcode"],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 1 and "ENGINE_CTL_PARALLEL" in proc.stderr
