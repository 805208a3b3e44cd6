"""The gateway's part of an apply: before the deployments roll, the internal key on every host that needs it and
each gateway's interim configuration (old and new replicas); during a roll, a new replica enters once the
gateway sees it healthy and an old one drains before it stops; after, the configuration of what serves."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.names import parse_unit_name
from engine_ctl.core.plan.changes import Plan
from engine_ctl.core.plan.gateway import (
    CONFIGURED_WEIGHT,
    SET_ASIDE,
    GatewayChange,
    always_on_servers,
    gateway_after_apply,
    hold_servers,
    planned_gateway,
)
from engine_ctl.core.record.model import GatewayRecord, State
from engine_ctl.core.render.gateway import (
    CONFIG_FILE,
    GATEWAY_DIR,
    GATEWAY_UNIT,
    RenderedGateway,
    backend_name,
    replica_key_files,
    server_name,
)
from engine_ctl.shell.gateway import runtime as remote
from engine_ctl.shell.systemd import remove_unit
from engine_ctl.shell.transport import LocalTransport, SSHOptions, SSHTransport, transport_for

ENTER_TIMEOUT_S = 60
"""How long a new replica may take to pass the gateway's own check (every second while it is down)."""


def out_of_reach(plan: Plan) -> list[str]:
    """The gateway hosts the plan could not reach that apply leaves as they are, so that the others still get the
    keys' changes (a key revoked on every gateway it can reach: a probe, session 17, found none revoked while one
    gateway host was down). Only where no replica changes: a roll needs every gateway to drain its replicas, and
    one that cannot be told would send requests to a replica that stops (apply fails there, as before)."""
    if any(c.replicas for c in plan.changes):
        return []
    return sorted(g.host for g in plan.gateways if g.host in plan.unreachable and g.action != ["delete"])


