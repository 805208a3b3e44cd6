"""Placement: where replicas run. Pure functions over values.

Hosts are tried in one deterministic order (host_order): fewest replicas of the deployment first, then the host a
surge replaces, then the most free room, then inventory order; the first host where the replica fits is chosen.
HostRanking keeps that order as replicas take and free room, so that placing one replica looks at the first
hosts of the order, not at every host of the fleet (5,000 replicas on 1,000 hosts: see bench/scale.py).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

from engine_ctl.core.fit.fitting import FitResult, compatible_gpus, pins
from engine_ctl.core.fit.hostfacts import BUSY_BYTES, Gpu, HostFacts
from engine_ctl.core.fit.runspec import FitPlan, Member, Placement
from engine_ctl.core.model import Deployment
from engine_ctl.core.sizes import gb_up, gib_down, gib_up
from engine_ctl.providers import Provider

BASE_PORT = 8000


@dataclass
class Taken:
    """What is already given away on each host, as placement counts it: replicas recorded in the state (which
    run, or will run again) and replicas placed earlier in the same plan. `ours` are the GPUs engine-ctl's own
    replicas hold, whose memory in use is not another process's."""

    gpus: set[str] = field(default_factory=set)
    ours: set[str] = field(default_factory=set)
    ports: dict[str, set[int]] = field(default_factory=dict)
    cores: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    """Host memory (bytes) given to every replica counted here, against the host's total."""
    placed_memory: dict[str, int] = field(default_factory=dict)
    """Host memory (bytes) given to replicas placed by this plan: not yet gone from the host's available memory."""
    changed: set[str] = field(default_factory=set)
    """Hosts and GPU UUIDs whose room changed since a HostRanking last looked (it re-ranks only those)."""

    def hold(
        self, host: str, *, port: int | None = None, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0,
        placed: bool = False,
    ) -> None:  # fmt: skip
        if port is not None:
            self.ports.setdefault(host, set()).add(port)
        self.changed.add(host)
        self.changed.update(gpus)
        self.gpus.update(gpus)
        self.cores[host] = self.cores.get(host, 0) + cores
        self.memory[host] = self.memory.get(host, 0) + memory
        if placed:
            self.placed_memory[host] = self.placed_memory.get(host, 0) + memory

    def free(
        self, host: str, *, port: int | None = None, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0
    ) -> None:
        """Give back what a replica that goes away held (its memory counts as available only once it stopped)."""
        if port is not None:
            self.ports.get(host, set()).discard(port)
        self.changed.add(host)
        self.changed.update(gpus)
        self.gpus.difference_update(gpus)
        self.cores[host] = max(self.cores.get(host, 0) - cores, 0)
        self.memory[host] = max(self.memory.get(host, 0) - memory, 0)

    def take(self, p: Placement) -> None:
        self.hold(p.host, port=p.port, gpus=[g.uuid for g in p.gpus], cores=p.cpu_cores, memory=p.memory_bytes,
                  placed=True)  # fmt: skip
        if p.group_port is not None:
            self.hold(p.host, port=p.group_port)
        for m in p.members:
            self.hold(m.host, port=m.port, gpus=[g.uuid for g in m.gpus], cores=m.cpu_cores, memory=m.memory_bytes,
                      placed=True)  # fmt: skip

    def copy(self) -> Taken:
        return Taken(
            gpus=set(self.gpus), ours=set(self.ours), ports={h: set(p) for h, p in self.ports.items()},
            cores=dict(self.cores), memory=dict(self.memory), placed_memory=dict(self.placed_memory),
        )  # fmt: skip

    def free_cores(self, host: HostFacts) -> int:
        return host.cpu.cores - self.cores.get(host.host, 0)

    def free_memory(self, host: HostFacts) -> int:
        """Memory really free for one more replica: the host's total less what every counted replica takes, and
        its available memory now less what this plan has placed there."""
        by_total = host.memory.total_bytes - self.memory.get(host.host, 0)
        by_available = host.memory.available_bytes - self.placed_memory.get(host.host, 0)
        return min(by_total, by_available)


