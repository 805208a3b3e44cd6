"""`engine-ctl monitoring scrape-config`: a Prometheus scrape_configs block for an inventory's gateway hosts. Pure.

Two jobs over the same targets (every gateway host's monitoring.port): `engine-ctl-haproxy` (HAProxy's own
exporter, /metrics: per deployment as proxy="d_<name>", per replica as server="r<index><slot>") and `engine-ctl`
(/metrics/engine-ctl: requests, errors and bytes per key name and deployment, held requests, wakes). Each target
carries its gateway host's name as the `gateway` label. With the state's replicas, a third job reads each
engine's own /metrics through a gateway (/metrics/replica/<deployment>/<server>)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.render.gateway import GatewayBackend, endpoint_of

JOBS = (("engine-ctl-haproxy", "/metrics"), ("engine-ctl", "/metrics/engine-ctl"))


def scrape_configs(inventory: Inventory, interval_s: int = 15, backends: Iterable[GatewayBackend] = ()) -> str:
    """The block as YAML (JSON's quoting, which YAML reads as it is), or "" with no metrics port or gateway.
    `backends` (the state's, core.plan.gateway.backends_from_state): a third job, `engine-ctl-engines`, one
    target per replica, its engine's /metrics through the first gateway host (each replica once), labelled with
    its deployment, server and host."""
    port = inventory.gateway.metrics_port
    if port is None or not inventory.gateways():
        return ""
    lines = ["scrape_configs:"]
    for job, path in JOBS:
        lines += [f"  - job_name: {job}", f"    metrics_path: {path}", f"    scrape_interval: {interval_s}s",
                  "    static_configs:"]  # fmt: skip
        for host in inventory.gateways():
            target = endpoint_of(host.model_copy(update={"gateway_port": port}))
            lines += [f"      - targets: [{json.dumps(target)}]",
                      f"        labels: {{gateway: {json.dumps(host.name)}}}"]  # fmt: skip
    replicas = [(b.deployment, s) for b in backends for s in b.servers]
    if replicas:
        first = inventory.gateways()[0]
        target = json.dumps(endpoint_of(first.model_copy(update={"gateway_port": port})))
        by_address = {h.address: h.name for h in inventory.hosts}
        lines += ["  - job_name: engine-ctl-engines", f"    scrape_interval: {interval_s}s", "    static_configs:"]
        for deployment, server in replicas:
            labels = {"__metrics_path__": f"/metrics/replica/{deployment}/{server.name}", "deployment": deployment,
                      "replica": server.name, "host": by_address.get(server.address, server.address)}  # fmt: skip
            shown = ", ".join(f"{k}: {json.dumps(v)}" for k, v in labels.items())
            lines += [f"      - targets: [{target}]", f"        labels: {{{shown}}}"]
    return "\n".join(lines) + "\n"


__all__ = ["JOBS", "scrape_configs"]
