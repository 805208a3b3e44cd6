"""A saved plan is untrusted input: everything it carries for a gateway (configuration, map files, the maps apply
sends to the running gateway over its stats socket) must be what engine-ctl renders from the plan's own recorded
inputs (its changes, its ApiKey documents) and the state. And a key that exists only in a running gateway's memory
is drift at the next plan, named (never by its hash), and removed by apply. Issue 31, point 1."""

from __future__ import annotations

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.gateway import gateway_tampering
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import map_text
from tests.test_gateway_core import SHAPE, applied, desired, world

EVIL = key_sha256("ak-evil")


def reviewed():  # type: ignore[no-untyped-def]
    """A plan made after a first apply (the gateway recorded), with the documents' key `k` (every deployment)."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    return inv, state, after, make_plan(desired(1024), state, inv, after, SHAPE)


def test_an_untouched_saved_plan_carries_its_key_documents_and_passes() -> None:
    inv, state, _, plan = reviewed()
    (g,) = plan.gateways
    assert [(k.name, k.sha256) for k in g.keys] == [("k", key_sha256("ak-example"))]
    assert gateway_tampering(plan.gateways, plan.changes, state, inv) == []


def test_a_key_added_to_the_running_maps_only_is_refused() -> None:
    inv, state, _, plan = reviewed()
    forged = plan.model_copy(deep=True)
    forged.gateways[0].maps["keys.map"][EVIL] = "all"  # the attack: sent over the stats socket by apply
    problems = gateway_tampering(forged.gateways, forged.changes, state, inv)
    assert problems == [
        "gateway edge: the maps it sends to the running gateway (keys.map) differ from what engine-ctl renders from "
        "the plan's ApiKey documents"
    ]


def test_a_widened_scope_in_the_running_maps_is_refused() -> None:
    inv, _, _, _ = reviewed()
    scoped = desired().model_copy(update={"api_keys": (ApiKey(name="k", sha256=key_sha256("ak-example"),
                                                              deployments=("other",)),)})  # fmt: skip
    plan = make_plan(scoped, State(), inv, world()[1], SHAPE)
    assert gateway_tampering(plan.gateways, plan.changes, State(lineage=plan.state_lineage), inv) == []
    assert "k/chat" not in plan.gateways[0].maps["scopes.map"]
    forged = plan.model_copy(deep=True)
    forged.gateways[0].maps["scopes.map"]["k/chat"] = "1"
    assert gateway_tampering(forged.gateways, forged.changes, State(lineage=forged.state_lineage), inv) == [
        "gateway edge: the maps it sends to the running gateway (scopes.map) differ from what engine-ctl renders "
        "from the plan's ApiKey documents"
    ]


def test_a_key_added_to_the_files_and_maps_together_is_refused() -> None:
    inv, state, _, plan = reviewed()
    forged = plan.model_copy(deep=True)
    g = forged.gateways[0]
    g.maps["keys.map"][EVIL] = "k"
    g.files["keys.map"] = map_text(g.maps["keys.map"])
    assert set(gateway_tampering(forged.gateways, forged.changes, state, inv)) == {
        "gateway edge: keys.map differs from what engine-ctl renders from the plan's inputs",
        "gateway edge: the maps it sends to the running gateway (keys.map) differ from what engine-ctl renders from "
        "the plan's ApiKey documents",
    }


def test_a_key_document_added_to_a_plan_that_showed_no_gateway_change_is_refused() -> None:
    """Even with the recorded inputs edited to match (a key record, its maps and files), a plan that showed the
    gateway unchanged cannot carry a gateway change."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    plan = make_plan(desired(), state, inv, after, SHAPE)
    assert plan.gateways[0].action == ["no-op"]
    forged_inputs = desired().model_copy(update={"api_keys": (*desired().api_keys, ApiKey(name="evil", sha256=EVIL))})
    rendered = make_plan(forged_inputs, state, inv, after, SHAPE).gateways[0]
    forged = plan.model_copy(deep=True)
    forged.gateways[0] = rendered.model_copy(update={"action": ["no-op"], "reasons": []})
    assert gateway_tampering(forged.gateways, forged.changes, state, inv) == [
        "gateway edge: it changes the gateway, and the plan does not show it"
    ]