@dataclass
class Reserved:
    """What on-demand slots reserve on each host (their GPUs, cores and host memory), which an always-on replica
    keeps off where it has another place: a slot whose room an always-on replica took could never start, and its
    deployment (at `min: 0`) would never wake. `who` names the slots on each host, for the plan."""

    gpus: dict[str, set[str]] = field(default_factory=dict)
    cores: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    who: dict[str, list[str]] = field(default_factory=dict)

    def hold(self, host: str, who: str, *, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0) -> None:
        self.gpus.setdefault(host, set()).update(gpus)
        self.cores[host] = self.cores.get(host, 0) + cores
        self.memory[host] = self.memory.get(host, 0) + memory
        self.who.setdefault(host, []).append(who)

    def free(self, host: str, who: str, *, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0) -> None:
        if who not in self.who.get(host, []):
            return
        self.who[host].remove(who)
        self.gpus[host].difference_update(gpus)
        self.cores[host] = max(self.cores.get(host, 0) - cores, 0)
        self.memory[host] = max(self.memory.get(host, 0) - memory, 0)

    def over(self, host: str, taken: Taken) -> Taken | None:
        """`taken` with what is reserved on `host` added (None: nothing is reserved there)."""
        if not self.who.get(host):
            return None
        out = Taken(gpus=taken.gpus | self.gpus.get(host, set()), ours=taken.ours, ports=taken.ports,
                    cores=dict(taken.cores), memory=dict(taken.memory), placed_memory=taken.placed_memory)  # fmt: skip
        out.cores[host] = out.cores.get(host, 0) + self.cores.get(host, 0)
        out.memory[host] = out.memory.get(host, 0) + self.memory.get(host, 0)
        return out


RESERVED = "kept off: on-demand "
"""How place_one says (in FitResult.waiting) that a host was passed over for what on-demand slots reserve there."""


def reserved_note(result: FitResult) -> str:
    """'; kept off HOST (on-demand … reserves it)' for each host place_one passed over to keep what on-demand
    slots reserved; '' when none was."""
    kept = [f"{host} ({why.removeprefix('kept off: ')})" for host, why in sorted(result.waiting.items())
            if why.startswith(RESERVED)]  # fmt: skip
    return f"; kept off {', '.join(kept)}" if kept and result.placements else ""


def crowded(host: HostFacts, always: Taken, cpu_cores: int, memory_bytes: int) -> str | None:
    """Why an on-demand slot (its cores and host memory) cannot start on `host` beside what `always` counts (the
    always-on replicas, and what is not engine-ctl's), or None. The scaler would refuse to start it there."""
    cores = always.cores.get(host.host, 0)
    if cpu_cores and cores + cpu_cores > host.cpu.cores:
        return (f"always-on replicas hold {cores} of the {host.cpu.cores} cores of {host.host}, and it needs "
                f"{cpu_cores}")  # fmt: skip
    memory = always.memory.get(host.host, 0)
    if memory_bytes and memory + memory_bytes > host.memory.total_bytes:
        return (f"always-on replicas hold {gib_up(memory)} of the {gib_down(host.memory.total_bytes)} of host "
                f"memory of {host.host}, and it needs {gib_up(memory_bytes)}")  # fmt: skip
    return None


def crowds(per_host: Mapping[str, int], host: str, own: str) -> bool:
    """Whether a replacement on `host` would sit beside more replicas of its deployment than on its own host
    (`per_host`: the deployment's replicas on each host, the one replaced left out): a roll keeps the spread."""
    return per_host.get(host, 0) > per_host.get(own, 0)


# --- placement --------------------------------------------------------------------------------------------


def free_port(used: set[int], start: int = BASE_PORT) -> int:
    port = start
    while port in used:
        port += 1
    return port


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def cpu_verdict(host: HostFacts, plan: FitPlan, taken: Taken) -> str | None:
    """Why one more replica's cores or host memory are not free on `host` (seed's kind of reason), or None."""
    cores = taken.free_cores(host)
    if cores < plan.cpu_cores:
        return (
            f"Waiting for a machine with {_plural(plan.cpu_cores, 'free CPU core')} "
            f"({max(cores, 0)} of {host.cpu.cores} free here)"
        )
    memory = taken.free_memory(host)
    if memory < plan.memory_bytes:
        what = "free memory" if plan.accelerator == "cpu" else "free host memory"
        return f"Waiting for a machine with {gib_up(plan.memory_bytes)} of {what} ({gib_down(memory)} free here)"
    return None


