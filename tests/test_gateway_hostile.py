"""What the gateway refuses before a request reaches an engine (issue 31), on the real HAProxy 2.6 of this machine
with the rendered configuration and Lua: deeply nested JSON, every Authorization header but exactly one
`Bearer <key>`, paths not in normal form, a `model` that is not exactly a deployment's name; and HAProxy's own
errors in the OpenAI error shape. The fleet tests (test_fleet_hostile.py) show the same against the real
llama-server, which the deep JSON crashes."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.test_gateway_loopback import KEY_ALL, chat, gateway  # noqa: F401 (the fixture)

Gateway = dict  # type: ignore[type-arg]


def raw(base: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> tuple[int, dict]:  # type: ignore[type-arg]
    """One request with exactly these headers (repeated ones kept), over a fresh connection."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest(method, path, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    answer = conn.getresponse()
    text = answer.read()
    conn.close()
    return answer.status, json.loads(text) if text.startswith(b"{") else {"raw": text.decode(errors="replace")}


def post(base: str, body: bytes, auth: list[str] | None = None, path: str = "/v1/chat/completions") -> tuple[int, dict]:  # type: ignore[type-arg]
    auth = [f"Bearer {KEY_ALL}"] if auth is None else auth
    headers = [("Content-Type", "application/json"), *(("Authorization", a) for a in auth)]
    return raw(base, "POST", path, headers, body)


def nested(depth: int) -> bytes:
    """A chat request whose `stop` is `depth` arrays deep (the whole body is depth + 1 deep)."""
    return b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"stop":' + b"[" * depth + b"]" * depth + b"}"


def test_json_nested_deeper_than_64_levels_is_refused_in_the_openai_shape(gateway: Gateway) -> None:  # noqa: F811
    base = str(gateway["base"])
    status, body = post(base, nested(120_000))
    assert status == 400, body
    assert body["error"]["code"] == "json_too_deep" and "64" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert post(base, nested(64))[0] == 400, "65 levels in all: one too many"
    assert post(base, nested(63))[0] == 200, "64 levels in all are served"
    # more opening brackets than the limit, none deep: the regex lets the Lua scan it, and it is served
    shallow = b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"logit_bias":{},"stop":[' + b",".join(
        [b"[]"] * 200) + b"]}"  # fmt: skip
    status, body = post(base, shallow)
    assert status != 400 or body["error"]["code"] != "json_too_deep", body
    # brackets inside strings are text, not nesting (and an escaped quote does not end the string)
    text = json.dumps({"model": "chat", "messages": [{"role": "user", "content": '\\"' + "[{" * 5000}]})
    assert post(base, text.encode())[0] == 200


def test_the_depth_check_is_cheap(gateway: Gateway) -> None:  # noqa: F811
    """A 200 KB body of ordinary text costs the Lua one find() (no bracket in it), and a body full of brackets
    in strings one pass (linear, never quadratic): both cost about what the same requests with no depth check to
    speak of cost, measured in the same run (a tiny body's round trips: the machine's load weighs on both)."""
    base = str(gateway["base"])

    def twenty(content: str) -> float:
        body = json.dumps({"messages": [{"role": "user", "content": content}], "model": "chat"}).encode()
        started = time.monotonic()
        for _ in range(20):
            assert post(base, body)[0] == 200
        return time.monotonic() - started

    floor = min(twenty("hi"), twenty("hi"))
    plain = twenty("hello " * 34_000)  # 200 KB sent and read 20 times, and one find() each
    assert plain < 10 * floor + 2.0, (plain, floor)
    # brackets in strings: one pass, so four times the brackets cost about four times as much (a scan that went
    # back over what it had read would cost sixteen times as much)
    quarter, whole = twenty('"[' * 15_000), twenty('"[' * 60_000)
    assert whole < 8 * quarter + 0.5, (whole, quarter)


