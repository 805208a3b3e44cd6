"""What keeps the planner linear and cheap per replica (issue 10, bench/scale.py times it): each shortcut gives the
same answer as the slow way it replaced. Synthetic facts in the real shape (tests/fleetfacts.py: recorded
nvidia-smi output); no hosts, nothing timed."""

from __future__ import annotations

import gc
import hashlib
import json

import pytest

from engine_ctl.core.collector import collector_held
from engine_ctl.core.fit.hostfacts import HostFacts, parse_nvidia_smi
from engine_ctl.core.fit.placement import HostRanking
from engine_ctl.core.plan.deployment import capped_to, whole_host
from engine_ctl.core.plan.diff import spec_digest
from engine_ctl.core.plan.world import Allocation, Hosts
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.render.systemd_escape import env_assignment, exec_line, exec_word
from tests.fleetfacts import cpu_host, gpu_host, h100x8, recording
from tests.test_plan_core import desired, plan_for, world


def test_the_collector_is_held_while_the_call_runs_and_as_it_was_after() -> None:
    seen: list[bool] = []

    @collector_held
    def inner() -> None:
        seen.append(gc.isenabled())

    @collector_held
    def outer(fail: bool) -> None:
        inner()
        seen.append(gc.isenabled())  # the inner call did not enable it again
        if fail:
            raise ValueError("boom")

    assert gc.isenabled()
    outer(False)
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(ValueError):
        outer(True)
    assert gc.isenabled(), "an exception enables it again"
    gc.disable()
    try:
        outer(False)
        assert not gc.isenabled(), "disabled before: left disabled"
    finally:
        gc.enable()


def test_a_plan_leaves_the_collector_enabled() -> None:
    plan = plan_for("gpus: 1, replicas: {min: 2, max: 2}", State(), h100x8())
    assert sum(len(c.replicas) for c in plan.changes) == 2
    assert gc.isenabled()


@pytest.mark.parametrize("value", ["plain", 'a"b', "back\\slash", '\\"', "50%", "$HOME", '%\\"$;', "ünï €", ""])
def test_escaping_is_the_same_as_a_table_of_each_character(value: str) -> None:
    """systemd.service(5): `\\` and `"` escaped inside quotes, `%%` for a specifier, `$$` in an argument."""
    quoted = str.maketrans({"\\": "\\\\", '"': '\\"', "%": "%%"})
    argument = str.maketrans({"\\": "\\\\", '"': '\\"', "%": "%%", "$": "$$"})
    assert env_assignment("K", value) == '"' + f"K={value}".translate(quoted) + '"'
    if value != ";":
        assert exec_word(value) == '"' + value.translate(argument) + '"'
    assert exec_line(["/bin/x", value]) == '/bin/x "' + value.translate(argument) + '"'


def test_the_revision_digest_is_the_hash_of_the_specification_and_the_model_together() -> None:
    loaded = desired("gpus: 1, context_length: 8192")
    d = loaded.deployments[0].deployment
    model = loaded.model(d.model)
    assert model is not None
    spec, mdl = d.model_dump(mode="json", exclude={"prevent_destroy"}), model.model_dump(mode="json")
    whole = json.dumps({"spec": spec, "model": mdl}, sort_keys=True)
    assert spec_digest(d, model) == hashlib.sha256(whole.encode()).hexdigest()
    other = d.model_copy(update={"context_length": 4096})
    assert spec_digest(other, model) != spec_digest(d, model), "the specification's change is a new revision"


def test_the_most_memory_one_host_gives_is_asked_of_the_hosts_the_deployment_may_use() -> None:
    small, large = cpu_host("small", memory_gib=64), cpu_host("large", memory_gib=256)
    inventory, facts = world(small, large)
    hosts = Hosts.of(inventory, facts)
    assert hosts.most_available() == large.memory.available_bytes
    assert hosts.most_available("small") == small.memory.available_bytes
    assert hosts.most_available("not-in-the-inventory") == 0
    fit = plan_for("accelerator: cpu, cpu_cores: 2, context_length: 4096", State(), small).changes[0].fit
    assert fit is not None
    for limit in (0, fit.memory_bytes, fit.memory_bytes - 1):
        host = cpu_host("h")
        giving = host.model_copy(update={"memory": host.memory.model_copy(update={"available_bytes": limit})})
        assert capped_to(fit, limit) == whole_host(fit, [giving])
    assert capped_to(fit, fit.memory_bytes - 1) == (fit.model_copy(update={"memory_bytes": fit.memory_bytes - 1}), True)


def _on_demand_state() -> tuple[State, list[HostFacts]]:
    """Two deployments whose slots 1 and 2 are on demand (min 1), recorded on the hosts they were placed on."""
    csv = recording("nvidia-smi-8xH100.csv")
    hosts = [gpu_host(f"g{i}", parse_nvidia_smi(csv.replace("GPU-2f7b6c1e", f"GPU-{i:08x}"))) for i in range(6)]
    state = State()
    for n, name in enumerate(("one", "two")):
        replicas = [
            ReplicaRecord(index=i, slot="a", host=hosts[(n + i) % 6].host, unit=f"engine-ctl-{name}-{i}a.service",
                          port=8000 + n, gpus=[hosts[(n + i) % 6].gpus[i].uuid], on_demand=i >= 1, revision=1,
                          unit_sha256="")
            for i in range(3)
        ]  # fmt: skip
        state.deployments[name] = DeploymentRecord(name=name, replicas=replicas)
    return state, hosts


def test_a_view_ranks_the_hosts_as_a_ranking_made_afresh_would() -> None:
    state, hosts = _on_demand_state()
    alloc = Allocation(state, hosts, {"one": 1, "two": 1})
    for name in ("one", "two"):
        view = alloc.view(name)
        fresh = HostRanking(hosts, view.taken.copy())
        assert [h.host for h in view.ranking.in_order({}, None)] == [h.host for h in fresh.in_order({}, None)]
        assert view.ranking.keys == fresh.keys
    assert [h.host for h in alloc.ranking.in_order({}, None)] == [
        h.host for h in HostRanking(hosts, alloc.taken.copy()).in_order({}, None)
    ], "the plan's own ranking is left as it was"
