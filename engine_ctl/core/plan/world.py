"""What one plan knows of the hosts and of what is already given away on them. Values only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.fitting import largest_cores, largest_gpu_host
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.placement import HostRanking, Reserved, Taken, crowded, replica_threads
from engine_ctl.core.fit.runspec import FitPlan, Member, Placement
from engine_ctl.core.plan.engines import engine_refusals
from engine_ctl.core.plan.internalkey import key_sent
from engine_ctl.core.record.model import ReplicaRecord, State
from engine_ctl.providers import Provider


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
    key_sent: str | None = None
    """The fingerprint of the internal key the gateways send (core.internalkey.key_sent); None: none yet."""
    _largest: dict[tuple[str, ...], HostFacts | None] = field(default_factory=dict)
    _cores: dict[tuple[str, ...], int] = field(default_factory=dict)
    _refused: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    _most_available: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, inventory: Inventory, facts: Mapping[str, HostFacts]) -> Hosts:
        reached = [facts[h.name] for h in inventory.hosts if h.name in facts]
        return cls(
            inventory={h.name: h for h in inventory.hosts},
            facts=facts,
            reached=reached,
            units={name: {u.name: u for u in f.units} for name, f in facts.items()},
            lacking_weights=[h for h in reached if h.model_problems],
            key_sent=key_sent(inventory.gateways(), facts),
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

    def most_available(self, only: str | None = None) -> int:
        """The most memory available on one reached host (0: none reached); `only`: that host's (spec.host). The
        largest over every host is found once per plan."""
        if only is not None:
            found = self.facts.get(only) if only in self.inventory else None
            return found.memory.available_bytes if found is not None else 0
        if "*" not in self._most_available:
            self._most_available["*"] = max((h.memory.available_bytes for h in self.reached), default=0)
        return self._most_available["*"]

    def _key(self, hosts: Sequence[HostFacts]) -> tuple[str, ...]:
        """The hosts as a memo key: all those reached (the common case, told by identity, or at the cost of a
        pointer compare each), or their names."""
        if hosts is self.reached or list(hosts) == self.reached:
            return ("*",)
        return tuple(h.host for h in hosts)

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
    memory) plus what this plan places. `taken` is what placement counts; `ranking` orders the hosts by it.

    Always-on replicas hold their room alone. An on-demand slot (index at or above its deployment's `min`,
    `always` maps each deployment of the documents to it) holds only its port here: its GPUs, cores and memory
    are held in its own deployment's view (`view`), so other deployments' on-demand slots may share them. A
    recorded always-on replica whose GPUs another (of a higher priority) already holds is `displaced`: it is
    placed again."""

    def __init__(self, state: State, hosts: list[HostFacts], always: Mapping[str, int] | None = None) -> None:
        self.taken = Taken()
        self.shares: dict[str, tuple[int, int]] = {}
        self.on_demand: dict[str, list[ReplicaRecord]] = {}
        self.shared: set[tuple[str, str]] = set()
        """(host, unit) of the on-demand records, whose room is held in their deployment's view only."""
        self.displaced: set[str] = set()
        self.reserved = Reserved()
        """What the on-demand records reserve: always-on replicas keep off it where they can (placement.Reserved)."""
        self.moves: dict[str, str] = {}
        """Records that move though nothing of theirs changed (unit -> why): an on-demand slot whose room always-on
        replicas took (its deployment's view), a replica that restores the spread (deployment.spread)."""
        self.hosts = hosts
        records = sorted(state.deployments.values(), key=lambda d: (-(d.spec.priority if d.spec else 0), d.name))
        owner: dict[str, str] = {}
        """GPU UUID -> the deployment whose always-on replica holds it (two slots of one deployment on the same
        GPUs are an interrupted stop-then-start, not a displacement)."""
        for d in records:
            share = (d.plan.cpu_cores, d.plan.memory_bytes) if d.plan else (0, 0)  # a group's: each machine's
            for r in d.replicas:
                self.shares[r.unit] = share
                if shared_slot(r, (always or {}).get(d.name)):
                    self.taken.hold(r.host, port=r.port)
                    self.on_demand.setdefault(d.name, []).append(r)
                    self.shared.add((r.host, r.unit))
                    self.reserved.hold(r.host, f"{d.name} replica {r.index}", gpus=r.gpus, cores=share[0],
                                       memory=share[1])  # fmt: skip
                    continue
                if any(owner.setdefault(g, d.name) != d.name for g in r.gpus):  # another deployment holds them
                    self.displaced.add(r.unit)
                self.taken.ours.update(r.gpus)
                self.taken.hold(r.host, port=r.port, gpus=r.gpus, cores=share[0], memory=share[1])
                if r.group_port is not None:
                    self.taken.hold(r.host, port=r.group_port)
                for m in r.members:  # a replica group's workers hold their machines' room too
                    self.taken.ours.update(m.gpus)
                    self.taken.hold(m.host, port=m.port, gpus=m.gpus, cores=share[0], memory=share[1])
        self.ranking = HostRanking(hosts, self.taken)

    def take(self, placement: Placement) -> None:
        self.taken.take(placement)

    def release(self, record: ReplicaRecord) -> None:
        cores, memory = self.shares.pop(record.unit, (0, 0))
        if (record.host, record.unit) in self.shared:  # its room is held in its deployment's view only
            self.shared.discard((record.host, record.unit))
            for name, own in self.on_demand.items():
                if record in own:
                    own.remove(record)
                    self.reserved.free(record.host, f"{name} replica {record.index}", gpus=record.gpus, cores=cores,
                                       memory=memory)  # fmt: skip
            self.taken.free(record.host, port=record.port)
            return
        gpus = () if record.unit in self.displaced else record.gpus  # a displaced one's GPUs are another's
        self.taken.free(record.host, port=record.port, gpus=gpus, cores=cores, memory=memory)
        if record.group_port is not None:
            self.taken.free(record.host, port=record.group_port)
        for m in record.members:
            self.taken.free(m.host, port=m.port, gpus=m.gpus, cores=cores, memory=memory)

    def view(self, name: str) -> Allocation:
        """What deployment `name`'s on-demand slots see: every always-on replica and its own on-demand slots (not
        other deployments' on-demand slots: those may overlap). Ports stay global: a port taken in the view is
        taken for every deployment. An own slot on a CPU host whose cores or memory the always-on replicas hold
        is `displaced` (placed again), and `moves` says why (a GPU slot: Target.exclusive)."""
        out = Allocation(State(), [])
        out.taken = self.taken.copy()
        out.taken.ports = self.taken.ports
        out.shares, out.hosts = dict(self.shares), self.hosts
        facts = {h.host: h for h in self.hosts}
        for r in self.on_demand.get(name, []):
            cores, memory = self.shares.get(r.unit, (0, 0))
            why = crowded(facts[r.host], self.taken, cores, memory) if r.host in facts and not r.gpus else None
            if why is not None:  # always-on replicas took its room: it could never start there, so it moves
                out.displaced.add(r.unit)
                out.moves[r.unit] = why
            out.taken.ours.update(r.gpus)
            out.taken.hold(r.host, gpus=r.gpus, cores=cores, memory=memory)
        out.ranking = self.ranking.copy_for(out.taken)
        return out


