"""Decision models (`api: decisions`, seed 003, Decision models): the readiness question a decisions
deployment must answer before it counts as ready, the rule its answer must meet, the answer recorded for the
wake check, and which engine builds serve decisions. Pure: the shell sends the request and hands the reply here.

A decision model generates no text, so GET /health alone never proves it ready: it is ready when it answers the
seed's fixed question (which team handles a ticket about a double charge, three options) with a probability for
each option and no other, each in [0, 1], summing to 1 within 0.001, and one of them picked."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

READINESS_PATH = "/v1/systemone"
READINESS_CHECK_VERSION = 1
"""Any change to the request below is a new version of the check: a wake reference recorded under an older
version is never compared with the new answers."""
QUESTION = "route"
CRITERIA = {
    "billing": "payments, charges and refunds",
    "shipping": "deliveries, parcels and tracking",
    "technical": "errors, crashes and sign-in problems",
}
SUM_TOLERANCE = 0.001


def readiness_request(served_model: str) -> dict[str, Any]:
    """The seed's exact readiness request, with `model` set to the name the engine serves the model under."""
    return {
        "model": served_model,
        "state": "The ticket says: my card was charged twice.",
        "questions": {
            QUESTION: {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": dict(CRITERIA),
            }
        },
    }


def readiness_body(served_model: str) -> str:
    return json.dumps(readiness_request(served_model), separators=(",", ":"))


@dataclass(frozen=True)
class DecisionAnswer:
    """A complete answer to the readiness question: the option picked and every option's probability."""

    choice: str
    probabilities: dict[str, float]

    def as_record(self) -> dict[str, Any]:
        return {"version": READINESS_CHECK_VERSION, "choice": self.choice, "probabilities": self.probabilities}


def check_answer(status: int | None, body: str) -> DecisionAnswer | str:
    """The engine's reply (HTTP status and body) -> the answer, or why it does not prove the model ready."""
    if status != 200:
        said = " ".join(body.split())[:200]
        return f"POST {READINESS_PATH} answered HTTP {status or 'nothing'}" + (f": {said}" if said else "")
    try:
        doc = json.loads(body)
    except ValueError:
        return f"POST {READINESS_PATH} answered something that is not JSON: {body[:120]!r}"
    answers = doc.get("answers") if isinstance(doc, dict) else None
    answer = answers.get(QUESTION) if isinstance(answers, dict) else None
    if not isinstance(answer, dict):
        return f"the answer has no {QUESTION!r} (answers.{QUESTION} is missing)"
    return _check_route(answer)


def _check_route(answer: dict[str, Any]) -> DecisionAnswer | str:
    if answer.get("type") != "choice":
        return f"answers.{QUESTION} is not a choice (type {answer.get('type')!r})"
    probs = answer.get("probabilities")
    if not isinstance(probs, dict) or set(probs) != set(CRITERIA):
        keys = sorted(probs) if isinstance(probs, dict) else probs
        return f"answers.{QUESTION}.probabilities must name exactly {', '.join(CRITERIA)}; it has {keys!r}"
    for key, p in probs.items():
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) or not 0 <= p <= 1:
            return f"answers.{QUESTION}.probabilities.{key} is {p!r}, not a probability between 0 and 1"
    total = sum(probs.values())
    if abs(total - 1) > SUM_TOLERANCE:
        return f"answers.{QUESTION}.probabilities sum to {total:.4f}, not 1 (within {SUM_TOLERANCE})"
    choice = answer.get("choice")
    if choice not in CRITERIA:
        return f"answers.{QUESTION}.choice is {choice!r}, not one of {', '.join(CRITERIA)}"
    return DecisionAnswer(choice=choice, probabilities={k: float(v) for k, v in probs.items()})


def comparable_reference(reference: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recorded wake reference, or None when it was recorded under an older version of the check (never
    compared with the new answers)."""
    if not reference or reference.get("version") != READINESS_CHECK_VERSION:
        return None
    return reference


VERSION_NUMBERS = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)(?:\.(\d+))?")


def version_numbers(text: str | None) -> tuple[int, int, int] | None:
    """The first dotted version in what an engine says of itself ("version: 0.7.1 (build …)", "0.5.22") ->
    (0, 7, 1); None when it says none."""
    found = VERSION_NUMBERS.search(text or "")
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


SHOWN_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)?(?:[-+][\w.]+)?")


def shown_version(text: str | None) -> str:
    """What an engine's --version says, cut to the version itself ("version: 0.6.0-dev (build 0, …)" ->
    "0.6.0-dev"); "unknown" when it says none."""
    found = SHOWN_VERSION.search(text or "")
    return found.group(0) if found else "unknown"


def meets_floor(version: str | None, floor: str) -> bool:
    """True when `version` is `floor` or newer (a development build of the floor itself, 0.7.0-dev, counts)."""
    have, need = version_numbers(version), version_numbers(floor)
    return have is not None and need is not None and have >= need