def gpu_verdict(host: HostFacts, plan: FitPlan, provider: Provider, taken: Taken) -> tuple[list[Gpu] | None, str]:
    """The free GPUs of `host` a replica may take (all of them, in index order), or why there are none."""
    if not host.gpus:
        return None, "Waiting for a machine with a GPU (this one has none)"
    if plan.gpu_vendor != "any" and not any(g.vendor == plan.gpu_vendor for g in host.gpus):
        return None, f"Waiting for a machine with {plan.gpu_vendor} GPUs (this one has {host.gpus[0].vendor})"
    usable = compatible_gpus(host, provider, plan.gpu_vendor)
    if not usable:
        refusal = provider.gpu_refusal(host.gpus[0]) or f"{provider.name} does not run on these GPUs"
        return None, f"Waiting for a machine with GPUs {provider.title} runs on ({refusal})"
    if plan.devices:
        usable = [g for g in usable if pins(g, plan.devices)]
        if len(usable) < len(plan.devices):
            have = ", ".join(f"gpu{g.index}" for g in host.gpus)
            return None, f"Waiting for a machine with the pinned GPUs {', '.join(plan.devices)} (this one has {have})"
    need = plan.min_gpu_memory_bytes
    big_enough = [g for g in usable if (g.memory_total_bytes or 0) >= need]
    if not big_enough:  # seed 001's words, exactly: "Waiting for a machine with a GPU with at least 15 GB"
        return None, f"Waiting for a machine with a GPU with at least {gb_up(need)}"
    free = [
        g for g in big_enough
        if g.uuid not in taken.gpus and ((g.memory_used_bytes or 0) <= BUSY_BYTES or g.uuid in taken.ours)
    ]  # fmt: skip
    if len(free) < plan.gpus:
        return None, (
            f"Waiting for a machine with {_plural(plan.gpus, 'free GPU')} with at least {gb_up(need)} "
            f"({len(free)} free here)"
        )
    return sorted(free, key=lambda g: g.index)[: plan.gpus], ""


def host_verdict(
    host: HostFacts, plan: FitPlan, provider: Provider, taken: Taken
) -> tuple[list[Gpu] | None, str | None]:
    """Which GPUs of `host` a replica would take, or why it cannot run there (seed's words)."""
    if plan.accelerator == "cpu":
        if not provider.runs_on("cpu"):
            return None, f"{provider.name} does not run on CPUs"
        reason = cpu_verdict(host, plan, taken)
        return (None, reason) if reason else ([], None)
    gpus, why = gpu_verdict(host, plan, provider, taken)
    if gpus is None:
        return None, why
    reason = cpu_verdict(host, plan, taken)
    return (None, reason) if reason else (gpus, None)


def place(
    d: Deployment,
    plan: FitPlan,
    provider: Provider,
    hosts: Sequence[HostFacts],
    count: int,
    taken: Taken | None = None,
    already: dict[str, int] | None = None,
    prefer: str | None = None,
    no_weights: Mapping[str, str] | None = None,
) -> FitResult:
    """Spread `count` replicas over hosts, GPUs whole, by UUID. `taken` (not changed) is what other replicas
    already hold; each replica placed here is counted too. `no_weights` maps a host to why the model's weights are
    not usable there (missing, not a valid file): no replica is placed there, and it waits for them.

    The order is deterministic (the same documents, state and facts give the same placement): see host_order."""
    held = taken.copy() if taken is not None else Taken()
    per_host: dict[str, int] = {h.host: (already or {}).get(h.host, 0) for h in hosts}
    candidates = [h for h in hosts if d.host in (None, h.host)]
    placements: list[Placement] = []
    waiting: dict[str, str] = {}
    ready: set[str] = set()  # hosts where it would run but for the weights (or what else no_weights says)
    if d.host is not None and not candidates:
        return FitResult(plan=plan, pending_reason=f"Waiting for host {d.host} (not in the inventory or unreachable)")
    for index in range(count):
        best: tuple[HostFacts, list[Gpu]] | None = None
        for h in host_order(candidates, per_host, held, prefer):
            gpus, reason = host_verdict(h, plan, provider, held)
            if no_weights and h.host in no_weights:  # it waits for the weights only where it would run
                waiting[h.host] = no_weights[h.host] if gpus is not None else reason or "cannot run here"
                ready |= {h.host} if gpus is not None else set()
                continue
            if gpus is None:
                waiting[h.host] = reason or "cannot run here"
            elif best is None:
                best = (h, gpus)
        if best is None:
            reason = _furthest(waiting, ready) if waiting else "Waiting for a machine (no host in the inventory)"
            return FitResult(plan=plan, placements=tuple(placements), waiting=waiting, pending_reason=reason)
        h, gpus = best
        waiting.pop(h.host, None)
        port = free_port(set(h.ports_in_use) | held.ports.get(h.host, set()))
        placement = Placement(
            index=index, host=h.host, gpus=tuple(gpus), port=port, threads=replica_threads(plan, h),
            cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
        )  # fmt: skip
        held.take(placement)
        per_host[h.host] += 1
        placements.append(placement)
    return FitResult(plan=plan, placements=tuple(placements), waiting=waiting)


