"""What one plan knows of the hosts and of what is already given away on them. Values only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.fitting import largest_cores, largest_gpu_host
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.placement import HostRanking, Taken, replica_threads
from engine_ctl.core.fit.runspec import FitPlan, Placement
from engine_ctl.core.plan.engines import engine_refusals
from engine_ctl.providers import Provider
from engine_ctl.state.model import ReplicaRecord, State


@dataclass(frozen=True)
class Hosts:
    """The hosts as this plan sees them: the inventory's entries, the facts of those reached (`reached`, in
    inventory order), and each host's units by name."""

    inventory: dict[str, Host]
    facts: Mapping[str, HostFacts]
    reached: list[HostFacts]
    units: dict[str, dict[str, UnitFact]] = field(default_factory=dict)
    lacking_weights: list[HostFacts] = field(default_factory=list)
    """The hosts whose facts report a model file that is missing or not valid."""
    _largest: dict[tuple[str, ...], HostFacts | None] = field(default_factory=dict)
    _cores: dict[tuple[str, ...], int] = field(default_factory=dict)
    _refused: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, inventory: Inventory, facts: Mapping[str, HostFacts]) -> Hosts:
        reached = [facts[h.name] for h in inventory.hosts if h.name in facts]
        return cls(
            inventory={h.name: h for h in inventory.hosts},
            facts=facts,
            reached=reached,
            units={name: {u.name: u for u in f.units} for name, f in facts.items()},
            lacking_weights=[h for h in reached if h.model_problems],
        )

    def unit(self, host: str, name: str) -> UnitFact | None:
        """The unit `name` as the facts of `host` report it (None: not there, or the host was not reached)."""
        return self.units.get(host, {}).get(name)

    def largest_gpu_host(
        self, hosts: Sequence[HostFacts], provider: Provider, vendor: str, devices: Sequence[str] = ()
    ) -> HostFacts | None:
        """fitting.largest_gpu_host, asked once per engine, vendor, pins and hosts in one plan."""
        key = (provider.name, vendor, *devices, "|", *self._key(hosts))
        if key not in self._largest:
            self._largest[key] = largest_gpu_host(hosts, provider, vendor, devices)
        return self._largest[key]

    def largest_cores(self, hosts: Sequence[HostFacts]) -> int:
        """fitting.largest_cores, asked once per set of hosts in one plan."""
        key = self._key(hosts)
        if key not in self._cores:
            self._cores[key] = largest_cores(hosts)
        return self._cores[key]

    def _key(self, hosts: Sequence[HostFacts]) -> tuple[str, ...]:
        """The hosts as a memo key: all those reached (the common case, told at the cost of a pointer compare
        each), or their names."""
        return ("*",) if list(hosts) == self.reached else tuple(h.host for h in hosts)

    def engine_refusals(self, provider: Provider, accelerator: str) -> dict[str, str]:
        """engines.engine_refusals over the hosts reached, asked once per engine and accelerator in one plan."""
        key = (provider.name, accelerator)
        if key not in self._refused:
            self._refused[key] = engine_refusals(provider, accelerator, self.reached, self.inventory)
        return self._refused[key]

    def running(self, host: str, name: str) -> bool:
        u = self.unit(host, name)
        return u is not None and u.active_state == "active"


class Allocation:
    """Ports, GPUs, cores and memory taken on each host: recorded replicas (with their recorded plan's cores and
    memory) plus what this plan places. `taken` is what placement counts; `ranking` orders the hosts by it."""

    def __init__(self, state: State, hosts: list[HostFacts]) -> None:
        self.taken = Taken(ours=set(state.gpus_held()))
        self.shares: dict[str, tuple[int, int]] = {}
        for d in state.deployments.values():
            share = (d.plan.cpu_cores, d.plan.memory_bytes) if d.plan else (0, 0)
            for r in d.replicas:
                self.shares[r.unit] = share
                self.taken.hold(r.host, port=r.port, gpus=r.gpus, cores=share[0], memory=share[1])
        self.ranking = HostRanking(hosts, self.taken)

    def take(self, placement: Placement) -> None:
        self.taken.take(placement)

    def release(self, record: ReplicaRecord) -> None:
        cores, memory = self.shares.pop(record.unit, (0, 0))
        self.taken.free(record.host, port=record.port, gpus=record.gpus, cores=cores, memory=memory)


def recorded_placement(record: ReplicaRecord, facts: HostFacts, plan: FitPlan) -> Placement | None:
    """The recorded replica's placement, if its host still has the GPUs it names."""
    by_uuid = {g.uuid: g for g in facts.gpus}
    if any(u not in by_uuid for u in record.gpus):
        return None
    return Placement(
        index=record.index, host=record.host, gpus=tuple(by_uuid[u] for u in record.gpus), port=record.port,
        threads=replica_threads(plan, facts), cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
    )  # fmt: skip
