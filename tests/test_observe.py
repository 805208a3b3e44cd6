"""Observability without a fleet (issue 28): the inventory's monitoring block (read, refused with its place), the
gateway's access log format and metrics frontend as rendered and as the real HAProxy reads them (`haproxy -c`),
parsing and adding up request lines, and the Prometheus scrape_configs block (checked by the real promtool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engine_ctl.core.accesslog import format_request, parse_request, usage
from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import load_inventory
from engine_ctl.core.plan.gateway import gateway_after_apply, gateway_tampering
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import ACCESS_LOG_FIELDS, access_log_format
from engine_ctl.core.render.scrape import scrape_configs
from tests.helpers import run, write
from tests.test_gateway_core import SHAPE, applied, desired, world

ROOT = Path(__file__).resolve().parents[1]
HOSTS = (
    "hosts:\n  - {name: edge, address: 10.0.0.2, roles: [gateway]}\n  - {name: edge2, address: 10.0.0.3, "
    "roles: [gateway], gateway_port: 9000}\n  - {name: prom, address: 10.0.0.9}\n  - {name: named, address: "
    "mon.example}\n"
)
LINE = (
    '{"ts":1796390473.625,"id":"req-1","gateway":"edge","key":"alice","deployment":"chat","replica":"r0a",'
    '"server":"10.0.0.3:8080","method":"POST","path":"\\/v1\\/chat\\/completions","status":200,"bytes_in":244,'
    '"bytes_out":85,"queue_ms":0,"connect_ms":1,"ttfb_ms":8,"total_ms":9,"term":"--","retries":0,'
    '"prompt_tokens":"11","completion_tokens":"4"}'
)


def test_the_monitoring_block_names_a_port_and_the_hosts_that_may_scrape(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", "monitoring: {port: 8405, hosts: [prom, 10.1.0.0/16, "
                               "10.0.0.9, 2001:db8::1]}\n" + HOSTS))  # fmt: skip
    assert inv.gateway.metrics_port == 8405
    assert inv.gateway.metrics_allow == ("10.0.0.9", "10.1.0.0/16", "2001:db8::1")  # prom's address, once
    assert load_inventory(write(tmp_path, "plain.yaml", HOSTS)).gateway.metrics_port is None


@pytest.mark.parametrize(
    ("block", "where", "message"),
    [
        ("monitoring: {port: 0}\n", "1:20", "monitoring.port: between 1 and 65535, not 0"),
        ("monitoring: {port: 9000}\n", "1:20", "monitoring.port: 9000 is already edge2's gateway_port"),
        ("monitoring: {port: 8809}\n", "1:20", "monitoring.port: 8809 is already the scaler's wake port"),
        ("monitoring:\n  port: 8405\n  hosts: [prom, nowhere]\n", "3:17",
         "monitoring.hosts[1]: 'nowhere' is neither a host of this inventory nor an IP address or network"),
        ("monitoring:\n  port: 8405\n  hosts: [named]\n", "3:11",
         "monitoring.hosts[0]: host 'named' has the address 'mon.example', not an IP address"),
        ("monitoring: {hosts: [prom]}\n", "1:1", "monitoring.port: required field is missing"),
    ],
)  # fmt: skip
def test_a_wrong_monitoring_block_is_refused_with_its_place(
    tmp_path: Path, block: str, where: str, message: str
) -> None:
    path = write(tmp_path, "hosts.yaml", block + HOSTS)
    with pytest.raises(InputError) as err:
        load_inventory(path)
    rendered = [d.render() for d in err.value.diagnostics]
    assert any(r.startswith(f"{path}:{where}: error: {message}") for r in rendered), rendered
    result = run("validate", "--inventory", str(path), str(ROOT / "examples/seed"))
    assert result.exit_code == 1 and f"{path}:{where}: error: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_the_plan_renders_the_metrics_port_and_apply_keeps_it(tmp_path: Path) -> None:
    inv, facts = world()
    plain = make_plan(desired(), State(), inv, facts, SHAPE).gateways[0]
    assert "frontend metrics" not in plain.files["haproxy.cfg"]
    assert "log-format '" + access_log_format(inv.hosts[0].name) + "'" in plain.files["haproxy.cfg"]
    metrics = {"metrics_port": 8405, "metrics_allow": ("10.0.0.9",)}
    inv = inv.model_copy(update={"gateway": inv.gateway.model_copy(update=metrics)})
    plan = make_plan(desired(), State(), inv, facts, SHAPE)
    (g,) = plan.gateways
    assert (g.metrics_port, g.metrics_allow) == (8405, ["10.0.0.9"])
    config = g.files["haproxy.cfg"]
    assert "frontend metrics\n    bind *:8405\n" in config
    assert "tcp-request connection reject unless { src 127.0.0.0/8 ::1 10.0.0.9 }" in config
    state, _ = applied(plan, facts)
    after = gateway_after_apply(inv.hosts[0], state, {h.name: h for h in inv.hosts}, g)
    assert after.files["haproxy.cfg"] == config
    forged = plan.model_copy(deep=True)
    forged.gateways[0].metrics_allow = ["0.0.0.0/0"]
    assert f"gateway {g.host}: its metrics port or monitoring hosts are not the inventory's" in gateway_tampering(
        forged.gateways, forged.changes, State(lineage=forged.state_lineage), inv
    )
    # the real HAProxy reads it (the Lua's metrics service included)
    folder = tmp_path / "gw"
    folder.mkdir()
    for name, text in g.files.items():
        (folder / name).write_text(text.replace("/run/engine-ctl-gateway", str(folder)))
    (folder / "internal.map").write_text("gateway " + "0" * 64 + "\n")
    checked = subprocess.run(["haproxy", "-c", "-q", "-f", str(folder / "haproxy.cfg")], capture_output=True,
                             text=True, cwd=folder)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_access_log_never_holds_a_header_a_query_or_a_body() -> None:
    fields = " ".join(value for _, value, _ in ACCESS_LOG_FIELDS)
    aliases = set(fields.replace(":", " ").split())
    for never in ("%hr", "%hrl", "%hs", "%hsl", "%CC", "%CS", "%r", "%HU", "%HQ"):  # headers, request line, URI
        assert never not in aliases
    for never in ("req.hdr", "req.body", "res.body", "authorization", "query", "url"):
        assert never not in fields.lower()
    assert json.loads(access_log_format("edge").replace("%Ts.%ms", "1.5").replace("%ST", "1").replace("%U", "1")
                      .replace("%B", "1").replace("%Tw", "1").replace("%Tc", "1").replace("%Tr", "1")
                      .replace("%Ta", "1").replace("%rc", "1"))["gateway"] == "edge"  # fmt: skip
    # the tokens are a variable set from the answer's `usage` only (digits, a slash, digits: the rule after the
    # regex drops any other value; tests/test_gateway_usage_counts.py): the log carries two numbers, never the body
    assert ("prompt_tokens", "%[var(txn.tokens),field(1,/)]", True) in ACCESS_LOG_FIELDS


def test_request_lines_are_parsed_shown_and_added_up() -> None:
    r = parse_request(LINE, {"10.0.0.3": "gpu-1"})
    assert r is not None
    assert (r.key, r.deployment, r.replica, r.host, r.path, r.status) == (
        "alice", "chat", "r0a", "gpu-1", "/v1/chat/completions", 200
    )  # fmt: skip
    shown = format_request(r)
    assert shown.startswith("2026-12-04T") and "200 chat key=alice replica=r0a@gpu-1" in shown and "id=req-1" in shown
    refused = parse_request(
        LINE.replace('"key":"alice"', '"key":"-"').replace('"replica":"r0a"', '"replica":"<NOSRV>"')
        .replace('"status":200', '"status":401').replace('"ttfb_ms":8', '"ttfb_ms":-1')
    )  # fmt: skip
    assert refused is not None and refused.key is None and refused.replica is None
    assert parse_request("Server d_chat/r0a is UP") is None and parse_request('{"ts":1,"id":') is None
    # a stream: HAProxy logs "-" for the token variables it never set
    streamed = parse_request(LINE.replace('"prompt_tokens":"11","completion_tokens":"4"',
                                          '"prompt_tokens":"-","completion_tokens":"-"'))  # fmt: skip
    assert streamed is not None and streamed.prompt_tokens is None and (r.prompt_tokens, r.completion_tokens) == (11, 4)
    rows = usage([r, r, refused, streamed], by="key")
    assert list(rows) == ["-", "alice"]
    assert (rows["alice"].requests, rows["alice"].errors, rows["alice"].bytes_out) == (3, 0, 255)
    assert (rows["alice"].prompt_tokens, rows["alice"].generated_tokens, rows["alice"].uncounted) == (22, 8, 1)
    assert rows["-"].uncounted == 0  # refused by the gateway: no answer of an engine to count
    assert rows["-"].errors == 1 and rows["-"].p50_ttfb_ms() is None and rows["alice"].p50_ttfb_ms() == 8
    assert list(usage([r], by="deployment")) == ["chat"]


def test_the_scrape_config_covers_every_gateway_and_promtool_accepts_it(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", "monitoring: {port: 8405, hosts: [prom]}\n" + HOSTS))
    text = scrape_configs(inv, 5)
    assert text.count('targets: ["10.0.0.2:8405"]') == 2 and text.count('targets: ["10.0.0.3:8405"]') == 2
    assert "metrics_path: /metrics/engine-ctl" in text and "scrape_interval: 5s" in text
    config = write(tmp_path, "prometheus.yml", text)
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = run("monitoring", "scrape-config", "--inventory", str(tmp_path / "hosts.yaml"), "--interval", "5")
    assert shown.exit_code == 0 and shown.stdout == text
    none = run("monitoring", "scrape-config", "--inventory", str(write(tmp_path, "plain.yaml", HOSTS)))
    assert none.exit_code == 1 and "no monitoring block" in none.stderr and "Traceback" not in none.output


STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,req_tot,rtime\n"
    "api,FRONTEND,,,3,5,1000,40,0,0,40,\n"
    "d_chat,r0a,1,1,2,2,2,30,0,0,,12\n"
    "d_chat,BACKEND,1,1,2,2,100,30,0,0,30,12\n"
    "ectl_usage,BACKEND,0,0,0,0,100,0,0,0,0,0\n"
)


def test_the_watch_board_adds_the_gateways_figures_up() -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from engine_ctl.cli.watch_cmd import backend_figures, board
    from engine_ctl.core.accesslog import RequestLine
    from engine_ctl.core.plan.status import DeploymentStatus

    # the recent requests the gateways logged: the column is their median TTFB (a mean would read 231 ms), a
    # request that never reached a replica (-1) does not count, nor one of another deployment
    recent = [RequestLine(ts=1.0, deployment="chat", ttfb_ms=ms) for ms in (5, 900, 7, -1, 12)]
    figures = backend_figures([STAT, STAT.replace(",30,0,0,30,12", ",10,0,0,10,4")], recent)
    chat = figures["chat"]
    assert list(figures) == ["chat"] and (chat.in_flight, chat.queued, chat.requests) == (4, 2, 40)
    assert chat.ttfb() == 7  # the lower middle of 5, 7, 12, 900
    assert backend_figures([STAT])["chat"].ttfb() is None  # nothing logged lately: no figure, not HAProxy's mean
    status = DeploymentStatus(name="chat", state="Ready", ready=1, replicas=1, revision=1, hosts=["h"], instances=[])
    out = Console(width=150, no_color=True, record=True)
    out.print(board([status], figures, {}, datetime(2026, 1, 1, tzinfo=UTC), 0.4))
    text = out.export_text()
    assert text.splitlines()[1].split()[:7] == ["chat", "ready", "1/1", "4", "2", "40", "7"]
    assert "the median time to the first byte" in text


def test_the_scrape_config_reads_each_engine_through_the_first_gateway(tmp_path: Path) -> None:
    from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer

    inv = load_inventory(write(tmp_path, "hosts.yaml", "monitoring: {port: 8405, hosts: [prom]}\n" + HOSTS))
    servers = (GatewayServer(name="r0a", address="10.0.0.9", port=8000, maxconn=2),
               GatewayServer(name="r1b", address="10.0.0.3", port=8001, maxconn=2))  # fmt: skip
    text = scrape_configs(inv, 15, [GatewayBackend(deployment="chat", servers=servers)])
    engines = text.split("job_name: engine-ctl-engines", 1)[1]
    assert engines.count('targets: ["10.0.0.2:8405"]') == 2 and "10.0.0.3:8405" not in engines  # once each
    assert '__metrics_path__: "/metrics/replica/chat/r1b", deployment: "chat", replica: "r1b", host: "edge2"' in engines
    checked = subprocess.run(["promtool", "check", "config", str(write(tmp_path, "p.yml", text))],
                             capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
