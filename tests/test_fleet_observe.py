"""Observability on the real fleet (issue 28): the real HAProxy gateway writes one JSON line per request to its
journal (`engine-ctl logs --gateway`, `engine-ctl usage`), exports Prometheus metrics on the inventory's
monitoring port to the monitoring hosts only, and a real Prometheus (Debian's `prometheus` package, run here on
the test machine, which is the fleet's bridge address and the inventory's one monitoring host) scrapes it from
`engine-ctl monitoring scrape-config` and answers PromQL with exactly the requests this module sent.

One project for the module (test_fleet_gateway's GatewayProject): two deployments of one replica each, gw-b on
demand (its first request is held and wakes it: the scaler's decisions, holds and wakes are then series too), so
one apply (the slow part) serves every test here."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import SUBNET, Fleet
from tests.fleetproject import ROOT
from tests.test_fleet_gateway import KEY_A, KEY_ALL, GatewayProject

pytestmark = pytest.mark.fleet
METRICS_PORT = 8405
JOBS = {"engine-ctl", "engine-ctl-haproxy", "engine-ctl-engines"}
PROMETHEUS = "/usr/bin/prometheus"


class ObserveProject(GatewayProject):
    """gw-a and gw-b (on demand), one replica each on two hosts; the inventory's monitoring block names this
    machine (the fleet's bridge address) as the one monitoring host."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        super().__init__(path, fleet)
        self.inventory.write_text(
            self.inventory.read_text() + f"monitoring:\n  port: {METRICS_PORT}\n  hosts: [{SUBNET}.1]\n"
        )
        self.since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
        """When this module began: the gateway host's journal may hold earlier modules' requests to gw-a and gw-b."""
        self.sent: Counter[str] = Counter()
        """Requests this module sent to each deployment that reached it (what Prometheus must count)."""

    def write(self, *args: object, **kwargs: object) -> None:
        self.keys = {"obs-all": (KEY_ALL, None), "obs-a": (KEY_A, ["gw-a"])}
        (self.docs / "deployments.yaml").write_text(
            textwrap.dedent(
                f"""
                kind: Model
                metadata: {{name: tiny}}
                spec: {{format: gguf, path: tiny/tiny.gguf, parameters: 4170048}}
                ---
                metadata: {{name: gw-a}}
                spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512,
                        host: {self.fleet.hosts[1].name}}}
                ---
                metadata: {{name: gw-b}}
                spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {self.pinned.name},
                        replicas: {{min: 0, max: 1, idle_minutes: 30}}}}
                """
            )
        )
        docs = []
        for name, (key, scope) in self.keys.items():
            lines = ["kind: ApiKey", f"metadata: {{name: {name}}}", "spec:", f"  sha256: {key_sha256(key)}"]
            lines += [f"  deployments: [{', '.join(scope)}]"] if scope else []
            docs.append("\n".join(lines) + "\n")
        (self.docs / "keys.yaml").write_text("---\n".join(docs))

    def chat(self, model: str, key: str = KEY_ALL, request_id: str | None = None) -> tuple[int, dict[str, str]]:
        """One chat completion through the gateway: its status and response headers."""
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": model, "max_tokens": 2})
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        request = urllib.request.Request(f"{self.base}/chat/completions", body.encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                status, got = answer.status, {k.lower(): v for k, v in answer.headers.items()}
                answer.read()
        except urllib.error.HTTPError as exc:
            status, got = exc.code, {k.lower(): v for k, v in exc.headers.items()}
        if status == 200:
            self.sent[model] += 1
        return status, got

    def stream(self, model: str, key: str = KEY_ALL) -> int:
        """One streamed chat completion through the gateway (read to its end): its status."""
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": model, "max_tokens": 2,
                           "stream": True})  # fmt: skip
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        request = urllib.request.Request(f"{self.base}/chat/completions", body.encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                status, kind = answer.status, answer.headers.get("Content-Type", "")
                assert b"[DONE]" in answer.read() and kind.startswith("text/event-stream"), kind
        except urllib.error.HTTPError as exc:
            status = exc.code
        if status == 200:
            self.sent[model] += 1
        return status


@pytest.fixture(scope="module")
def ob(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObserveProject]:
    p = ObserveProject(tmp_path_factory.mktemp("observe"), fleet)
    p.write()
    p.cli("apply", "--auto-approve", check=True)
    yield p
    p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def test_request_log_has_every_request_and_never_the_key(ob: ObserveProject) -> None:
    status, headers = ob.chat("gw-a", KEY_A, request_id="obs-given-1")
    assert status == 200 and headers["x-request-id"] == "obs-given-1"  # the client's own ID, echoed
    status, headers = ob.chat("gw-b")
    assert status == 200
    made = headers["x-request-id"]  # none given: the gateway's own, a UUID
    assert len(made) == 36 and made.count("-") == 4
    status, headers = ob.chat("gw-a", "ak-wrong-" + "d4" * 20)
    assert status == 401 and "x-request-id" in headers  # the gateway's own answers carry one too
    time.sleep(1)

    shown = ob.cli("logs", "--gateway", "--json", "--inventory", str(ob.inventory), "--since", ob.since)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = [json.loads(x) for x in shown.stdout.splitlines()]
    by_id = {x["id"]: x for x in lines}
    given = by_id["obs-given-1"]
    assert given["key"] == "obs-a" and given["deployment"] == "gw-a" and given["status"] == 200
    assert given["gateway"] == ob.gateway.name
    assert given["host"] == ob.fleet.hosts[1].name and given["replica"].startswith("r0")  # the replica: host + slot
    assert given["bytes_in"] > 100 and given["bytes_out"] > 100
    assert given["total_ms"] >= given["ttfb_ms"] >= 0 and given["queue_ms"] >= 0 and given["connect_ms"] >= 0
    assert by_id[made]["key"] == "obs-all" and by_id[made]["deployment"] == "gw-b"
    assert by_id[made]["host"] == ob.pinned.name
    refused = [x for x in lines if x["status"] == 401]
    assert refused and refused[-1]["key"] is None and refused[-1]["deployment"] is None
    assert [x["ts"] for x in lines] == sorted(x["ts"] for x in lines)  # merged in time order

    only_b = ob.cli("logs", "--gateway", "gw-b", "--inventory", str(ob.inventory), "--since", ob.since)
    assert only_b.returncode == 0, only_b.stdout + only_b.stderr
    assert only_b.stdout and all(" 200 gw-b " in x for x in only_b.stdout.splitlines()), only_b.stdout
    assert made in only_b.stdout and "obs-given-1" not in only_b.stdout
    # --lines counts requests, not journal lines (HAProxy's own messages are in the same journal; before, 10 lines
    # could give 1 request: a probe, session 16)
    newest = ob.cli("logs", "--gateway", "--json", "--lines", "2", "--inventory", str(ob.inventory))
    assert newest.returncode == 0, newest.stdout + newest.stderr
    assert [json.loads(x)["id"] for x in newest.stdout.splitlines()] == [x["id"] for x in lines[-2:]], newest.stdout

    # --follow: a request sent while following arrives as its line; Ctrl-C ends it (130)
    follow = subprocess.Popen(
        [sys.executable, "-m", "engine_ctl", "logs", "--gateway", "--follow", "--json", "--lines", "0",
         "--inventory", str(ob.inventory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ob.path,
    )  # fmt: skip
    try:
        assert follow.stdout is not None and follow.stderr is not None
        time.sleep(3)
        assert follow.poll() is None, follow.stderr.read()
        assert ob.chat("gw-a", KEY_A, request_id="obs-followed-1")[0] == 200
        streamed = json.loads(follow.stdout.readline())
        assert streamed["id"] == "obs-followed-1" and streamed["key"] == "obs-a"
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=15) == 130
        assert "Traceback" not in follow.stderr.read()
    finally:
        if follow.poll() is None:
            follow.kill()

    # no key material anywhere in the gateway host's journal, nor in what engine-ctl printed
    journal = ob.fleet.ssh(ob.gateway, "journalctl --no-pager -o cat -u engine-ctl-gateway.service").stdout
    assert '"id":"obs-given-1"' in journal
    for secret in (KEY_A, KEY_ALL, key_sha256(KEY_A), key_sha256(KEY_ALL), "ak-wrong-"):
        assert secret not in journal
        assert all(secret not in said for said in ob.said)


def test_usage_per_key_and_deployment(ob: ObserveProject) -> None:
    for _ in range(2):
        assert ob.chat("gw-b", KEY_ALL)[0] == 200
    time.sleep(1)
    got = ob.cli("usage", "--since", ob.since, "--by", "key", "--json", "--inventory", str(ob.inventory))
    assert got.returncode == 0, got.stdout + got.stderr
    report = json.loads(got.stdout)
    rows = {r["key"]: r for r in report["rows"]}
    assert rows["obs-a"]["requests"] == ob.sent["gw-a"]  # every gw-a request of this module used a-only
    assert rows["obs-all"]["requests"] == ob.sent["gw-b"] and rows["obs-all"]["errors"] == 0
    assert rows["-"]["errors"] >= 1  # the wrong key: refused before a key was known
    assert report["exact"] == ["requests", "errors", "bytes_in", "bytes_out", "prompt_tokens", "generated_tokens"]
    # tokens per key: the engine's own usage counts of each whole JSON answer, which the gateway logged
    allkey = rows["obs-all"]
    assert allkey["uncounted"] == 0 and 1 <= allkey["generated_tokens"] <= 2 * ob.sent["gw-b"], allkey
    assert allkey["prompt_tokens"] >= ob.sent["gw-b"], allkey
    streamed_before = rows["obs-all"]["uncounted"]
    assert ob.stream("gw-b", KEY_ALL) == 200
    time.sleep(1)
    again = json.loads(ob.cli("usage", "--since", ob.since, "--by", "key", "--json", "--inventory",
                              str(ob.inventory)).stdout)  # fmt: skip
    after = {r["key"]: r for r in again["rows"]}["obs-all"]
    assert after["uncounted"] == streamed_before + 1 and after["generated_tokens"] == allkey["generated_tokens"]
    table = ob.cli("usage", "--by", "deployment", "--since", ob.since, "--inventory", str(ob.inventory))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["DEPLOYMENT", "REQUESTS", "ERRORS"]
    assert "PROMPT TOKENS" in table.stdout and "ENGINE GENERATED" in table.stdout
    assert "since each replica started" in table.stdout
    # tokens per deployment: the engines' own counters (llama-server's), read through the gateway's metrics port
    per = json.loads(ob.cli("usage", "--by", "deployment", "--since", ob.since, "--json", "--inventory",
                            str(ob.inventory)).stdout)  # fmt: skip
    rows = {r["deployment"]: r for r in per["rows"]}
    assert rows["gw-a"]["requests"] == ob.sent["gw-a"] and rows["gw-b"]["requests"] == ob.sent["gw-b"]
    for name in ("gw-a", "gw-b"):  # max_tokens 2 a request: at most 2 generated each
        assert 1 <= rows[name]["engine_generated_tokens"] <= 2 * ob.sent[name], rows[name]
        assert rows[name]["engine_prompt_tokens"] >= ob.sent[name], rows[name]
        assert rows[name]["generated_tokens"] <= rows[name]["engine_generated_tokens"], rows[name]
    assert "engine_generated_tokens" in per["exact"] and per["tokens_unread"] == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(base: str, promql: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        data = json.loads(answer.read())
    assert data["status"] == "success", data
    return list(data["data"]["result"])


def test_metrics_for_monitoring_hosts_only_and_a_real_prometheus_counts_every_request(
    ob: ObserveProject, tmp_path: Path
) -> None:
    gw = ob.gateway
    # loopback on the gateway host and this machine (the monitoring host) connect; another fleet host does not
    own = ob.fleet.ssh(gw, f"curl -sf http://127.0.0.1:{METRICS_PORT}/metrics/engine-ctl").stdout
    assert 'engine_ctl_requests_total{key="obs-all",deployment="gw-b"}' in own
    outsider = ob.fleet.ssh(ob.outsider, f"curl -s -m 5 http://{gw.address}:{METRICS_PORT}/metrics", check=False)
    assert outsider.returncode != 0 and "haproxy_" not in outsider.stdout
    replica = ob.replicas("gw-a")[0]  # nor straight to an engine: they answer the gateways only
    direct = ob.fleet.ssh(ob.outsider, f"curl -s -m 5 http://{ob.host(replica['host']).address}:{replica['port']}"
                          "/metrics", check=False)  # fmt: skip
    assert "llamacpp:" not in direct.stdout, direct.stdout
    with urllib.request.urlopen(f"http://{gw.address}:{METRICS_PORT}/metrics", timeout=10) as answer:
        assert b'haproxy_backend_http_requests_total{proxy="d_gw-a"}' in answer.read()

    scrape = ob.cli("monitoring", "scrape-config", "--interval", "1", "--inventory", str(ob.inventory))
    assert scrape.returncode == 0, scrape.stderr
    assert f'"{gw.address}:{METRICS_PORT}"' in scrape.stdout
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n" + scrape.stdout)
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        up: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                up = _query(base, "up == 1")
                if {r["metric"]["job"] for r in up} == JOBS and len(up) == 4:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        assert {r["metric"]["job"] for r in up} == JOBS and len(up) == 4, up
        assert {r["metric"].get("gateway") for r in up if r["metric"]["job"] != "engine-ctl-engines"} == {gw.name}
        # each engine's own metrics, through the gateway (the engines answer only the gateways)
        engines = {r["metric"]["deployment"]: r["metric"]["host"] for r in up
                   if r["metric"]["job"] == "engine-ctl-engines"}  # fmt: skip
        assert engines == {"gw-a": ob.fleet.hosts[1].name, "gw-b": ob.pinned.name}, up
        for _ in range(3):
            assert ob.chat("gw-a", KEY_A)[0] == 200
        assert ob.chat("gw-b", KEY_ALL)[0] == 200
        wanted = {name: float(n) for name, n in ob.sent.items()}
        per_key = "sum by (deployment) (engine_ctl_requests_total)"
        haproxy = 'sum by (proxy) (haproxy_backend_http_requests_total{proxy=~"d_.*"})'
        got: dict[str, float] = {}
        own_count: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = {r["metric"]["deployment"]: float(r["value"][1]) for r in _query(base, per_key)}
            own_count = {r["metric"]["proxy"][2:]: float(r["value"][1]) for r in _query(base, haproxy)}
            if got == wanted and own_count == wanted:
                break
            time.sleep(0.5)
        assert got == wanted, (got, wanted)  # exactly the requests sent, per deployment
        assert own_count == wanted, (own_count, wanted)  # HAProxy's own count agrees
        keys = _query(base, "sum by (key) (engine_ctl_requests_total)")
        by_key = {r["metric"]["key"]: float(r["value"][1]) for r in keys}
        assert by_key == {"obs-a": wanted["gw-a"], "obs-all": wanted["gw-b"]}
        held = _query(base, "engine_ctl_held_requests")
        assert {r["metric"]["deployment"] for r in held} == {"gw-a", "gw-b"}
        # gw-b's first request was held and woke it: a hold, a wake, and the scaler's decision to start a replica
        for series in ("engine_ctl_holds_total", "engine_ctl_wakes_total"):
            woke = {r["metric"]["deployment"]: float(r["value"][1]) for r in _query(base, series)}
            assert woke["gw-b"] >= 1 and woke["gw-a"] == 0, (series, woke)
        predicted = _query(base, "sum by (deployment) (llamacpp:tokens_predicted_total)")
        assert {r["metric"]["deployment"] for r in predicted if float(r["value"][1]) >= 1} == {"gw-a", "gw-b"}
        decided = _query(base, 'engine_ctl_scaler_decisions_total{deployment="gw-b"}')
        assert {r["metric"]["action"]: r["value"][1] for r in decided} == {"up": "1"}, decided
        # every query of the Grafana dashboard runs, and each names series that exist (an answer per deployment or
        # key; over 24 h or a minute of samples, the rate of a series scraped for a few seconds has one too)
        dashboard = json.loads((ROOT / "examples/monitoring/grafana-dashboard.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                # rate() needs two samples of a series: one that appeared a scrape ago answers at the next scrape
                deadline = time.monotonic() + 30
                while not (answer := _query(base, target["expr"].replace("$__rate_interval", "1m"))):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(1)
                assert answer, f"{panel['title']}: {target['expr']} answers nothing"
    finally:
        os.killpg(prom.pid, signal.SIGTERM)
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(prom.pid, signal.SIGKILL)
            prom.wait()
        log.close()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)


def _tmux(socket_name: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["tmux", "-L", socket_name, *args], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _board_requests(screen: str, deployment: str) -> int | None:
    """The REQUESTS column of a deployment's line on the board (DEPLOYMENT STATE READY IN FLIGHT QUEUE REQUESTS)."""
    for line in screen.splitlines():
        words = line.split()
        if words and words[0] == deployment and len(words) >= 6 and words[5].isdigit():
            return int(words[5])
    return None


@pytest.mark.parametrize("no_color", [False, True])
def test_status_watch_redraws_under_tmux_and_ctrl_c_ends_it(ob: ObserveProject, no_color: bool) -> None:
    assert ob.chat("gw-b")[0] == 200  # woken (when this test runs alone): the scaler has decided for it
    socket_name = f"ectl-obs-{os.getpid()}-{int(no_color)}"  # a tmux server of its own, with this environment
    # the board's size is the pane's: COLUMNS and LINES (pytest-xdist's workers have them) would override it
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    if no_color:
        env["NO_COLOR"] = "1"
    command = (f"cd {ob.path} && {sys.executable} -m engine_ctl status --watch {ob.docs} --inventory {ob.inventory}; "
               "echo EXIT=$?; sleep 60")  # fmt: skip
    _tmux(socket_name, "new-session", "-d", "-s", "board", "-x", "150", "-y", "30", command, env=env)
    try:
        screen, before = "", None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and before is None:
            time.sleep(0.5)
            screen = _tmux(socket_name, "capture-pane", "-p", "-t", "board")
            before = _board_requests(screen, "gw-a")
        assert before is not None, screen
        assert "DEPLOYMENT" in screen and "IN FLIGHT" in screen and "SCALER'S LAST DECISION" in screen
        assert _board_requests(screen, "gw-b") is not None
        line_b = next(x for x in screen.splitlines() if x.split()[:1] == ["gw-b"])
        assert " up 20" in line_b, line_b  # the scaler's last decision for it: up, at its time
        for _ in range(2):
            assert ob.chat("gw-a", KEY_A)[0] == 200
        after = before
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and after < before + 2:
            time.sleep(0.5)
            after = _board_requests(_tmux(socket_name, "capture-pane", "-p", "-t", "board"), "gw-a") or after
        assert after >= before + 2, (before, after)  # the board moved with the requests, redrawn in place
        screen = _tmux(socket_name, "capture-pane", "-p", "-t", "board")
        words = next(x for x in screen.splitlines() if x.split()[:1] == ["gw-a"]).split()
        assert words[6].isdigit() and words[7] == "ms", words  # the median TTFB of the requests the gateway logged
        assert "the median time to the first byte" in screen
        escaped = _tmux(socket_name, "capture-pane", "-p", "-e", "-t", "board")
        coloured = any(f"\x1b[{c}m" in escaped or f";{c}m" in escaped for c in ("31", "32", "33"))
        assert coloured != no_color, escaped[-600:]
        _tmux(socket_name, "send-keys", "-t", "board", "C-c")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "EXIT=" not in screen:
            time.sleep(0.5)
            screen = _tmux(socket_name, "capture-pane", "-p", "-S", "-200", "-t", "board")
        assert "EXIT=130" in screen and "Traceback" not in screen, screen
    finally:
        subprocess.run(["tmux", "-L", socket_name, "kill-server"], capture_output=True, timeout=30)


def _journal_lines(ob: ObserveProject, unit: str, pattern: str) -> int:
    """How many of `unit`'s lines in the gateway host's journal contain `pattern`."""
    got = ob.fleet.ssh(ob.gateway, f"journalctl --no-pager -q -o cat -u {unit} | grep -c -F -- '{pattern}' || true")
    return int(got.stdout.strip() or 0)


def _requests_the_gateway_answers(ob: ObserveProject, ids: str, n: int) -> None:
    """n requests on one keep-alive connection, with IDs ids-0 to ids-(n-1), that HAProxy answers itself (404: a
    path outside /v1, with a valid key): as fast as a client sends them, each a line of the request log."""
    host, port = ob.base.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {KEY_ALL}"}
    for i in range(n):
        connection.request("GET", "/not-v1", headers={**headers, "X-Request-Id": f"{ids}-{i}"})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 404, answer.status
    connection.close()


def test_a_burst_past_journalds_default_rate_limit_keeps_every_request_line(ob: ObserveProject) -> None:
    """journald keeps a service's lines up to a burst in 30 s (RateLimitBurst=, 10000 by default, times a factor of
    the free disk space) and drops the rest. Here the gateway host's journald is given a burst of 1000 (as an
    operator may), so that a burst past it is quick to send. First the limit is found on the host itself: a unit
    with no rate-limit setting of its own writes far more lines than it, and the journal keeps the burst only. Then
    more requests than that go through the gateway within one interval (answered by HAProxy itself: a path outside
    /v1, with a valid key; last in the module, since they are all in the logs the other tests read), and the
    journal has a line for every one. A gateway unit with `LogRateLimitIntervalSec=0` (which systemd does not pass
    on to journald) kept the burst only."""
    token = f"{os.getpid()}-{int(time.time())}"
    dropin = "/etc/systemd/journald.conf.d/engine-ctl-test-ratelimit.conf"
    ob.fleet.ssh(ob.gateway, f"mkdir -p {os.path.dirname(dropin)} && printf '[Journal]\\nRateLimitBurst=1000\\n' "
                             f"> {dropin} && systemctl restart systemd-journald")  # fmt: skip
    try:
        calibration, written = f"ectl-ratelimit-{token}.service", 30_000
        ob.fleet.ssh(ob.gateway, f"systemd-run --unit={calibration} --wait -q -p StandardOutput=journal "
                                 f"sh -c 'seq -f ratelimit-{token}-%.0f 1 {written}; sleep 2'")  # fmt: skip
        time.sleep(2)
        burst = _journal_lines(ob, calibration, f"ratelimit-{token}-")
        assert 1000 <= burst < written, burst  # the limit is in force on this host: journald dropped lines

        sent = burst + 3000
        began = time.monotonic()
        _requests_the_gateway_answers(ob, f"burst-{token}", sent)
        took = time.monotonic() - began
        assert took < 25, f"{sent} requests took {took:.0f} s: not one burst within journald's 30 s interval"
        time.sleep(3)
        kept = _journal_lines(ob, "engine-ctl-gateway.service", f'"id":"burst-{token}-')
        assert kept == sent, f"the journal kept {kept} of {sent} request lines (the host's burst: {burst})"
    finally:
        ob.fleet.ssh(ob.gateway, f"rm -f {dropin} && systemctl restart systemd-journald", check=False)


@contextlib.contextmanager
def _journald_stopped(ob: ObserveProject) -> Iterator[None]:
    """The gateway host's journald stopped (SIGSTOP) for the block, by one SSH session opened before and kept: while
    journald is stopped a new login to the host hangs (sshd, PAM and logind write to the journal), so the SIGCONT is
    sent by the same session, when the block ends, its connection drops, or after 5 minutes at most."""
    script = ("pid=$(pidof systemd-journald); trap 'kill -CONT $pid' EXIT HUP TERM INT; kill -STOP $pid; "
              "echo stopped; read -t 300 line; kill -CONT $pid; echo continued")  # fmt: skip
    session = subprocess.Popen([*ob.fleet.ssh_argv(ob.gateway), f"bash -c {shlex.quote(script)}"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert session.stdout is not None and session.stdin is not None
    try:
        assert session.stdout.readline().strip() == "stopped"
        yield
    finally:
        said, _ = session.communicate("go\n", timeout=60)
    assert "continued" in said, said


def _dropped(ob: ObserveProject) -> int:
    got = ob.cli("usage", "--since", ob.since, "--json", "--inventory", str(ob.inventory))
    assert got.returncode == 0, got.stdout + got.stderr
    value = json.loads(got.stdout)["dropped_lines"][ob.gateway.name]
    assert isinstance(value, int), value
    return value


def test_lines_the_gateway_could_not_write_are_counted_by_usage(ob: ObserveProject) -> None:
    """HAProxy's stdout does not block: a request line that journald has not read in time, once the pipe is full, is
    dropped and counted (DroppedLogs). With journald stopped (SIGSTOP) during a burst of requests, the journal keeps
    some of their lines and `engine-ctl usage` reports the others as lines not logged: together, every request."""
    before = _dropped(ob)
    token = f"{os.getpid()}-{int(time.time())}"
    sent = 60_000
    with _journald_stopped(ob):
        _requests_the_gateway_answers(ob, f"dropped-{token}", sent)
    time.sleep(3)
    kept = _journal_lines(ob, "engine-ctl-gateway.service", f'"id":"dropped-{token}-')
    dropped = _dropped(ob) - before
    assert dropped > 0 and kept + dropped == sent, (kept, dropped, sent)
    table = ob.cli("usage", "--since", ob.since, "--inventory", str(ob.inventory))
    assert f"Lines not logged ({ob.gateway.name} {before + dropped})" in table.stdout, table.stdout
