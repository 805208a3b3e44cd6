"""The rendered gateway on the real HAProxy 2.6 of this machine, on loopback: keys, routing on the body's model,
the body limit, /v1/models per key scope, held requests and run-time map changes over the stats socket.

The replicas here are small HTTP servers on loopback (socketserver) that answer /health and say which replica
they are; the fleet tests (test_fleet_gateway.py) do the same against the real llama-server."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import socketserver
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import BODY_LIMIT, GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import server_states, set_maps, set_state
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
KEY_ALL, KEY_CHAT, KEY_OLD = "ak-all-" + "1" * 40, "ak-chat-" + "2" * 40, "ak-old-" + "3" * 40
CREATED = {"chat": 1764806400, "embed": 1764810000}
"""Each deployment's creation time (what its ID records): `created` in /v1/models."""


class Replica(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A stand-in replica: GET /health answers 200; any POST answers which replica it is and the Authorization
    header it was given (to see the gateway's internal key, never the client's)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        super().__init__(("127.0.0.1", port), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def read_request(sock: socket.socket) -> tuple[str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request off `sock`: its request line, its header fields (names in lower case) and its body
    (Content-Length bytes); None if the client closed first."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        head += chunk
    header, _, rest = head.partition(b"\r\n\r\n")
    lines = header.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    while len(rest) < int(fields.get("content-length", "0")):
        rest += sock.recv(65536)
    return lines[0], fields, rest


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        got = read_request(self.request)
        if got is None:
            return
        _, fields, _ = got
        body = json.dumps({"replica": self.server.name, "authorization": fields.get("authorization")}).encode()  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
        self.wfile.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[dict[str, object]]:
    ports = {"chat": free_port(), "embed": free_port()}
    replicas = {"chat": Replica("chat-0", ports["chat"])}  # embed has no replica running yet
    keys = [
        ApiKey(name="all", sha256=key_sha256(KEY_ALL)),
        ApiKey(name="chatonly", sha256=key_sha256(KEY_CHAT), deployments=("chat",)),
        ApiKey(name="old", sha256=key_sha256(KEY_OLD), expires=int(time.time()) - 60),
    ]
    # embed's replica is one an apply is about to start: its server starts in maintenance (`disabled`), as apply
    # renders it, and enters only when apply lets it in (set_state ready, once it is healthy)
    backends = [
        GatewayBackend(
            deployment=d,
            servers=(GatewayServer(name="r0a", address="127.0.0.1", port=p, maxconn=2, disabled=d not in replicas),),
            created=CREATED[d],
        )
        for d, p in ports.items()
    ]
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    rendered = render_gateway(host, backends, keys, internal_key=False, hold_s=3, hold_cap=2, run_dir=str(tmp_path))
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{host.gateway_port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    t = LocalTransport(host)
    # the first health check (inter 5 s, rise 1) marks the running replica up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server_states(t, str(tmp_path / "admin.sock")).get(("d_chat", "r0a"), None) is not None and (
            server_states(t, str(tmp_path / "admin.sock"))[("d_chat", "r0a")].status == "UP"
        ):
            break
        time.sleep(0.2)
    yield {"base": base, "dir": tmp_path, "ports": ports, "replicas": replicas, "transport": t, "rendered": rendered}
    proc.terminate()
    proc.wait(timeout=10)
    for r in replicas.values():
        r.shutdown()
        r.server_close()


def call(
    base: str, path: str, key: str | None, body: dict[str, object] | bytes | None = None
) -> tuple[int, dict, dict]:  # type: ignore[type-arg]
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read() or b"{}")


def chat(model: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}], "model": model}