@pytest.mark.parametrize(
    "auth",
    [
        [],
        [f"Basic {KEY_ALL}"],
        [f"bearer {KEY_ALL}"],
        [f"Bearer {KEY_ALL} junk"],
        [f"Bearer  {KEY_ALL}"],
        [f"Bearer {KEY_ALL}", f"Bearer {KEY_ALL}"],
        ["Bearer ak-wrong", f"Bearer {KEY_ALL}"],
        [f"Bearer {KEY_ALL}, Bearer {KEY_ALL}"],
    ],
    ids=["none", "basic", "lowercase", "trailing-word", "two-spaces", "twice", "wrong-then-right", "comma"],
)
def test_only_exactly_one_bearer_header_is_a_key(gateway: Gateway, auth: list[str]) -> None:  # noqa: F811
    status, body = post(str(gateway["base"]), json.dumps(chat("chat")).encode(), auth=auth)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", (status, body)


def test_exactly_one_bearer_header_is_served(gateway: Gateway) -> None:  # noqa: F811
    assert post(str(gateway["base"]), json.dumps(chat("chat")).encode())[0] == 200


@pytest.mark.parametrize(
    "path",
    ["/v1/../slots", "/v1/%2e%2e/props", "/v1/%2E%2E/props", "/v1//chat/completions", "/v1/./chat/completions",
     "/v1/chat/completions/..", "/v1/chat%2fcompletions", "/v1/..%5cslots", "/v1/chat/completions/.",
     "/slots", "/v1"],
)  # fmt: skip
def test_paths_not_in_normal_form_never_reach_a_replica(gateway: Gateway, path: str) -> None:  # noqa: F811
    status, body = post(str(gateway["base"]), json.dumps(chat("chat")).encode(), path=path)
    assert status == 404 and body["error"]["code"] == "unknown_url", (path, status, body)


@pytest.mark.parametrize("model", ["chat\u0000x", "chat\u0000", "chat ", " chat", "Chat", "chat\n", "chat/x"])
def test_a_model_that_is_not_exactly_a_deployment_name_is_not_routed(gateway: Gateway, model: str) -> None:  # noqa: F811
    status, body = post(str(gateway["base"]), json.dumps(chat(model)).encode())
    assert status == 404 and body["error"]["code"] == "model_not_found", (repr(model), status, body)


def test_haproxys_own_errors_are_openai_shaped(gateway: Gateway) -> None:  # noqa: F811
    """A replica that closes the connection without an answer: HAProxy's own 502 (after its retries), as JSON.
    (HAProxy 2.6 sends the 400 and 408 of a request it cannot parse from its HTTP/1 layer, which ignores
    errorfile: those stay HAProxy's HTML.)"""
    folder = Path(str(gateway["dir"]))
    cfg = (folder / "haproxy.cfg").read_text()
    for status in (400, 408, 422, 429, 500, 502, 503, 504):
        assert f"errorfile {status} error-{status}.http" in cfg
        head, _, text = (folder / f"error-{status}.http").read_bytes().decode().partition("\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ") and "Content-Type: application/json" in head
        assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}
        assert f"Content-Length: {len(text)}" in head
    gateway["replicas"]["chat"].shutdown()  # type: ignore[index]
    gateway["replicas"]["chat"].server_close()  # type: ignore[index]
    mute = socket.socket()
    mute.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    mute.bind(("127.0.0.1", int(gateway["ports"]["chat"])))  # type: ignore[index]
    mute.listen(50)

    def hang_up() -> None:
        while True:
            try:
                conn, _ = mute.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    status, body = post(str(gateway["base"]), json.dumps(chat("chat")).encode())
    mute.close()
    assert status == 502 and body["error"]["code"] == "bad_gateway", (status, body)


def test_the_configuration_bounds_slow_clients(gateway: Gateway) -> None:  # noqa: F811
    cfg = (Path(str(gateway["dir"])) / "haproxy.cfg").read_text()
    assert "timeout http-request 10s" in cfg and "sc_conn_cur(0) gt 200" in cfg


