"""The scaling envelope: every slot of each deployment (0..max-1), always on or on demand, and where on-demand
slots of different deployments overlap (the same GPUs, or on a CPU host more cores or memory than both
together would need). Pure.

Always-on replicas never overlap anything: they are placed first, every deployment's, and hold their room
alone. On-demand slots are placed next, each deployment's in what the always-on replicas leave plus its own
slots, so two deployments' on-demand slots may share GPUs: the scaler never runs both at once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import TYPE_CHECKING

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.placement import Taken
from engine_ctl.core.plan.changes import Slot

if TYPE_CHECKING:
    from engine_ctl.core.plan.deployment import Target


def slots_of(t: Target) -> list[Slot]:
    """The deployment's slots as this plan places them; none when every replica is always on (max = min)."""
    if t.count <= t.always:
        return []
    return [
        Slot(index=i, host=p.host, port=p.port, gpu_indexes=[g.index for g in p.gpus], cpu_cores=p.cpu_cores,
             memory_bytes=p.memory_bytes, on_demand=t.on_demand(i))
        for i, p in sorted(t.placed.items())
    ]  # fmt: skip


def envelopes(targets: Iterable[Target], always_on: Taken) -> None:
    """Each target's change gets its envelope, with the on-demand slots it shares room with. `always_on`: what
    the always-on replicas of every deployment hold."""
    placed: list[tuple[str, Slot, tuple[str, ...]]] = []
    facts: dict[str, HostFacts] = {}
    for t in targets:
        t.change.envelope = slots_of(t)
        for slot in t.change.envelope:
            if slot.on_demand:
                p = t.placed[slot.index]
                placed.append((t.d.name, slot, tuple(g.uuid for g in p.gpus)))
                facts[slot.host] = t.hosts.facts[slot.host]
    room = {h: (always_on.free_cores(f), f.memory.total_bytes - always_on.memory.get(h, 0)) for h, f in facts.items()}
    mark_shares(placed, facts, room)


def mark_shares(
    placed: Sequence[tuple[str, Slot, tuple[str, ...]]],
    facts: Mapping[str, HostFacts],
    room: Mapping[str, tuple[int, int]],
) -> None:
    """Pairs of on-demand slots of different deployments on one host that overlap: GPUs in common, or (CPU
    slots) more cores or memory together than the host has left once its always-on replicas are counted
    (`room`: host -> (free cores, free memory bytes))."""
    for (a_name, a, a_gpus), (b_name, b, b_gpus) in combinations(placed, 2):
        if a_name == b_name or a.host != b.host:
            continue
        if a_gpus or b_gpus:
            common = sorted(set(a_gpus) & set(b_gpus))
            if not common:
                continue
            facts_gpus = {g.uuid: g.index for g in facts[a.host].gpus}
            what = "GPU" + ("s " if len(common) > 1 else " ") + gpu_list(sorted(facts_gpus[u] for u in common))
        else:
            cores, memory = room.get(a.host, (0, 0))
            if a.cpu_cores + b.cpu_cores <= cores and a.memory_bytes + b.memory_bytes <= memory:
                continue
            what = "host memory and cores"
        a.shares.append(f"{what} with {b_name} replica {b.index}")
        b.shares.append(f"{what} with {a_name} replica {a.index}")


def gpu_list(indexes: Sequence[int]) -> str:
    """[2, 3] -> `2–3`, [0, 2] -> `0, 2`, [1] -> `1`: the GPUs as the plan names them."""
    if len(indexes) > 1 and list(indexes) == list(range(indexes[0], indexes[-1] + 1)):
        return f"{indexes[0]}–{indexes[-1]}"
    return ", ".join(str(i) for i in indexes)