def test_keys_are_checked_as_hashes(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    status, _, body = call(base, "/v1/chat/completions", None, chat("chat"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert call(base, "/v1/chat/completions", "ak-wrong", chat("chat"))[0] == 401
    status, _, body = call(base, "/v1/chat/completions", KEY_OLD, chat("chat"))
    assert status == 401 and "expired" in body["error"]["message"]
    status, _, body = call(base, "/v1/chat/completions", KEY_ALL, chat("chat"))
    assert status == 200 and body["replica"] == "chat-0"
    assert body["authorization"] is None, "the client's key never reaches a replica"
    for name in ("haproxy.cfg", "keys.map"):
        assert KEY_ALL not in (gateway["dir"] / name).read_text()  # type: ignore[operator]


def test_unknown_and_out_of_scope_models_are_404(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    unknown = call(base, "/v1/chat/completions", KEY_ALL, chat("nope"))
    scoped = call(base, "/v1/chat/completions", KEY_CHAT, chat("embed"))
    for status, _, body in (unknown, scoped):
        assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "`nope`" in unknown[2]["error"]["message"]
    quoted = call(base, "/v1/chat/completions", KEY_ALL, chat('a"b'))
    assert quoted[0] == 404 and quoted[2]["error"]["message"].startswith('The model `a"b`')


def test_models_lists_what_the_key_may_use(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    assert [m["id"] for m in call(base, "/v1/models", KEY_ALL)[2]["data"]] == ["chat", "embed"]
    assert [m["id"] for m in call(base, "/v1/models", KEY_CHAT)[2]["data"]] == ["chat"]
    assert call(base, "/v1/models", None)[0] == 401


def test_large_messages_first_bodies_route_and_larger_ones_are_413(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    big = {"messages": [{"role": "user", "content": "x" * 200_000}], "model": "chat"}
    status, _, body = call(base, "/v1/chat/completions", KEY_ALL, big)
    assert status == 200 and body["replica"] == "chat-0"
    over = {"messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}], "model": "chat"}
    status, _, body = call(base, "/v1/chat/completions", KEY_ALL, over)
    assert status == 413 and str(BODY_LIMIT) in body["error"]["message"]


def test_requests_are_held_until_a_replica_serves(gateway: dict) -> None:  # type: ignore[type-arg]
    base, ports = str(gateway["base"]), gateway["ports"]
    began = time.monotonic()
    status, headers, body = call(base, "/v1/chat/completions", KEY_ALL, chat("embed"))
    assert status == 503 and headers.get("retry-after") == "5" and body["error"]["code"] == "unavailable"
    assert time.monotonic() - began >= 2.5, "held for the hold time (3 s here) before 503"
    results: list[tuple[int, dict, dict]] = []  # type: ignore[type-arg]
    waiter = threading.Thread(target=lambda: results.append(call(base, "/v1/chat/completions", KEY_ALL, chat("embed"))))
    waiter.start()
    time.sleep(0.5)
    gateway["replicas"]["embed"] = Replica("embed-0", ports["embed"])  # type: ignore[index]
    socket_path = str(gateway["dir"] / "admin.sock")  # type: ignore[operator]
    set_state(gateway["transport"], "d_embed", "r0a", "ready", socket_path)  # type: ignore[arg-type]  # apply's enter
    waiter.join(timeout=15)
    assert results and results[0][0] == 200 and results[0][2]["replica"] == "embed-0"


def test_held_requests_are_capped(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    out: list[tuple[float, int]] = []

    def one() -> None:
        began = time.monotonic()
        status = call(base, "/v1/chat/completions", KEY_ALL, chat("embed"))[0]
        out.append((time.monotonic() - began, status))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for th in threads:
        th.start()
        time.sleep(0.1)
    for th in threads:
        th.join(timeout=20)
    assert [s for _, s in out] == [503] * 4
    quick = [t for t, _ in out if t < 1.5]
    assert len(quick) == 2, f"2 held (the cap), 2 answered at once: {out}"


def test_keys_change_at_run_time_without_a_reload(gateway: dict) -> None:  # type: ignore[type-arg]
    base, t = str(gateway["base"]), gateway["transport"]
    socket_path = str(gateway["dir"] / "admin.sock")  # type: ignore[operator]
    new_key = "ak-new-" + "4" * 40
    assert call(base, "/v1/chat/completions", new_key, chat("chat"))[0] == 401
    rendered = gateway["rendered"]
    maps = {name: dict(entries) for name, entries in rendered.maps.items()}  # type: ignore[attr-defined]
    maps["keys.map"] = {key_sha256(new_key): "new"}  # rotate: the new key in, every old one out
    maps["scopes.map"] = {"new/chat": "1", "new/embed": "1"}
    set_maps(t, maps, socket_path)  # type: ignore[arg-type]
    assert call(base, "/v1/chat/completions", new_key, chat("chat"))[0] == 200
    assert call(base, "/v1/chat/completions", KEY_ALL, chat("chat"))[0] == 401
    assert [m["id"] for m in call(base, "/v1/models", new_key)[2]["data"]] == ["chat", "embed"]


class KeptConnection:
    """One keep-alive connection to the gateway, every request on it with exactly the Authorization headers given
    (the gateway checks a key once a connection while its header stays the same: these show it never serves a
    request under a key other than its own)."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.sock: object = None

    def get(self, path: str, *auth: str) -> tuple[int, dict]:  # type: ignore[type-arg]
        self.conn.putrequest("GET", path, skip_accept_encoding=True)
        for value in auth:
            self.conn.putheader("Authorization", value)
        self.conn.endheaders()
        answer = self.conn.getresponse()
        body = json.loads(answer.read() or b"{}")
        assert answer.getheader("connection") != "close"
        assert self.sock is None or self.conn.sock is self.sock, "the request went on a new connection"
        self.sock = self.conn.sock
        return answer.status, body

    def models(self, *auth: str) -> list[str] | int:
        status, body = self.get("/v1/models", *auth)
        return [m["id"] for m in body["data"]] if status == 200 else status


def test_a_connection_is_served_under_each_requests_own_key(gateway: dict) -> None:  # type: ignore[type-arg]
    kept = KeptConnection(str(gateway["base"]))
    assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]
    assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]  # the same header: the hash taken before
    assert kept.models(f"Bearer {KEY_CHAT}") == ["chat"]  # another key on the same connection: its own scope
    assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]
    status, body = kept.get("/v1/models", f"Bearer {KEY_OLD}")  # expired, after a valid key
    assert status == 401 and "expired" in body["error"]["message"]
    for refused in ([f"Bearer {KEY_ALL}", f"Bearer {KEY_ALL}"], [f"Bearer {KEY_ALL} junk"], ["Bearer ak-wrong"], []):
        assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]  # the last header that passed is this one
        assert kept.models(*refused) == 401, refused
    assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]


def test_a_key_taken_out_at_run_time_is_refused_on_a_connection_already_open(gateway: dict) -> None:  # type: ignore[type-arg]
    kept = KeptConnection(str(gateway["base"]))
    assert kept.models(f"Bearer {KEY_ALL}") == ["chat", "embed"]
    maps = {name: dict(entries) for name, entries in gateway["rendered"].maps.items()}  # type: ignore[attr-defined]
    maps["keys.map"] = {h: n for h, n in maps["keys.map"].items() if n != "all"}
    set_maps(gateway["transport"], maps, str(gateway["dir"] / "admin.sock"))  # type: ignore[arg-type,operator]
    assert kept.models(f"Bearer {KEY_ALL}") == 401
    assert kept.models(f"Bearer {KEY_CHAT}") == ["chat"]


def test_the_internal_endpoint_answers_the_inventorys_hosts_without_a_key_and_refuses_others(tmp_path: Path) -> None:
    """Seed 000/001: deploy-<name>…:8000/v1 serves runs inside the cluster without a key. Here: the gateway's
    internal listener, which only the inventory's hosts (127.0.0.3 here) and loopback reach; 127.0.0.2 is not one."""
    import http.client

    from engine_ctl.core.render.gateway import INTERNAL_CALLER

    replica = Replica("chat-0", free_port())
    server = GatewayServer(name="r0a", address="127.0.0.1", port=replica.server_address[1], maxconn=2)
    backends = [GatewayBackend(deployment="chat", servers=(server,))]
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    internal = free_port()
    keys = [ApiKey(name="all", sha256=key_sha256(KEY_ALL))]
    rendered = render_gateway(host, backends, keys, internal_key=False, run_dir=str(tmp_path),
                              internal_allow=["127.0.0.3"], internal_port=internal)  # fmt: skip
    assert rendered.maps["scopes.map"] == {"all/chat": "1", f"{INTERNAL_CALLER}/chat": "1"}
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    (tmp_path / "start.state").write_text("")
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.PIPE, text=True)

    def post(source: str, port: int, key: str | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        conn.request("POST", "/v1/chat/completions", json.dumps(chat("chat")), headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")

    try:
        deadline = time.monotonic() + 15  # up at its first check
        while True:
            try:
                status, body = post("127.0.0.3", internal)
            except OSError:
                status, body = 0, {}
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 200 and body["replica"] == "chat-0", body  # an inventory host, no key
        assert post("127.0.0.1", internal)[0] == 200  # the gateway host itself
        with pytest.raises(OSError) as refused:  # any other source: the connection is closed, nothing answered
            post("127.0.0.2", internal)
        assert not isinstance(refused.value, urllib.error.HTTPError)
        # the endpoint itself still asks every caller for a key, the inventory's hosts included
        assert post("127.0.0.3", host.gateway_port)[0] == 401
        assert post("127.0.0.2", host.gateway_port, KEY_ALL)[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        replica.shutdown()
        replica.server_close()