def free_room(host: HostFacts, taken: Taken) -> tuple[int, int, int]:
    """A host's room as placement ranks it, from stable facts only: GPUs not given to a replica, CPU cores and host
    memory (of its total) not given to a replica. Never the memory available now or a GPU's memory in use, which
    change from one gathering of facts to the next (and so would move a placement between two plans)."""
    gpus = sum(1 for g in host.gpus if g.uuid not in taken.gpus)
    memory = host.memory.total_bytes - taken.memory.get(host.host, 0)
    return gpus, taken.free_cores(host), memory


def host_order(
    hosts: Sequence[HostFacts], per_host: Mapping[str, int], taken: Taken, prefer: str | None = None
) -> list[HostFacts]:
    """The order hosts are tried for one replica: fewest replicas of this deployment first; then `prefer` (the
    host of the replica a surge replaces); then the most free room (free_room: GPUs, then cores, then memory);
    then inventory order. The first host where the replica fits is chosen."""
    position = {h.host: i for i, h in enumerate(hosts)}

    def key(h: HostFacts) -> tuple[int, bool, tuple[int, int, int], int]:
        gpus, cores, memory = free_room(h, taken)
        return per_host.get(h.host, 0), h.host != prefer, (-gpus, -cores, -memory), position[h.host]

    return sorted(hosts, key=key)


RoomKey = tuple[int, int, int, int]


class HostRanking:
    """The hosts of one plan sorted by free room (free_room: most free GPUs, then cores, then memory; then
    inventory order), kept sorted as `taken` changes: each placement re-ranks only the hosts whose room changed."""

    def __init__(self, hosts: Sequence[HostFacts], taken: Taken) -> None:
        self.hosts = {h.host: h for h in hosts}
        self.taken = taken
        self._position = {h.host: i for i, h in enumerate(hosts)}
        self._owner = {g.uuid: h.host for h in hosts for g in h.gpus}
        self.keys = {h.host: self._key(h) for h in hosts}
        self._order = sorted((key, name) for name, key in self.keys.items())
        taken.changed.clear()

    def copy_for(self, taken: Taken) -> HostRanking:
        """This ranking over `taken`: a copy of this ranking's Taken (taken.copy()) that may hold more since
        (Allocation.view). The order is copied, not sorted again: only the hosts that `taken` changed are
        re-ranked, at the next look (a view per deployment with on-demand slots would sort every host again)."""
        self.sync()
        out = HostRanking.__new__(HostRanking)
        out.hosts, out.taken, out._position, out._owner = self.hosts, taken, self._position, self._owner
        out.keys, out._order = dict(self.keys), list(self._order)
        return out

    def _key(self, host: HostFacts) -> RoomKey:
        gpus, cores, memory = free_room(host, self.taken)
        return -gpus, -cores, -memory, self._position[host.host]

    def sync(self) -> None:
        """Re-rank the hosts whose room changed since the last look."""
        changed = {self._owner.get(name, name) for name in self.taken.changed}
        changed = {name for name in changed if name in self.keys}
        self.taken.changed.clear()
        for name in changed:
            old = (self.keys[name], name)
            del self._order[bisect.bisect_left(self._order, old)]
            self.keys[name] = self._key(self.hosts[name])
            bisect.insort(self._order, (self.keys[name], name))

    def in_order(self, per_host: Mapping[str, int], prefer: str | None) -> Iterator[HostFacts]:
        """host_order over every host, lazily: the few hosts with replicas of the deployment (or preferred) are
        placed among the rest by their count, the rest follow the ranking."""
        self.sync()

        def full(name: str) -> tuple[int, bool, RoomKey]:
            return per_host.get(name, 0), name != prefer, self.keys[name]

        special = sorted((n for n in {*per_host, prefer} if n in self.keys and (per_host.get(n) or n == prefer)),
                         key=full)  # fmt: skip
        first = [n for n in special if full(n)[:2] < (0, True)]
        yield from (self.hosts[n] for n in first)
        skip = set(special)
        yield from (self.hosts[name] for _key, name in self._order if name not in skip)
        yield from (self.hosts[n] for n in special if n not in first)