def test_a_recorded_key_the_rules_refuse_is_refused() -> None:
    inv, state, _, plan = reviewed()
    forged = plan.model_copy(deep=True)
    forged.gateways[0].keys = [ApiKey(name="k", sha256="ak-plaintext x\nnext 1")]
    problems = gateway_tampering(forged.gateways, forged.changes, state, inv)
    assert "ApiKey 'k': not a key document engine-ctl loads (name, sha256, scope, requests_per_minute)" in problems


def test_a_key_that_runs_only_in_memory_is_drift_named_without_its_hash() -> None:
    inv, state, after, _ = reviewed()
    running = {"keys.map": {key_sha256("ak-example"): "k", EVIL: "all"}, "expires.map": {},
               "scopes.map": {"k/chat": "1", "all/chat": "1", "@internal/chat": "1"}, "stopped.map": {}}  # fmt: skip
    facts = dict(after)
    facts["edge"] = after["edge"].model_copy(update={"gateway_maps": running})
    clean = dict(after)
    clean["edge"] = after["edge"].model_copy(update={"gateway_maps": {**running, "keys.map": {
        key_sha256("ak-example"): "k"}, "scopes.map": {"k/chat": "1", "@internal/chat": "1"}}})  # fmt: skip
    assert not make_plan(desired(), state, inv, clean, SHAPE).has_changes
    plan = make_plan(desired(), state, inv, facts, SHAPE)
    assert plan.has_changes and plan.gateways[0].action == ["update"]
    details = [d.detail for d in plan.drift]
    assert details == [
        "the running gateway on edge (keys.map, in memory) accepts a key that no ApiKey document gives, named 'all'",
        "the running gateway on edge (scopes.map, in memory) lets key 'all' call 'chat', which no ApiKey document "
        "allows",
    ]
    assert not any(EVIL[:8] in d for d in details)


def test_a_gateway_another_state_made_is_never_taken_over() -> None:
    """A probe (session 16): a second checkout with its own state and the same inventory planned "+ gateway" over
    the first state's running gateway, exit 0; its apply dropped every route and key of the first (401 to all),
    and its destroy removed that gateway. haproxy.cfg now names its state's lineage, and a plan that would create
    a gateway where another lineage's runs is refused (exit 1), naming both."""
    inv, facts = world()
    first = make_plan(desired(), State(), inv, facts, SHAPE)
    (g,) = first.gateways
    assert f"\n# lineage: {first.state_lineage}\n" in g.files["haproxy.cfg"]
    host = g.host
    theirs = {**facts, host: facts[host].model_copy(update={"gateway_files": {"haproxy.cfg": "a" * 64},
                                                            "gateway_lineage": first.state_lineage})}  # fmt: skip
    other = State()
    refused = make_plan(desired(), other, inv, theirs, SHAPE).refused
    said = f"the gateway on {host} is another state's (lineage {first.state_lineage}; this state's is {other.lineage})"
    assert refused and refused[0].startswith(said), refused
    mine = State(lineage=first.state_lineage)  # this state's own gateway, its record lost (a kill before recording)
    assert make_plan(desired(), mine, inv, theirs, SHAPE).refused == []
    legacy = {**facts, host: theirs[host].model_copy(update={"gateway_lineage": None})}  # made before lineages
    assert make_plan(desired(), other, inv, legacy, SHAPE).refused == []


def test_a_key_scoped_to_a_deployment_no_document_defines_is_warned_of() -> None:
    """A probe (session 16): `deployments: [nonexistent]` (a typo) validated and planned without a word, leaving
    its user a key that answers 404 everywhere. The plan now says so, once."""
    inv, facts = world()
    typo = ApiKey(name="typo", sha256=key_sha256("ak-typo"), deployments=("chta", "chat"))
    plan = make_plan(desired().model_copy(update={"api_keys": (typo,)}), State(), inv, facts, SHAPE)
    warned = [w for g in plan.gateways for w in g.warnings if "ApiKey" in w]
    assert warned == ["ApiKey typo names 'chta' in its deployments, which no document defines: requests with it for "
                      "that name are answered 404 model_not_found"]  # fmt: skip
