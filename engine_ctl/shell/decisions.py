"""The readiness decision on a host (seed 003, Decision models): a decisions deployment's replica is ready only
once it answers the seed's fixed question completely; GET /health alone (the unit's health gate, which only says
the engine has loaded) never makes it ready. The request goes from the host itself with curl (as the health gate
does), only to POST /v1/systemone: never a chat request in place of the decision. The answer is judged by
engine_ctl.core.decisions."""

from __future__ import annotations

import time

from engine_ctl.core.decisions import READINESS_PATH, DecisionAnswer, check_answer, readiness_body
from engine_ctl.core.render.units import CURL
from engine_ctl.shell.transport import Transport

ANSWER_TIMEOUT_S = 120
"""How long one decision may take (a large model reads the whole question in one batch)."""
LOADING = 503
ATTEMPTS = 10


def readiness_argv(address: str, port: int) -> list[str]:
    """curl POSTs the request from stdin and prints the body, then the HTTP status on a line of its own."""
    url = f"http://{address}:{port}{READINESS_PATH}"
    return [CURL, "-sS", "--max-time", str(ANSWER_TIMEOUT_S), "-H", "Content-Type: application/json",
            "--data-binary", "@-", "-o", "-", "-w", "\\n%{http_code}", url]  # fmt: skip


def ask_once(t: Transport, address: str, port: int, served_model: str) -> tuple[int | None, str]:
    result = t.run(readiness_argv(address, port), stdin=readiness_body(served_model), timeout=ANSWER_TIMEOUT_S + 30)
    body, _, code = result.stdout.rpartition("\n")
    code = code.strip()
    if not code.isdigit() or code == "000":
        return None, (result.stderr or body).strip()
    return int(code), body


def prove_ready(t: Transport, address: str, port: int, served_model: str) -> DecisionAnswer | str:
    """The engine's answer to the readiness question, or why it does not prove the replica ready. An engine that
    still loads (503) is asked again, a few times; any other answer is final."""
    for attempt in range(ATTEMPTS):
        status, body = ask_once(t, address, port, served_model)
        if status != LOADING or attempt == ATTEMPTS - 1:
            return check_answer(status, body)
        time.sleep(1)
    raise AssertionError("unreachable")
