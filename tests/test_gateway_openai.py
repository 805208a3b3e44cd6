"""The gateway as the official `openai` client expects it, on the real HAProxy 2.6 of this machine with the
rendered configuration and Lua (the loopback gateway of test_gateway_loopback.py): the model list per key,
GET /v1/models/{id} (200 with the model object, 404 model_not_found), and a stopped deployment's 409 in the
OpenAI error envelope, keeping the seed's code and message, naming a command that works."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from engine_ctl.core.render.gateway import created_of
from engine_ctl.shell.gateway.runtime import set_maps
from tests.test_gateway_loopback import CREATED, KEY_ALL, KEY_CHAT, gateway  # noqa: F401 (the fixture)

Gateway = dict  # type: ignore[type-arg]
STOPPED_ID = "01M3R7A6YJW402N962HH17A66W"


def client(gateway: Gateway, key: str) -> openai.OpenAI:  # noqa: F811
    return openai.OpenAI(base_url=str(gateway["base"]) + "/v1", api_key=key, max_retries=0, timeout=20)


def test_models_list_and_retrieve_as_the_client_expects(gateway: Gateway) -> None:  # noqa: F811
    every = client(gateway, KEY_ALL)
    assert [m.id for m in every.models.list()] == ["chat", "embed"]
    model = every.models.retrieve("chat")
    assert (model.id, model.object, model.owned_by) == ("chat", "model", "engine-ctl")
    assert {m.id: m.created for m in every.models.list()} == CREATED, "created: the deployment's creation time"
    assert model.created == CREATED["chat"]
    scoped = client(gateway, KEY_CHAT)
    assert [m.id for m in scoped.models.list()] == ["chat"]
    for name in ("embed", "nope", "chat%00x", "Chat"):  # out of scope, unknown, not a deployment's name
        with pytest.raises(openai.NotFoundError) as missing:
            scoped.models.retrieve(name)
        assert missing.value.code == "model_not_found", missing.value.body
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "ak-wrong").models.retrieve("chat")


def test_created_is_the_time_a_deployment_id_records() -> None:
    from ulid import ULID

    for when in (1764806400.0, 1764806400.999, 2000000000.5):
        assert created_of(str(ULID.from_timestamp(when))) == int(when)
    assert created_of("") == 0 and created_of("not-a-ulid") == 0


def test_a_stopped_deployment_is_409_in_the_openai_envelope_with_the_seeds_words(gateway: Gateway) -> None:  # noqa: F811
    rendered = gateway["rendered"]
    maps = {name: dict(entries) for name, entries in rendered.maps.items()}  # type: ignore[attr-defined]
    maps["stopped.map"] = {"chat": STOPPED_ID}  # what engine-ctl stop sets on the running gateway
    set_maps(gateway["transport"], maps, str(Path(gateway["dir"]) / "admin.sock"))  # type: ignore[arg-type]
    with pytest.raises(openai.ConflictError) as stopped:
        client(gateway, KEY_ALL).chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    said = (f"deployment {STOPPED_ID} was stopped by an operator; inference does not start it; start it with "
            f"`engine-ctl start deployment {STOPPED_ID}`")  # fmt: skip
    assert stopped.value.status_code == 409
    assert stopped.value.code == "deployment_stopped" and stopped.value.message.endswith(said)
    body = stopped.value.response.json()
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"] == said
    assert (body["code"], body["message"]) == ("deployment_stopped", said)  # the seed's own shape, kept
