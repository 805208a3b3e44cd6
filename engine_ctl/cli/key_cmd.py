"""`engine-ctl key new NAME`: a random API key, printed once, and the `kind: ApiKey` document (its hash only)."""

from __future__ import annotations

import json
import secrets
import sys
import time
from datetime import UTC, datetime

import click

from engine_ctl.cli.examples import epilog
from engine_ctl.core.documents.apikey import (
    KEY_BYTES,
    KEY_PREFIX,
    RATE_RANGE,
    key_document,
    key_sha256,
    new_expiry_problem,
    parse_expiry,
)
from engine_ctl.core.names import NAME_MESSAGE, deployment_name_ok


class _KeyGroup(click.Group):
    """`key new` here; `key rotate-internal` (which reaches the hosts) loaded only when it runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "rotate-internal"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "rotate-internal":
            from engine_ctl.cli.rotate_cmd import rotate_internal

            return rotate_internal
        return super().get_command(ctx, cmd_name)


@click.group(cls=_KeyGroup)
def key() -> None:
    """API keys for the gateway: only their SHA-256 is ever written anywhere."""


@key.command("new", epilog=epilog("key"))
@click.argument("name")
@click.option(
    "--deployment", "deployments", multiple=True, metavar="NAME", help="Only this deployment (repeat for more)."
)
@click.option("--expires", metavar="DATE", help="When the key stops working: YYYY-MM-DD (UTC) or an ISO time.")
@click.option("--requests-per-minute", "rate", type=click.IntRange(*RATE_RANGE), metavar="N",
              help="At most N requests a minute with this key (more: 429 with Retry-After).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object on stdout: name, key, sha256, deployments, expires, requests_per_minute, "
              "document (the key is in it: keep it secret).")  # fmt: skip
def new(name: str, deployments: tuple[str, ...], expires: str | None, rate: int | None, as_json: bool) -> None:
    """Make a random key (256 bits) and print it once, with the ApiKey document to add to your documents.
    The key itself is never stored: keep it where its user keeps secrets."""
    bad = [n for n in (name, *deployments) if not deployment_name_ok(n)]
    if bad:
        raise click.UsageError(f"{bad[0]!r}: {NAME_MESSAGE}")
    problem = new_expiry_problem(expires, time.time()) if expires is not None else None
    if problem:
        raise click.UsageError(problem)
    value = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    document = key_document(name, key_sha256(value), list(deployments) or None, expires, rate)
    if as_json:
        out = {"name": name, "key": value, "sha256": key_sha256(value), "deployments": list(deployments) or None,
               "expires": expires, "requests_per_minute": rate, "document": document}  # fmt: skip
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    click.echo(f"API key {name} (shown once, never stored; give it to its user):\n\n  {value}\n", err=True)
    if expires is not None:  # a date is its first moment (UTC midnight): the key is refused all that day
        until = datetime.fromtimestamp(parse_expiry(expires) or 0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        click.echo(f"It works until {until}, and is refused from then on.\n", err=True)
    click.echo("Add this document to your documents, then `engine-ctl apply` (no reload, no dropped request):\n",
               err=True)  # fmt: skip
    sys.stdout.write(document)
