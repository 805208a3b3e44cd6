"""The readiness decision on a host (seed 003, Decision models): a decisions deployment's replica is ready only
once it answers the seed's fixed question completely; GET /health alone (the unit's health gate, which only says
the engine has loaded) never makes it ready. The request goes from the host itself with curl (as the health gate
does), only to POST /v1/systemone: never a chat request in place of the decision. The answer is judged by
engine_ctl.core.decisions."""

from __future__ import annotations

import shlex
import time

from engine_ctl.core.decisions import READINESS_PATH, DecisionAnswer, check_answer, readiness_body
from engine_ctl.core.render.units import CURL, SH
from engine_ctl.shell.transport import Transport

ANSWER_TIMEOUT_S = 120
"""How long one decision may take (a large model reads the whole question in one batch)."""
LOADING = 503
ATTEMPTS = 10


def readiness_argv(address: str, port: int, key_file: str | None = None) -> list[str]:
    """curl POSTs the request from stdin and prints the body, then the HTTP status on a line of its own. A replica
    behind a gateway requires the internal key: its header is read from the host's key file on fd 3 (never in an
    argument, where `ps` would show it)."""
    url = f"http://{address}:{port}{READINESS_PATH}"
    argv = [CURL, "-sS", "--max-time", str(ANSWER_TIMEOUT_S), "-H", "Content-Type: application/json",
            "--data-binary", "@-", "-o", "-", "-w", "\\n%{http_code}", url]  # fmt: skip
    if key_file is None:
        return argv
    header = f"Authorization: Bearer $(head -n 1 {shlex.quote(key_file)})"  # the first: the key the gateways send
    return [SH, "-c", f"{shlex.join(argv)} -H @/dev/fd/3 3<<EOF\n{header}\nEOF\n"]


def ask_once(t: Transport, address: str, port: int, served_model: str, key_file: str | None) -> tuple[int | None, str]:
    argv = readiness_argv(address, port, key_file)
    result = t.run(argv, stdin=readiness_body(served_model), timeout=ANSWER_TIMEOUT_S + 30)
    body, _, code = result.stdout.rpartition("\n")
    code = code.strip()
    if not code.isdigit() or code == "000":
        return None, (result.stderr or body).strip()
    return int(code), body


def prove_ready(
    t: Transport, address: str, port: int, served_model: str, key_file: str | None = None
) -> DecisionAnswer | str:
    """The engine's answer to the readiness question, or why it does not prove the replica ready. An engine that
    still loads (503) is asked again, a few times; any other answer is final."""
    for attempt in range(ATTEMPTS):
        status, body = ask_once(t, address, port, served_model, key_file)
        if status != LOADING or attempt == ATTEMPTS - 1:
            return check_answer(status, body)
        time.sleep(1)
    raise AssertionError("unreachable")
