"""`engine-ctl monitoring scrape-config`: a Prometheus scrape_configs block for an inventory's gateway hosts. Pure.

Two jobs over the same targets (every gateway host's monitoring.port): `engine-ctl-haproxy` (HAProxy's own
exporter, /metrics: per deployment as proxy="d_<name>", per replica as server="r<index><slot>") and `engine-ctl`
(/metrics/engine-ctl: requests, errors and bytes per key name and deployment, held requests, wakes). Each target
carries its gateway host's name as the `gateway` label."""

from __future__ import annotations

import json

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.render.gateway import endpoint_of

JOBS = (("engine-ctl-haproxy", "/metrics"), ("engine-ctl", "/metrics/engine-ctl"))


def scrape_configs(inventory: Inventory, interval_s: int = 15) -> str:
    """The block as YAML (JSON's quoting, which YAML reads as it is), or "" with no metrics port or gateway."""
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
    return "\n".join(lines) + "\n"


__all__ = ["JOBS", "scrape_configs"]