def place_one(
    d: Deployment,
    plan: FitPlan,
    provider: Provider,
    ranking: HostRanking,
    *,
    per_host: Mapping[str, int] | None = None,
    prefer: str | None = None,
    no_weights: Mapping[str, str] | None = None,
    within: str | None = None,
    index: int = 0,
    reserved: Reserved | None = None,
) -> FitResult:
    """One replica, as place() would place it with count 1 over the ranking's hosts and `taken` (which is not
    changed), looking only as far down host_order as the first host where it fits. `within` narrows the hosts to
    one (a stop-then-start replacement stays on its host). On no host: every host's reason, as place() gives.

    `reserved` (an always-on replica): what on-demand slots reserve is kept, on the first host in the order where
    the replica fits beside it; only where it fits nowhere so does it take a slot's room (the slot then moves)."""
    only = d.host if d.host is not None else within
    if only is not None:
        found = ranking.hosts.get(only) if within in (None, only) else None
        order: Iterable[HostFacts] = [found] if found else []
        if d.host is not None and not found:
            why = f"Waiting for host {d.host} (not in the inventory or unreachable)"
            return FitResult(plan=plan, pending_reason=why)
    else:
        order = ranking.in_order(per_host or {}, prefer)
    waiting: dict[str, str] = {}
    ready: set[str] = set()  # hosts where it would run but for the weights (or what else no_weights says)
    taken = ranking.taken
    fallback: tuple[HostFacts, list[Gpu]] | None = None
    for h in order:
        gpus, reason = host_verdict(h, plan, provider, taken)
        if no_weights and h.host in no_weights:  # it waits for the weights only where it would run
            waiting[h.host] = no_weights[h.host] if gpus is not None else reason or "cannot run here"
            ready |= {h.host} if gpus is not None else set()
            continue
        if gpus is None:
            waiting[h.host] = reason or "cannot run here"
            continue
        beside = reserved.over(h.host, taken) if reserved is not None else None
        if beside is not None and host_verdict(h, plan, provider, beside)[0] is None:
            waiting[h.host] = f"{RESERVED}{', '.join(reserved.who[h.host])} reserves it"  # type: ignore[union-attr]
            fallback = fallback or (h, gpus)
            continue
        kept = {k: v for k, v in waiting.items() if v.startswith(RESERVED)}
        return FitResult(plan=plan, placements=(_placement(plan, h, gpus, taken, index),), waiting=kept)
    if fallback is not None:  # it fits nowhere beside the reservations: it takes an on-demand slot's room
        h, gpus = fallback
        return FitResult(plan=plan, placements=(_placement(plan, h, gpus, taken, index),))
    reason = _furthest(waiting, ready) if waiting else "Waiting for a machine (no host in the inventory)"
    return FitResult(plan=plan, waiting=waiting, pending_reason=reason)


def _placement(plan: FitPlan, h: HostFacts, gpus: list[Gpu], taken: Taken, index: int) -> Placement:
    port = free_port(set(h.ports_in_use) | taken.ports.get(h.host, set()))
    return Placement(
        index=index, host=h.host, gpus=tuple(gpus), port=port, threads=replica_threads(plan, h),
        cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
    )  # fmt: skip


# --- a replica group: one replica over several machines (spec.nodes > 1) ------------------------------------


ONE_MACHINE = "Waiting for a machine with "


def group_reason(reason: str, nodes: int) -> str:
    """Why a replica group's head has no machine, as what each of its `nodes` machines needs: "Waiting for 2
    machines for one replica group, each with 41.5 GiB of free memory (29.0 GiB free here)". Another reason (the
    weights, a host it names) is left as it is."""
    if nodes <= 1 or not reason.startswith(ONE_MACHINE):
        return reason
    return f"Waiting for {nodes} machines for one replica group, each with {reason.removeprefix(ONE_MACHINE)}"


def shared_labels(a: Mapping[str, str], b: Mapping[str, str]) -> int:
    """How many labels (a rack, a network group) two hosts share: a group prefers hosts that share most."""
    return sum(1 for k, v in a.items() if b.get(k) == v)


