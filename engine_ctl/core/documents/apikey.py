"""API keys as documents (`kind: ApiKey`): a name, the key's SHA-256 (never the key), an optional scope of
deployments and an optional expiry. Pure: `engine-ctl key new` makes a key and prints this document once.

    kind: ApiKey
    metadata: {name: ci-bot}
    spec:
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      deployments: [chat]        # optional: only these deployments (others answer 404, like an unknown model)
      expires: "2027-01-31"      # optional: a date (UTC midnight) or an ISO 8601 time
      requests_per_minute: 60    # optional: more are answered 429 rate_limit_exceeded, with Retry-After
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine_ctl.core.diagnostics import Diagnostic
from engine_ctl.core.documents.shape import diagnostics_from
from engine_ctl.core.documents.yamlsource import SourceDocument
from engine_ctl.core.model import ApiKey
from engine_ctl.core.names import NAME_MESSAGE, deployment_name_ok

KEY_PREFIX = "ak-"
KEY_BYTES = 32
"""256 bits of randomness in every key."""
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
RATE_RANGE = (1, 1_000_000)
"""A key's requests per minute (spec.requests_per_minute, the inventory's gateway.requests_per_minute)."""


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class ApiKeyMetadata(_Doc):
    name: str = Field(description="The key's name (who or what uses it): " + NAME_MESSAGE + ".")


class ApiKeySpec(_Doc):
    sha256: str = Field(description="The SHA-256 of the key, 64 lowercase hex digits (`engine-ctl key new` prints it).")
    deployments: list[str] | None = Field(None, description="The deployments this key may call; left out: all of them.")
    expires: str | None = Field(
        None, description="When the key stops working: a date (YYYY-MM-DD, UTC) or an ISO time."
    )
    requests_per_minute: int | None = Field(
        None, description=f"At most this many requests a minute with this key, on each gateway host "
        f"({RATE_RANGE[0]} to {RATE_RANGE[1]}; left out: the inventory's gateway.requests_per_minute, else no "
        "limit). More are answered 429 `rate_limit_exceeded` with Retry-After: the seconds until one more is let "
        "through."
    )  # fmt: skip


class ApiKeyDocument(_Doc):
    kind: Literal["ApiKey"] = Field(description="ApiKey")
    metadata: ApiKeyMetadata
    spec: ApiKeySpec


def key_sha256(key: str) -> str:
    """What a document and the gateway hold: the hex SHA-256 of the key as the client sends it."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_document(
    name: str, sha256: str, deployments: list[str] | None = None, expires: str | None = None,
    requests_per_minute: int | None = None,
) -> str:  # fmt: skip
    """The `kind: ApiKey` document for a key (its hash only), as YAML to paste into the documents."""
    lines = ["kind: ApiKey", f"metadata: {{name: {name}}}", "spec:", f"  sha256: {sha256}"]
    if deployments:
        lines.append(f"  deployments: [{', '.join(deployments)}]")
    if expires:
        lines.append(f'  expires: "{expires}"')
    if requests_per_minute is not None:
        lines.append(f"  requests_per_minute: {requests_per_minute}")
    return "\n".join(lines) + "\n"


def parse_expiry(text: str) -> int | None:
    """Epoch seconds of a date (UTC midnight) or an ISO 8601 time (UTC unless it says otherwise); None if neither."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def new_expiry_problem(text: str, now: float) -> str | None:
    """Why `key new --expires TEXT` is refused at epoch `now` (not a date or time, or not after now); None if fine."""
    when = parse_expiry(text)
    if when is None:
        return f"--expires {text!r}: a date (YYYY-MM-DD) or an ISO 8601 time"
    if when <= now:
        said = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"--expires {text!r}: {said} is already past: the key would never work; give a later date or time"
    return None


def api_key_from(doc: SourceDocument) -> tuple[ApiKey | None, list[Diagnostic]]:
    """A loaded ApiKey document, or the problems that name its fields."""
    data = dict(doc.data)
    spec = data.get("spec")
    if isinstance(spec, dict) and not isinstance(spec.get("expires"), str | None):
        data["spec"] = {**spec, "expires": str(spec["expires"])}  # an unquoted YAML date
    try:
        parsed = ApiKeyDocument.model_validate(data)
    except ValidationError as exc:
        return None, diagnostics_from(exc, doc, ApiKeyDocument)
    name = parsed.metadata.name
    expires = parse_expiry(parsed.spec.expires) if parsed.spec.expires is not None else None
    problems = _spec_problems(doc, parsed, expires)
    rate = parsed.spec.requests_per_minute
    if problems:
        return None, problems
    scope = tuple(parsed.spec.deployments) if parsed.spec.deployments is not None else None
    key = ApiKey(name=name, sha256=parsed.spec.sha256, deployments=scope, expires=expires, requests_per_minute=rate,
                 file=doc.file)  # fmt: skip
    return key, []


def _spec_problems(doc: SourceDocument, parsed: ApiKeyDocument, expires: int | None) -> list[Diagnostic]:
    """What a parsed ApiKey document's own rules refuse, each at its field."""
    problems: list[Diagnostic] = []
    name = parsed.metadata.name
    if not deployment_name_ok(name):
        problems.append(
            Diagnostic(
                doc.locate(("metadata", "name")), "metadata.name", f"{name!r}: {NAME_MESSAGE}", code="invalid_name"
            )
        )
    if not SHA256_HEX.fullmatch(parsed.spec.sha256):
        problems.append(
            Diagnostic(
                doc.locate(("spec", "sha256")),
                "spec.sha256",
                "the key's SHA-256: 64 lowercase hex digits (never the key itself)",
                hint="`engine-ctl key new NAME` makes a key and prints its document",
                code="invalid_key_hash",
            )
        )
    for i, d in enumerate(parsed.spec.deployments or []):
        if not deployment_name_ok(d):
            where = ("spec", "deployments", i)
            problems.append(
                Diagnostic(doc.locate(where), f"spec.deployments[{i}]", f"{d!r}: {NAME_MESSAGE}", code="invalid_name")
            )
    if parsed.spec.expires is not None and expires is None:
        problems.append(
            Diagnostic(
                doc.locate(("spec", "expires")),
                "spec.expires",
                f"{parsed.spec.expires!r}: a date (YYYY-MM-DD) or an ISO 8601 time (2027-01-31T12:00:00Z)",
                code="invalid_expiry",
            )
        )
    rate = parsed.spec.requests_per_minute
    if rate is not None and not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        problems.append(
            Diagnostic(
                doc.locate(("spec", "requests_per_minute")),
                "spec.requests_per_minute",
                f"between {RATE_RANGE[0]} and {RATE_RANGE[1]} requests a minute, not {rate}",
                hint="leave it out for the inventory's gateway.requests_per_minute (else no limit)",
                code="out_of_range",
            )
        )
    return problems
