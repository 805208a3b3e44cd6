"""The plan names what it changes in the gateway's keys (a probe, session 16: removing ApiKey `lim` or rotating
`one` planned as only `changes: keys.map, limits.map, scopes.map; keys: 3`, so a reviewer of the plan could not see
that a key was revoked or rotated). Said by name, never by hash; from the running gateway's maps to the
documents'."""

from __future__ import annotations

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.keychanges import key_changes
from engine_ctl.core.render.gateway import key_maps

DEPLOYMENTS = ["ta", "tb"]


def maps(*keys: ApiKey) -> dict[str, dict[str, str]]:
    return key_maps(keys, DEPLOYMENTS)


ALL = ApiKey(name="all", sha256=key_sha256("ak-all"))
ONE = ApiKey(name="one", sha256=key_sha256("ak-one"), deployments=("tb",), expires=1814313600)
LIM = ApiKey(name="lim", sha256=key_sha256("ak-lim"), deployments=("ta",), requests_per_minute=30)
EVERY_MAP = ("keys.map", "scopes.map", "limits.map", "expires.map")


def test_keys_added_removed_and_rotated_are_named_never_hashed() -> None:
    rotated = ONE.model_copy(update={"sha256": key_sha256("ak-one-2")})
    said = key_changes(maps(ALL, ONE, LIM), maps(ALL, rotated, ApiKey(name="new", sha256=key_sha256("x"))), EVERY_MAP)
    assert said == [
        "key 'new' added",
        "key 'lim' removed: requests with it are refused (401)",
        "key 'one' rotated: its old value is refused, its new one accepted",
    ]
    assert not any(k.sha256[:8] in " ".join(said) for k in (ALL, ONE, LIM, rotated))


def test_a_keys_scope_limit_and_expiry_changes_are_said() -> None:
    wider = ONE.model_copy(update={"deployments": ("ta", "tb"), "expires": None})
    slower = LIM.model_copy(update={"requests_per_minute": 60, "deployments": None})
    said = key_changes(maps(ONE, LIM), maps(wider, slower), EVERY_MAP)
    assert said == [
        "key 'lim' may now call 'tb'",
        "key 'one' may now call 'ta'",
        "key 'lim' limit: 30 → 60 requests a minute",
        "key 'one' expiry: 2027-06-30 00:00:00 UTC → never",
    ]
    assert key_changes(maps(ONE, LIM), maps(wider, slower), ()) == [], "no map rewritten: nothing changes"
    assert key_changes(None, maps(ONE), EVERY_MAP) == [], "the running gateway not read: nothing said"
