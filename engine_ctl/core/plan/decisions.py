"""Which hosts may run a decisions deployment (seed 003, Decision models): those whose engine build serves
decision models, by the version the facts report (each provider's decisions_min_version, the seed's floors) or
by the inventory's registration of the build (engines.<engine>.decisions: true). An older one is never chosen, and
naming it is refused with host_capability_missing:decisions. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from engine_ctl.core.decisions import READINESS_PATH, check_answer, meets_floor, readiness_body, shown_version
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.engines import build_for, engine_at, host_platform
from engine_ctl.core.plan.internalkey import internal_key_file
from engine_ctl.core.record.model import DeploymentRecord
from engine_ctl.providers import Provider

HOST_CAPABILITY_MISSING = "host_capability_missing:decisions"


def decisions_refusal(provider: Provider, accelerator: str, facts: HostFacts, host: Host) -> str | None:
    """Why this host's build of the engine cannot serve decision models (None: it can, or there is no build to
    judge, which engine_refusals reports already)."""
    if host.engine_decisions.get(provider.name):
        return None
    path = build_for(provider, host, host_platform(provider, accelerator, facts))
    found = engine_at(facts, path) if path else None
    if path is None or provider.decisions_min_version is None:
        return None
    said = found.version if found else None
    if meets_floor(said, provider.decisions_min_version):
        return None
    return (f"{HOST_CAPABILITY_MISSING}: {provider.title} at {path} on {facts.host} is version {shown_version(said)}; "
            f"decision models need {provider.decisions_min_version} or newer (register a build that serves "
            f"POST /v1/systemone with engines.{provider.name}.decisions: true in the inventory)")  # fmt: skip


def decisions_refusals(
    provider: Provider, accelerator: str, hosts: list[HostFacts], inventory: Mapping[str, Host]
) -> dict[str, str]:
    """host -> why no replica of a decisions deployment is placed there."""
    out = {}
    for facts in hosts:
        why = decisions_refusal(provider, accelerator, facts, inventory[facts.host])
        if why:
            out[facts.host] = why
    return out


def readiness_checks(rec: DeploymentRecord) -> dict[str, list[dict[str, object]]]:
    """host -> the readiness requests the facts probe sends a decisions deployment's replicas (none for chat)."""
    if rec.spec is None or rec.spec.api != "decisions":
        return {}
    out: dict[str, list[dict[str, object]]] = {}
    for r in rec.replicas:
        check = {"port": r.port, "path": READINESS_PATH, "body": readiness_body(rec.name)}
        key_file = internal_key_file(r.argv)
        if key_file is not None:  # behind a gateway the replica requires the internal key: only its unit's process
            check["key_file"], check["unit"] = key_file, r.unit
        out.setdefault(r.host, []).append(check)
    return out


def decided_facts(rec: DeploymentRecord, facts: Mapping[str, HostFacts]) -> dict[str, HostFacts]:
    """The facts as a decisions deployment's status reads them: a replica's health is 200 only when its engine
    answered GET /health and then the readiness decision completely; otherwise why not ("decision: …")."""
    if rec.spec is None or rec.spec.api != "decisions":
        return dict(facts)
    out = dict(facts)
    for r in rec.replicas:
        found = out.get(r.host)
        port = str(r.port)
        if found is None or found.health.get(port) != "200":
            continue
        asked = found.decisions.get(port)
        if asked is None:
            verdict = "decision: not asked"
        else:
            status = asked.get("status", "")
            answer = check_answer(int(status) if status.isdigit() else None, asked.get("body", ""))
            verdict = "200" if not isinstance(answer, str) else f"decision: {answer}"
        out[r.host] = found.model_copy(update={"health": {**found.health, port: verdict}})
    return out