def place_group(
    nodes: int,
    head: Placement,
    plan: FitPlan,
    provider: Provider,
    hosts: Sequence[HostFacts],
    taken: Taken,
    labels: Mapping[str, Mapping[str, str]],
    no_weights: Mapping[str, str] | None = None,
) -> Placement | str:
    """The head placed at `head`, with nodes - 1 workers on other hosts that fit (each its GPUs, or its cores,
    and its share of memory) and a runtime port on each machine, free like an engine port. Hosts that share the
    most labels with the head come first, then the most free room, then inventory order. `taken` is not changed.
    Returns the group's placement, or why it waits (each host's reason)."""
    held = taken.copy()
    held.take(head)
    by_name = {h.host: h for h in hosts}
    group_port = free_port(set(by_name[head.host].ports_in_use) | held.ports.get(head.host, set()))
    held.hold(head.host, port=group_port)
    mine = labels.get(head.host, {})
    position = {h.host: i for i, h in enumerate(hosts)}
    members: list[Member] = []
    used = {head.host}
    for rank in range(1, nodes):
        waiting: dict[str, str] = {}

        def key(h: HostFacts) -> tuple[int, tuple[int, int, int], int]:
            gpus, cores, memory = free_room(h, held)
            return -shared_labels(mine, labels.get(h.host, {})), (-gpus, -cores, -memory), position[h.host]

        chosen: tuple[HostFacts, list[Gpu]] | None = None
        for h in sorted((h for h in hosts if h.host not in used), key=key):
            if no_weights and h.host in no_weights:
                waiting[h.host] = no_weights[h.host]
                continue
            gpus, reason = host_verdict(h, plan, provider, held)
            if gpus is None:
                waiting[h.host] = reason or "cannot run here"
                continue
            chosen = (h, gpus)
            break
        if chosen is None:
            why = _furthest(waiting) if waiting else "no other host in the inventory"
            return (f"Waiting for {nodes} machines for one replica group ({len(used)} found; member {rank}: "
                    f"{why})")  # fmt: skip
        h, gpus = chosen
        port = free_port(set(h.ports_in_use) | held.ports.get(h.host, set()))
        member = Member(host=h.host, gpus=tuple(gpus), port=port, threads=replica_threads(plan, h),
                        cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes)  # fmt: skip
        held.hold(h.host, port=port, gpus=[g.uuid for g in gpus], cores=plan.cpu_cores, memory=plan.memory_bytes,
                  placed=True)  # fmt: skip
        used.add(h.host)
        members.append(member)
    return head.model_copy(update={"group_port": group_port, "members": tuple(members)})


def replica_threads(plan: FitPlan, host: HostFacts) -> int | None:
    """A CPU replica's threads (its provider passes them to the engine): twice its cores, at most the machine's."""
    return min(2 * plan.cpu_cores, host.cpu.cores) if plan.accelerator == "cpu" else None


STAGES = (
    re.compile(r"^Waiting for a machine with a GPU \(this one has none\)"),
    re.compile(r"^Waiting for a machine with \w+ GPUs \(this one has "),
    re.compile(r"^Waiting for a machine with GPUs .* runs on "),
    re.compile(r"^Waiting for a machine with the pinned GPUs "),
    re.compile(r"^Waiting for a machine with a GPU with at least "),
    re.compile(r"^Waiting for a machine with \d+ free GPUs? with at least "),
    re.compile(r"^Waiting for a machine with \d+ free CPU cores? "),
    re.compile(r"^Waiting for a machine with [\d.]+ GiB of free "),
    re.compile("^" + re.escape(RESERVED)),
    re.compile(r"^Waiting for the weights of | is not usable: "),
)
"""How far a replica got on a host, in the order host_verdict checks (then the weights, checked once it would run
there): a host with a GPU too small is further than one with none, one with every GPU busy further still."""


def stage(reason: str) -> int:
    """The reason's place in STAGES (-1: one of no stage, as a host the deployment names that is not there)."""
    return next((i for i, pattern in enumerate(STAGES) if pattern.search(reason)), -1)


def _furthest(waiting: dict[str, str], ready: Set[str] = frozenset()) -> str:
    """The reason to show for the deployment (seed 000: "the reason is the furthest replica's"): the reason of the
    host where it got furthest (STAGES; furthest of all a host in `ready`, where it would run but for what it
    waits for there: the weights, the guard's HAProxy); among equals, the one most hosts share, then the first."""
    ranks: dict[str, tuple[int, int]] = {}
    for host, reason in waiting.items():
        rank = len(STAGES) if host in ready else stage(reason)
        old = ranks.get(reason, (rank, 0))
        ranks[reason] = (max(old[0], rank), old[1] + 1)
    return max(ranks, key=lambda r: ranks[r])
