#!/usr/bin/python3
"""A test double of vLLM's HTTP server (vLLM needs a GPU, which this machine has not), stdlib only so that it also
runs as a replica unit's engine on a fleet host (`vllm_double.py serve MODEL ... --host H --port P`, vLLM's own
argv). It speaks vLLM's real API as its documentation and server give it:

- docs.vllm.ai, Features > Sleep Mode: launched with `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1, the server
  has `POST /sleep?level=1|2`, `POST /wake_up` (optionally `?tags=weights` / `?tags=kv_cache`, for level 2 with
  `POST /collective_rpc {"method": "reload_weights"}` between them) and `GET /is_sleeping` answering
  `{"is_sleeping": true|false}`;
- vllm/entrypoints/openai/api_server.py: those dev-mode routes, `GET /health` (200 once serving), the Prometheus
  gauge `vllm:num_requests_running{model_name=...}` at GET /metrics (the provider's in-flight metric), and its
  API key (`VLLM_API_KEY`): required as `Authorization: Bearer <key>` on paths under /v1 only.
Every call is logged (`log`; as a unit, on stdout too, so the journal has it)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class VllmDouble:
    """vLLM's sleep-mode endpoints, its health check, its running-requests gauge and a slow chat completion."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, key: str = "", echo: bool = False) -> None:
        self.log: list[tuple[str, object]] = []
        self.running = 0
        self.sleeping = False
        self.lock = threading.Lock()
        self.key, self.echo = key, echo
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def record(self, what: str, detail: object) -> None:
        with self.lock:
            self.log.append((what, detail))
        if self.echo:
            print(json.dumps([what, detail]), flush=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def _answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refused(self, path: str) -> bool:
                """vLLM's AuthenticationMiddleware: only /v1 paths need the key."""
                if not double.key or not path.startswith("/v1"):
                    return False
                if self.headers.get("Authorization") == "Bearer " + double.key:
                    return False
                self._answer(401, {"error": "Unauthorized"})
                return True

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                if self._refused(path):
                    return
                if path == "/health":
                    self._answer(200, "")
                elif path == "/metrics":
                    with double.lock:
                        n = double.running
                    self._answer(200, "# TYPE vllm:num_requests_running gauge\n"
                                      f'vllm:num_requests_running{{model_name="chat"}} {float(n)}\n')  # fmt: skip
                elif path == "/is_sleeping":
                    double.record("is_sleeping", double.sleeping)
                    self._answer(200, {"is_sleeping": double.sleeping})
                else:
                    self._answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                url = urlsplit(self.path)
                if self._refused(url.path):
                    return
                if url.path == "/v1/chat/completions":
                    with double.lock:
                        double.running += 1
                    time.sleep(1.5)
                    with double.lock:
                        double.running -= 1
                    double.record("chat done", double.sleeping)
                    self._answer(200, {"object": "chat.completion", "model": "chat", "choices": []})
                elif url.path == "/sleep":
                    with double.lock:
                        in_flight = double.running
                    double.record("sleep", (url.query, in_flight))
                    double.sleeping = True
                    self._answer(200, "")
                elif url.path == "/wake_up":
                    double.record("wake_up", url.query)
                    if url.query in ("", "tags=kv_cache"):
                        double.sleeping = False
                    self._answer(200, "")
                elif url.path == "/collective_rpc":
                    double.record("collective_rpc", json.loads(body)["method"])
                    self._answer(200, {"results": [None]})
                else:
                    self._answer(404, {"detail": "Not Found"})

        return Handler


def main(argv: list[str]) -> int:
    """As vLLM is launched: `serve MODEL [flags]`; it listens on --host and --port."""
    if not argv or argv[0] != "serve":
        sys.stderr.write("usage: vllm_double.py serve MODEL --host H --port P ...\n")
        return 2
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    double = VllmDouble(host, port, key=os.environ.get("VLLM_API_KEY", ""), echo=True)
    print(f"serving on {host}:{double.port}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