class GatewayApply:
    def __init__(
        self,
        plan: Plan,
        hosts: Mapping[str, Host],
        record: Callable[[Callable[[State], None], str], None],
        state: Callable[[], State],
        options: SSHOptions | None,
        progress: Callable[[str], None],
    ) -> None:
        self.plan, self.hosts, self.record, self.state = plan, hosts, record, state
        self.options, self.progress = options, progress
        self.changes = [g for g in plan.gateways if g.host in hosts or g.action == ["delete"]]
        self.unreached = out_of_reach(plan)
        self.live = [g for g in self.changes if g.action != ["delete"] and g.host not in self.unreached]
        self._transports: dict[str, SSHTransport | LocalTransport] = {}
        self._lock = threading.Lock()

    def _t(self, host: str) -> SSHTransport | LocalTransport:
        with self._lock:
            if host not in self._transports:
                self._transports[host] = transport_for(self.hosts[host], self.options)
            return self._transports[host]

    def close(self) -> None:
        for t in self._transports.values():
            t.close()

    # --- before ---------------------------------------------------------------------------------------------
    def before(self) -> None:
        """The internal key everywhere it is needed, then each gateway's interim configuration. Raises
        GatewayFailure (nothing of the deployments is touched then)."""
        for host in self.unreached:
            self.progress(f"gateway {host}: not reached, left as it is: it answers the keys it had (one this apply "
                          "revokes too) until an apply reaches it; stop it, or take its gateway role away")  # fmt: skip
        if not self.live:  # no gateway host left (or none reached): only the removals of those no longer one
            for g in self.changes:
                if g.action == ["delete"]:
                    self._remove(g)
            return
        key, following = self._internal_key()
        accepted = [key, following] if following else [key]  # during a rotation, replicas learn the next key too
        replica_hosts = {r.host for c in self.plan.changes for r in c.replicas if r.action != ["delete"]}
        replica_hosts |= {d.host for d in self.plan.drift if d.kind == "internal-key"}  # a key file others may read
        for host in sorted(replica_hosts | {g.host for g in self.live}):
            if host in self.hosts:
                remote.write_secrets(self._t(host), replica_key_files(accepted))
        for g in self.live:
            remote.set_internal_key(self._t(g.host), key, following)
            if g.changed:
                interim = planned_gateway(g, interim=True)
                self._record_installing(g, interim)
                done = remote.install(self._t(g.host), interim)
                self._record_installed(g, interim)
                self.progress(f"gateway {g.host}: {done} (http://{g.endpoint}/v1)")
        for g in self.changes:
            if g.action == ["delete"]:
                self._remove(g)

    def _record_installed(self, g: GatewayChange, rendered: RenderedGateway) -> None:
        """What engine-ctl installed on a gateway, recorded at once: the interim configuration, until the roll is
        done. A kill in between leaves a state that says so, and the next plan sees engine-ctl's own files there
        (and plans the rest), never an edit by hand."""
        record = GatewayRecord(
            endpoint=g.endpoint, files_sha256=rendered.file_sha256, unit_sha256=rendered.unit_sha256,
            config=rendered.files[CONFIG_FILE],
        )  # fmt: skip
        self.record(lambda s, h=g.host, r=record: s.gateways.__setitem__(h, r), f"gateway {g.host}")  # type: ignore[misc]

    def _record_installing(self, g: GatewayChange, rendered: RenderedGateway) -> None:
        """What engine-ctl is about to install on a gateway that has a record, recorded before it is written (a
        new gateway has none: the next plan creates it whatever a kill left)."""
        installing = {**rendered.file_sha256, GATEWAY_UNIT: rendered.unit_sha256}

        def mark(s: State, h: str = g.host) -> None:
            if h in s.gateways and s.gateways[h].installing != installing:
                s.gateways[h] = s.gateways[h].model_copy(update={"installing": installing})

        if g.host in self.state().gateways:
            self.record(mark, f"gateway {g.host}")

    def _internal_key(self) -> tuple[str, str | None]:
        """The key the gateways already share (and the next one, during a rotation): the first gateway's key file's,
        else (a key file deleted by hand) the key the first running gateway sends, else a new one (256 bits), as
        core.internalkey.key_sent fingerprints it for the plan. It never leaves the hosts and this process: not in
        a plan, the state or a log."""
        for g in self.live:
            found, following = remote.read_internal_key(self._t(g.host))
            if found:
                return found, following
        for g in self.live:
            running = remote.read_running_key(self._t(g.host))
            if running:
                return running, None
        return secrets.token_hex(32), None

    def _remove(self, g: GatewayChange) -> None:
        if g.host in self.hosts:
            t = self._t(g.host)
            t.run(["sh", "-c", remove_unit(GATEWAY_UNIT) + f"; rm -rf {GATEWAY_DIR}"], timeout=60)
        self.record(lambda s: s.gateways.pop(g.host, None), f"gateway {g.host}")  # type: ignore[arg-type]
        self.progress(f"gateway {g.host}: removed")

    # --- during a roll --------------------------------------------------------------------------------------
    def _server(self, deployment: str, unit: str) -> tuple[str, str] | None:
        parsed = parse_unit_name(unit)
        if parsed is None:
            return None
        return backend_name(deployment), server_name(parsed.index, parsed.slot)

    def enter(self, deployment: str, unit: str) -> None:
        """Wait until every gateway sees the new replica healthy (it is in the interim configuration)."""
        where = self._server(deployment, unit)
        if where is None:
            return
        for g in self.live:
            t = self._t(g.host)
            remote.set_state(t, *where, "ready")
            seen = remote.wait_for(t, *where, lambda s: s.status.startswith("UP"), ENTER_TIMEOUT_S)
            if seen is None:
                raise remote.GatewayFailure(f"gateway {g.host} did not see {unit} healthy within {ENTER_TIMEOUT_S} s")
        self.progress(f"{deployment}: {unit} is behind the gateway")

    def drain(self, deployment: str, unit: str) -> None:
        """No new request to the replica; wait (bounded) for those in flight, streams included, to finish."""
        where = self._server(deployment, unit)
        if where is None:
            return
        timeout = max((g.drain_timeout_s for g in self.live), default=0)
        for g in self.live:
            t = self._t(g.host)
            if where not in remote.server_states(t):
                continue
            remote.set_state(t, *where, "drain")
            drained = remote.wait_drained(t, *where, timeout)  # in every worker: a reload's old ones too
            remote.set_state(t, *where, "maint")
            if not drained:
                self.progress(f"{deployment}: {unit} still had requests after {timeout} s of draining; stopping it")
        if self.live:
            self.progress(f"{deployment}: {unit} drained")

    # --- after ----------------------------------------------------------------------------------------------
    def after(self) -> None:
        """Each gateway's configuration of what serves now (from the recorded state), recorded."""
        for g in self.live:
            host = self.hosts[g.host]
            rendered = gateway_after_apply(host, self.state(), self.hosts, g)
            self._record_installing(g, rendered)
            unloaded = any(d.kind == "unloaded" and d.host == g.host for d in self.plan.drift)
            relaunch = any(d.kind == "launch" and d.host == g.host and d.unit == GATEWAY_UNIT for d in self.plan.drift)
            done = remote.install(self._t(g.host), rendered, reload=unloaded, restart=relaunch)
            self._record_installed(g, rendered)
            if any(d.kind == "set-aside" and d.host == g.host for d in self.plan.drift):
                self._back_in_rotation(g.host)
            if done != "maps" or g.changed:
                self.progress(f"gateway {g.host}: serving http://{g.endpoint}/v1 ({done})")

    def _back_in_rotation(self, host: str) -> None:
        """Every always-on replica that serves taken back into the gateway's rotation where an admin command set it
        aside (MAINT, DRAIN: set_aside_drift), and so out of the server-state file the next reload reads. Only on a
        host where the plan found one: no `show stat` round trip on every apply."""
        t = self._t(host)
        states = remote.server_states(t)
        for backend, server in [*always_on_servers(self.state()), *hold_servers(self.state())]:
            seen = states.get((backend, server))
            if seen is not None and seen.status.startswith(SET_ASIDE):
                remote.set_state(t, backend, server, "ready")
                self.progress(f"gateway {host}: {backend}/{server} back in rotation (it was {seen.status.split()[0]})")
        for (backend, server), seen in sorted(states.items()):  # any server's weight, as its configuration gives it
            if seen.weight not in ("", CONFIGURED_WEIGHT):
                remote.set_weight(t, backend, server, CONFIGURED_WEIGHT)
                self.progress(f"gateway {host}: {backend}/{server} weight {CONFIGURED_WEIGHT} again (it was "
                              f"{seen.weight})")  # fmt: skip
