"""A stream's replica connection is never pooled, and no body llama-server reads as a stream slips past that rule.

The gateway does not send a request a second time (no L7 retry), so a request must never go out on a connection
the replica is about to close. llama-server closes a connection as soon as a stream on it ends, unannounced: the
rendered configuration sends every stream to its replica with `Connection: close`. Which requests are streams is
decided on the body's bytes, not parsed (STREAM_SET: a "stream" key not false, nested ones included), and a body
with a key written with a \\u escape, which an engine decodes, counts as a stream too (STREAM_AMBIGUOUS). Checked
here against the real HAProxy with the rendered rule, and against the real llama-server for the premises (what it
reads as a stream, and that it closes the connection after one).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from tests.llama import llama_server_dir, tiny_model
from tests.ports import free_port
from tests.test_gateway_loopback import HAPROXY


def rendered_stream_rules() -> list[str]:
    """The `ectl_stream` ACL lines of the endpoint's frontend, as engine-ctl renders them."""
    host = Host(name="edge", address="127.0.0.1", gateway_port=8800)
    server = GatewayServer(name="r0a", address="127.0.0.1", port=8000, maxconn=4)
    cfg = render_gateway(host, [GatewayBackend(deployment="chat", servers=(server,))], [], internal_key=False,
                         run_dir="/tmp/unused").files["haproxy.cfg"]  # fmt: skip
    api = cfg.split("frontend api", 1)[1].split("\nfrontend ", 1)[0].split("\nbackend ", 1)[0]
    rules = [ln.strip() for ln in api.splitlines() if ln.strip().startswith("acl ectl_stream ")]
    assert len(rules) == 2 and "http-request set-header Connection close if ectl_stream" in api, rules
    held = cfg.split("frontend h_chat", 1)[1]
    assert [ln.strip() for ln in held.splitlines() if ln.strip().startswith("acl ectl_stream ")] == rules
    return rules


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[http.client.HTTPConnection]:
    """The real HAProxy with the rendered rule, answering "close" for a body it would send with Connection: close
    and "pool" for one whose connection it would pool."""
    folder: Path = tmp_path_factory.mktemp("judge")
    port = free_port()
    rules = "\n".join(f"    {r}" for r in rendered_stream_rules())
    (folder / "haproxy.cfg").write_text(
        "global\n    tune.bufsize 262144\n"
        "defaults\n    mode http\n    timeout connect 3s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    http-request wait-for-body time 5s\n{rules}\n"
        '    http-request return status 200 content-type text/plain string "close" if ectl_stream\n'
        '    http-request return status 200 content-type text/plain string "pool"\n'
    )
    proc = subprocess.Popen([HAPROXY, "-f", str(folder / "haproxy.cfg")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    yield conn
    conn.close()
    proc.terminate()
    proc.wait(10)


def verdict(conn: http.client.HTTPConnection, body: bytes) -> str:
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.read().decode()


def llama_streams(body: bytes) -> bool:
    """Whether llama-server answers the body with a stream: its parser keeps a key's last value, decodes escapes
    in keys, and streams only for a JSON `true` (checked against the real one below)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def escaped(key: str, which: list[bool]) -> str:
    """The key as JSON, with the letters `which` marks written as \\u escapes."""
    return '"' + "".join(f"\\u{ord(c):04x}" if w else c for c, w in zip(key, which, strict=False)) + '"'


VALUES = st.sampled_from([True, False, 1, 0, "true", None, {"stream": True}, [True], "stream"])
KEYS = st.sampled_from(["stream", "model", "messages", "Stream", "streams", "x"])


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=5))
    parts = []
    for key, value in pairs:
        marks = draw(st.lists(st.booleans(), min_size=len(key), max_size=len(key)))
        space = draw(st.sampled_from(["", " ", "\n  "]))
        parts.append(f"{escaped(key, marks)}{space}:{space}{json.dumps(value)}")
    return ("{" + ",".join(parts) + "}").encode()


@settings(max_examples=400, deadline=None)
@given(body=bodies())
def test_no_body_llama_server_streams_has_its_connection_pooled(judge: http.client.HTTPConnection, body: bytes) -> None:
    if llama_streams(body):
        assert verdict(judge, body) == "close", body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"stream":true}', "close"),
        (b'{"model":"chat","stream":false,"stream":true}', "close"),
        (b'{"model":"chat","\\u0073tream":true}', "close"),
        (b'{"model":"chat","str\\u0065am" : true}', "close"),
        (b'{"model":"chat","stream" :\n true}', "close"),
        (b'{"model":"chat","metadata":{"stream":true}}', "close"),  # nested: more than an engine streams, harmless
        # what most requests are: their replica connection is pooled
        (b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}', "pool"),
        (b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"stream":false}', "pool"),
        (b'{"model":"chat","stream":false,"stream" : false}', "pool"),
        (b'{"model":"chat","messages":[{"role":"user","content":"\\"stream\\": true"}]}', "pool"),
        (b'{"model":"chat","messages":[{"role":"user","content":"caf\\u00e9 \\"x\\": stream"}]}', "pool"),
        (b'{"model":"chat","messages":[{"role":"user","content":"\\\\u0073tream"}],"stream":false}', "pool"),
    ],
)
def test_streams_close_and_plain_requests_pool(judge: http.client.HTTPConnection, body: bytes, expected: str) -> None:
    assert verdict(judge, body) == expected, body


def test_the_rule_reads_a_body_once_whatever_it_holds(judge: http.client.HTTPConnection) -> None:
    """Escaped quotes, escapes and colons in a long string (what a scan from every quote would take quadratic time
    on, as a first draft of the rule did: HAProxy hung up): four times the body costs about four times as much."""

    def ten(n: int) -> float:
        text = '\\"\\u00e9\\"x\\": stream' * n
        body = ('{"model":"chat","messages":[{"role":"user","content":"' + text + '"}]}').encode()
        started = time.monotonic()
        for _ in range(10):
            assert verdict(judge, body) == "pool"
        return time.monotonic() - started

    quarter, whole = ten(2_000), ten(8_000)
    assert whole < 8 * quarter + 0.5, (whole, quarter)


@pytest.fixture(scope="module")
def llama() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(llama_server_dir() / "bin" / "llama-server"), "--model", str(tiny_model()), "--port", str(port),
         "--host", "127.0.0.1", "--threads", "1", "--parallel", "2", "--ctx-size", "512", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "llama-server did not answer /health"
        time.sleep(0.2)
    yield port
    proc.terminate()
    proc.wait(10)


ASK = '"messages":[{"role":"user","content":"hi"}],"max_tokens":2'


@pytest.mark.parametrize(
    "body",
    [
        '{%s,"stream":false,"stream":true}' % ASK,
        '{%s,"stream":true,"stream":false}' % ASK,
        '{%s,"\\u0073tream":true}' % ASK,
        '{%s,"stream":1}' % ASK,
        '{%s,"stream":"true"}' % ASK,
        '{%s,"stream":true}' % ASK,
        "{%s}" % ASK,
    ],
)
def test_llama_server_streams_exactly_where_the_oracle_says(llama: int, body: str) -> None:
    """The premise of llama_streams, on the real llama-server: the last of two keys wins, escaped keys are
    decoded, and only a JSON true streams (1 and "true" are refused 400)."""
    conn = http.client.HTTPConnection("127.0.0.1", llama, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    streamed = (answer.getheader("content-type") or "").startswith("text/event-stream")
    assert streamed == llama_streams(body.encode()), (body, answer.status, answer.getheader("content-type"))


def test_llama_server_closes_a_connection_as_soon_as_a_stream_on_it_ends(llama: int) -> None:
    """The premise of the rule: after a stream llama-server closes the connection although its answer said
    Keep-Alive; after a plain answer it keeps it open."""
    for stream, closed in ((False, False), (True, True)):
        conn = http.client.HTTPConnection("127.0.0.1", llama, timeout=60)
        conn.request("POST", "/v1/chat/completions", body="{%s,\"stream\":%s}" % (ASK, json.dumps(stream)),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        answer = conn.getresponse()
        answer.read()
        assert answer.getheader("connection") is None and "timeout=" in (answer.getheader("keep-alive") or "")
        assert conn.sock is not None
        conn.sock.settimeout(2)
        try:
            got_eof = conn.sock.recv(1) == b""  # b"": the replica closed it
        except TimeoutError:
            got_eof = False
        assert got_eof == closed, (stream, got_eof)
        conn.close()
