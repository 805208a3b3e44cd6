"""`engine-ctl key new NAME`: a random API key, printed once, and the `kind: ApiKey` document (its hash only)."""

from __future__ import annotations

import secrets
import sys
import time

import click

from engine_ctl.core.documents.apikey import KEY_BYTES, KEY_PREFIX, key_document, key_sha256, new_expiry_problem
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


@key.command("new")
@click.argument("name")
@click.option(
    "--deployment", "deployments", multiple=True, metavar="NAME", help="Only this deployment (repeat for more)."
)
@click.option("--expires", metavar="DATE", help="When the key stops working: YYYY-MM-DD (UTC) or an ISO time.")
def new(name: str, deployments: tuple[str, ...], expires: str | None) -> None:
    """Make a random key (256 bits) and print it once, with the ApiKey document to add to your documents.
    The key itself is never stored: keep it where its user keeps secrets."""
    bad = [n for n in (name, *deployments) if not deployment_name_ok(n)]
    if bad:
        raise click.UsageError(f"{bad[0]!r}: {NAME_MESSAGE}")
    problem = new_expiry_problem(expires, time.time()) if expires is not None else None
    if problem:
        raise click.UsageError(problem)
    value = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    document = key_document(name, key_sha256(value), list(deployments) or None, expires)
    click.echo(f"API key {name} (shown once, never stored; give it to its user):\n\n  {value}\n", err=True)
    click.echo("Add this document to your documents, then `engine-ctl apply` (no reload, no dropped request):\n",
               err=True)  # fmt: skip
    sys.stdout.write(document)
