"""`engine-ctl key rotate-internal`: a new internal key (gateway -> replicas) with no failed request.

1. The gateways stage the new key as `next` (they still send the old one).
2. Every deployment is restarted as `engine-ctl restart` does (a replica at a time, health-gated, drained behind the
   gateway, 1-replica deployments held): apply writes both keys to the engine hosts, so each new replica accepts
   the old key and the new one.
3. Only when every replica was restarted do the gateways send the new key (over the stats socket, no reload),
   and the engine hosts keep the new key alone: a replica forgets the old one at its next restart.

An engine that takes one key only (its provider says so) cannot accept both at once, so the rotation is refused
while a deployment runs one (its replicas would refuse the gateway between the switch and their restart)."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

import click

from engine_ctl.cli.common import load_checked, resolve_inventory, ssh_settings
from engine_ctl.cli.context import backend_for, locked, read_state, writing_options
from engine_ctl.cli.plan_cmd import JsonEvents, Request, _apply_documents
from engine_ctl.cli.requests import announce, request_identity
from engine_ctl.cli.views.output import console
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import replica_key_files
from engine_ctl.providers import PROVIDERS
from engine_ctl.shell.gateway import runtime as remote
from engine_ctl.shell.pinning import unresolved
from engine_ctl.shell.transport import HostFailure, SSHOptions, transport_for


def single_key_deployments(state: State) -> list[str]:
    """Deployments whose engine takes one internal key only (they cannot accept the old and the new at once)."""
    out = []
    for name, record in sorted(state.deployments.items()):
        provider = PROVIDERS.get(record.plan.engine if record.plan else "")
        if provider is not None and not provider.internal_key_several and provider.takes_internal_key:
            out.append(f"{name} ({provider.title})")
    return out


def _each(hosts: list[Host], options: SSHOptions, act: object) -> None:
    for host in hosts:
        t = transport_for(host, options)
        try:
            act(t)  # type: ignore[operator]
        finally:
            t.close()


def _stage(gateways: list[Host], options: SSHOptions) -> str:
    """The key the gateways send now, with a next one staged beside it (a staged one is kept: a rotation that
    stopped half way goes on with the same key). Returns the next key; it stays on the hosts and in this process."""
    t = transport_for(gateways[0], options)
    try:
        key, following = remote.read_internal_key(t)
    finally:
        t.close()
    if key is None:
        raise click.ClickException("the gateways have no internal key yet: run `engine-ctl apply` first")
    following = following or secrets.token_hex(32)
    _each(gateways, options, lambda t: remote.set_internal_key(t, key, following))
    return following


def _switch(gateways: list[Host], engine_hosts: list[Host], options: SSHOptions, key: str) -> None:
    """The gateways send the new key from now on (no reload); the engine hosts keep it alone."""
    _each(gateways, options, lambda t: remote.set_internal_key(t, key, None))
    _each(engine_hosts, options, lambda t: remote.write_secrets(t, replica_key_files([key])))


def _engine_hosts(state: State, inventory: Inventory) -> list[Host]:
    names: Mapping[str, Host] = {h.name: h for h in inventory.hosts}
    used = {r.host for d in state.deployments.values() for r in d.replicas} | {h.name for h in inventory.gateways()}
    return [names[n] for n in sorted(used) if n in names]


@click.command("rotate-internal")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@writing_options
def rotate_internal(
    paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, targets: tuple[str, ...], lock_timeout: float, auto_approve: bool, as_json: bool,
) -> None:  # fmt: skip
    """Rotate the gateway's internal key (what the gateways send the replicas) with no failed request: every
    deployment is restarted (health-gated, drained) to accept the new key beside the old, then the gateways switch
    to it and the old one is dropped. PATHS are the documents (default: the current directory)."""
    out = console(stderr=as_json)
    options = ssh_settings(accept_new_host_keys)
    loaded = load_checked(paths, pin=unresolved)
    inventory = resolve_inventory(inventory_path, loaded)
    gateways = inventory.gateways()
    if not gateways:
        raise click.ClickException("the inventory has no gateway host: there is no internal key to rotate")
    backend = backend_for(state_path, paths)
    with locked(backend, "key rotate-internal", lock_timeout):
        state = read_state(backend)
    one_key = single_key_deployments(state)
    if one_key:
        raise click.ClickException(
            "these deployments run an engine that takes one internal key, so it cannot accept the old and the new "
            f"at once: {', '.join(one_key)}; until they run elsewhere their replicas are guarded by "
            "IPAddressAllow= and the current key"
        )
    try:
        following = _stage(gateways, options)
        out.print("The gateways staged a new internal key; restarting every deployment to accept it…")
        names = tuple(sorted(state.deployments))
        events = JsonEvents() if as_json else None
        request = Request(request_identity(None))
        if names:
            announce(request.id)
        code = _apply_documents(paths, inventory_path, state_path, options, parallel, targets or names, lock_timeout,
                                auto_approve, events, False, names, "key rotate-internal",
                                request) if names else 0  # fmt: skip
        if code != 0:
            out.print("The internal key was not switched (a replica was not restarted): run `engine-ctl key "
                      "rotate-internal` again; the gateways keep sending the current key.")  # fmt: skip
            sys.exit(code)
        with locked(backend, "key rotate-internal", lock_timeout):
            _switch(gateways, _engine_hosts(read_state(backend), inventory), options, following)
    except (HostFailure, remote.GatewayFailure, OSError) as exc:
        raise click.ClickException(f"rotating the internal key: {exc}") from exc
    out.print("The gateways now send the new internal key; the old one is gone from every host (a replica forgets "
              "it at its next restart).")  # fmt: skip
