"""Requests a minute per API key (issue 31: "a separate limit once a key is known"), on the real HAProxy 2.6 of
this machine with the rendered configuration and Lua: a limited key is answered 429 `rate_limit_exceeded` in
OpenAI's error shape with a Retry-After that, honoured, lets the next request through, while another key is not
limited; the limit comes from the ApiKey document or the inventory, and changes at run time with no reload.
The fleet test (test_fleet_hostile.py) shows the same through the gateway of a fleet host."""

from __future__ import annotations

import time

import pytest

from engine_ctl.core.documents.apikey import api_key_from
from engine_ctl.core.documents.inventory import inventory_from
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import key_maps
from engine_ctl.shell.gateway.runtime import set_maps
from tests.test_gateway_loopback import KEY_ALL, KEY_CHAT, call, chat, gateway  # noqa: F401 (the fixture)

Gateway = dict  # type: ignore[type-arg]


def limit(gateway: Gateway, limits: dict[str, str]) -> None:  # noqa: F811
    """Set limits.map in the running gateway over its stats socket (as apply does)."""
    set_maps(gateway["transport"], {"limits.map": limits}, str(gateway["dir"] / "admin.sock"))


def test_a_limited_key_gets_429_with_retry_after_and_another_key_still_passes(gateway: Gateway) -> None:  # noqa: F811
    base = str(gateway["base"])
    status, headers, _ = call(base, "/v1/chat/completions", KEY_CHAT, chat("chat"))
    assert status == 200 and "x-ratelimit-limit-requests" not in headers, "no limit until one is set"
    limit(gateway, {"chatonly": "3"})
    seen = []
    for _ in range(3):
        status, headers, _ = call(base, "/v1/chat/completions", KEY_CHAT, chat("chat"))
        assert status == 200
        seen.append(headers["x-ratelimit-remaining-requests"])
        assert headers["x-ratelimit-limit-requests"] == "3"
    assert seen == ["2", "1", "0"], seen
    status, headers, body = call(base, "/v1/chat/completions", KEY_CHAT, chat("chat"))
    assert status == 429, (status, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"
    assert "API key `chatonly` on requests per min (RPM): Limit 3. Please try again in " in body["error"]["message"]
    assert headers["content-type"] == "application/json"
    assert 19 <= int(headers["retry-after"]) <= 20, headers  # 3 a minute: one token every 20 s
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert call(base, "/v1/models", KEY_CHAT)[0] == 429, "the gateway's own answers count too"
    # another key is not limited; nor is the limited key's answer someone else's
    for _ in range(10):
        status, headers, _ = call(base, "/v1/chat/completions", KEY_ALL, chat("chat"))
        assert status == 200 and "x-ratelimit-limit-requests" not in headers


def test_retry_after_honoured_lets_the_next_request_through(gateway: Gateway) -> None:  # noqa: F811
    base = str(gateway["base"])
    limit(gateway, {"all": "120"})  # two tokens a second
    passed = 0
    while (answer := call(base, "/v1/models", KEY_ALL))[0] == 200 and passed < 1000:
        passed += 1  # (the bucket refills as they go: a loaded machine lets a few more through)
    status, headers, body = answer
    assert passed >= 120, "the whole bucket first"
    assert status == 429 and headers["retry-after"] == "1", (status, headers, body)
    time.sleep(int(headers["retry-after"]))
    status, headers, _ = call(base, "/v1/chat/completions", KEY_ALL, chat("chat"))
    assert status == 200, "waiting Retry-After seconds is enough"
    # the limit changed at run time: raised, the key passes at once; removed, no header
    limit(gateway, {})
    status, headers, _ = call(base, "/v1/models", KEY_ALL)
    assert status == 200 and "x-ratelimit-limit-requests" not in headers


def test_the_limit_comes_from_the_key_document_else_the_inventory() -> None:
    keys = [ApiKey(name="a", sha256="a" * 64, requests_per_minute=5), ApiKey(name="b", sha256="b" * 64)]
    assert key_maps(keys, ["chat"])["limits.map"] == {"a": "5"}
    assert key_maps(keys, ["chat"], 100)["limits.map"] == {"a": "5", "b": "100"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("kind: ApiKey\nmetadata: {name: k}\nspec:\n  sha256: " + "a" * 64 + "\n  requests_per_minute: 0\n", ":5:"),
        ("kind: ApiKey\nmetadata: {name: k}\nspec:\n  sha256: " + "a" * 64 + "\n  requests_per_minute: many\n", ":5:"),
    ],
)
def test_a_bad_limit_in_a_key_document_is_located(text: str, where: str) -> None:
    (doc,), _ = parse_text(text, "keys.yaml")
    key, problems = api_key_from(doc)
    said = [p.render() for p in problems]
    assert key is None
    assert any("requests_per_minute" in p and "keys.yaml" + where in p for p in said), said


def test_a_bad_limit_in_the_inventory_is_located() -> None:
    text = "hosts:\n  - {name: a, address: 10.0.0.1}\ngateway:\n  requests_per_minute: -1\n"
    (doc,), _ = parse_text(text, "hosts.yaml")
    _, problems = inventory_from(doc)
    said = [p.render() for p in problems]
    assert any("gateway.requests_per_minute" in p and "hosts.yaml:4:" in p for p in said), said


def test_a_limit_raised_or_removed_in_a_saved_plan_is_refused_and_one_set_in_memory_only_is_drift() -> None:
    """Issue 31 point 1 for limits.map: a saved plan's limits are rendered again from its ApiKey documents, and
    the running limits are compared with the documents' at every plan."""
    from engine_ctl.core.documents.apikey import key_sha256
    from engine_ctl.core.plan.gateway import gateway_tampering
    from engine_ctl.core.plan.planner import make_plan
    from engine_ctl.core.record.model import State
    from tests.test_gateway_core import SHAPE, applied, desired, world

    inv, facts = world()
    limited = desired().model_copy(update={"api_keys": (ApiKey(name="k", sha256=key_sha256("ak-example"),
                                                                requests_per_minute=10),)})  # fmt: skip
    state, after = applied(make_plan(limited, State(), inv, facts, SHAPE), facts)
    plan = make_plan(limited, state, inv, after, SHAPE)
    assert plan.gateways[0].maps["limits.map"] == {"k": "10"} and not plan.has_changes
    for forged_limits in ({"k": "1000000"}, {}):
        forged = plan.model_copy(deep=True)
        forged.gateways[0].maps["limits.map"] = forged_limits
        assert gateway_tampering(forged.gateways, forged.changes, state, inv) == [
            "gateway edge: the maps it sends to the running gateway (limits.map) differ from what engine-ctl renders "
            "from the plan's ApiKey documents"
        ]
    forged = plan.model_copy(deep=True)
    forged.gateways[0].keys = [k.model_copy(update={"requests_per_minute": 0}) for k in forged.gateways[0].keys]
    assert any("requests_per_minute" in p for p in gateway_tampering(forged.gateways, forged.changes, state, inv))
    running = {**plan.gateways[0].maps, "limits.map": {}}  # the limit dropped over the stats socket
    drifted = dict(after)
    drifted["edge"] = after["edge"].model_copy(update={"gateway_maps": running})
    again = make_plan(limited, state, inv, drifted, SHAPE)
    assert again.has_changes and [d.detail for d in again.drift] == [
        "the running gateway on edge (limits.map, in memory) does not limit key 'k' to its 10 requests a minute"
    ]