def test_a_streams_connection_is_never_sent_another_request(gateway: Gateway) -> None:  # noqa: F811
    """The keep-alive race (issue 24 point 12), made certain: a replica that keeps its connections alive, except
    that it closes one as soon as a stream on it ends, unannounced (Keep-Alive in its headers), as llama-server
    does. A request HAProxy sent next on that pooled connection would get no answer, and the gateway sends no
    request a second time (no L7 retry): a stream goes to the replica with `Connection: close`, so its connection
    is never pooled. Streams and plain requests in turn on one client connection are all answered; the client's
    connection stays open throughout, and no request came after a stream on a replica connection."""
    gateway["replicas"]["chat"].shutdown()  # type: ignore[index]
    gateway["replicas"]["chat"].server_close()  # type: ignore[index]
    closer = socket.socket()
    closer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    closer.bind(("127.0.0.1", int(gateway["ports"]["chat"])))  # type: ignore[index]
    closer.listen(50)
    seen: list[list[bool]] = []  # per replica connection: whether each request on it was a stream

    def read_request(conn: socket.socket, pending: bytes) -> tuple[bytes, bytes, bytes]:
        data = pending
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return b"", b"", b""
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            (int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")), 0
        )
        while len(rest) < length:
            rest += conn.recv(65536)
        return head, rest[:length], rest[length:]

    def like_llama_server(conn: socket.socket) -> None:
        requests: list[bool] = []
        seen.append(requests)
        pending = b""
        with conn:
            while True:
                head, body, pending = read_request(conn, pending)
                if not head:
                    return
                if head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\nok")
                    continue
                stream = json.loads(body).get("stream") is True
                requests.append(stream)
                if not stream:
                    answer = b'{"replica":"chat-0"}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5, "
                                 b"max=100\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)  # fmt: skip
                    continue
                event = b'data: {"replica":"chat-0"}\n\ndata: [DONE]\n\n'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nKeep-Alive: timeout=5, "
                             b"max=100\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n" % len(event) + event + b"\r\n0\r\n\r\n")  # fmt: skip
                return  # the stream ended: closed at once

    def serve() -> None:
        while True:
            try:
                conn, _ = closer.accept()
            except OSError:
                return
            threading.Thread(target=like_llama_server, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    host, port = str(gateway["base"]).removeprefix("http://").split(":")
    client = http.client.HTTPConnection(host, int(port), timeout=30)  # one client connection, kept alive
    answers, client_sockets = [], set()
    for i in range(8):
        body = json.dumps({**chat("chat"), "stream": i % 2 == 0}).encode()
        client.request("POST", "/v1/chat/completions", body=body,
                       headers={"Authorization": f"Bearer {KEY_ALL}", "Content-Type": "application/json"})  # fmt: skip
        answer = client.getresponse()
        answers.append((answer.status, answer.read()))
        client_sockets.add(id(client.sock))
    closer.close()
    assert [status for status, _ in answers] == [200] * 8, answers
    assert all(b"chat-0" in body for _, body in answers), answers
    assert len(client_sockets) == 1 and client.sock is not None  # the client's connection was never closed
    assert sum(r.count(True) for r in seen) == 4, seen
    assert all(True not in r[:-1] for r in seen), seen  # no request ever came after a stream on its connection


def test_the_per_address_limit_counts_requests_without_a_key_and_never_a_keyed_caller(gateway: Gateway) -> None:  # noqa: F811
    """More than 2,000 requests in 10 s from one address without a valid key get 429 with Retry-After; a keyed
    caller from the same address (many clients behind one NAT, say) is still served: its key has its own limit."""
    host, port = str(gateway["base"]).removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps(chat("chat")).encode()
    statuses: dict[int, int] = {}
    for _ in range(2_050):
        conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer ak-wrong", "Content-Type":
                     "application/json"})  # fmt: skip
        answer = conn.getresponse()
        answer.read()
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
        if answer.will_close:
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.close()
    assert statuses.get(401, 0) >= 1_900 and statuses.get(429, 0) >= 1, statuses
    status, refused = post(str(gateway["base"]), body, auth=["Bearer ak-wrong"])
    assert status == 429 and refused["error"]["code"] == "rate_limit_exceeded", (status, refused)
    assert post(str(gateway["base"]), body)[0] == 200  # the same address, with a key: served
