"""A replica group's links (spec.nodes > 1): whether its head reaches each worker. An engine whose head dials its
workers (provider.head_dials_members) answers its health check without them, and its requests wait
on a worker it cannot reach; the facts probe opens those connections from the head's host (member_links says
which), and status puts such a group out of service (link_problem)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.record.model import DeploymentRecord, MemberRecord, ReplicaRecord
from engine_ctl.providers import PROVIDERS

LINK_OK = "ok"


def member_links(
    records: Iterable[DeploymentRecord], addresses: Mapping[str, str]
) -> dict[str, list[dict[str, object]]]:
    """head host -> the connections the facts probe opens from there to each worker of a replica group whose head
    dials its workers (provider.head_dials_members): the worker's address (`addresses`: inventory
    host -> address) and port. A worker its head cannot reach hangs every request of the group."""
    out: dict[str, list[dict[str, object]]] = {}
    for record in records:
        provider = PROVIDERS.get(record.plan.engine) if record.plan else None
        if provider is None or not provider.head_dials_members:
            continue
        for r in record.replicas:
            out.setdefault(r.host, []).extend(
                {"member": m.unit, "address": addresses[m.host], "port": m.port}
                for m in r.members if m.host in addresses
            )  # fmt: skip
    return {h: links for h, links in out.items() if links}


def link_problem(r: ReplicaRecord, m: MemberRecord, head: HostFacts | None) -> str | None:
    """Why the group's head cannot reach worker `m` (None: it can, or it was not tried)."""
    said = head.member_links.get(m.unit) if head is not None else None
    if said is None or said == LINK_OK:
        return None
    return (
        f"group member {m.rank} ({m.unit}) on {m.host} cannot be reached from its head on {r.host} (port {m.port}: "
        f"{said}): the group's requests wait on it"
    )


__all__ = ["LINK_OK", "link_problem", "member_links"]
