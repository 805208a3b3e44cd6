"""HAProxy's admin (stats) socket: the one client every engine-ctl program on a host uses (the facts probe, the
scaler, the scaler's forced command, and the gateway's map changes). One command per connection, the answer as
text. Stdlib only and no `from __future__` line: engine_ctl.shell.shipped puts this text in place of the
`import haproxy_ask` line of each script it ships, so the script runs alone on a host."""

import socket


def haproxy_ask(path: str, command: str, timeout: float = 10.0) -> str:
    """Send one command to the admin socket at `path`; its whole answer (OSError when it does not answer)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