def shared_slot(record: ReplicaRecord, always: int | None) -> bool:
    """A recorded slot that is on demand after this plan: at or above the documents' `min` (the record's own
    flag when the documents do not name its deployment)."""
    return record.on_demand if always is None else record.index >= always


def recorded_placement(
    record: ReplicaRecord, facts: HostFacts, plan: FitPlan, others: Mapping[str, HostFacts] | None = None
) -> Placement | None:
    """The recorded replica's placement, if its host still has the GPUs it names; a replica group's with its
    workers, if each was reached (`others`: every host's facts) and still has its GPUs."""
    by_uuid = {g.uuid: g for g in facts.gpus}
    if any(u not in by_uuid for u in record.gpus):
        return None
    members: list[Member] = []
    for m in record.members:
        found = (others or {}).get(m.host)
        if found is None:
            return None
        theirs = {g.uuid: g for g in found.gpus}
        if any(u not in theirs for u in m.gpus):
            return None
        members.append(Member(host=m.host, gpus=tuple(theirs[u] for u in m.gpus), port=m.port,
                              threads=replica_threads(plan, found), cpu_cores=plan.cpu_cores,
                              memory_bytes=plan.memory_bytes))  # fmt: skip
    return Placement(
        index=record.index, host=record.host, gpus=tuple(by_uuid[u] for u in record.gpus), port=record.port,
        threads=replica_threads(plan, facts), cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
        group_port=record.group_port if members else None, members=tuple(members),
    )  # fmt: skip
