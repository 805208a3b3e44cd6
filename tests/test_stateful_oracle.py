"""The stateful fleet test's oracle (tests/statefulfleet.py, tests/fleettruth.py), on values: it must see each
difference it claims to see, and none where the hosts serve the documents, or the fleet test proves nothing."""

from __future__ import annotations

from tests.fleettruth import Poller, Truth, Unit
from tests.statefulfleet import MODELS_DIR, Dep, Model, differences

GOOD = "a" * 64


def unit(dep: str, index: int, host: str, ctx: int = 1024, model: str = "tiny.gguf", active: str = "active",
         args: tuple[str, ...] = ()) -> Unit:  # fmt: skip
    argv = ["llama-server", "--model", f"{MODELS_DIR}/tiny/{model}", "--ctx-size", str(ctx), "--parallel", "2",
            *args, "--host", "h", "--port", "8000"]  # fmt: skip
    running = argv if active == "active" else []
    return Unit(host, f"engine-ctl-{dep}-{index}a.service", dep, index, "a", argv, running, active,
                200 if active == "active" else None, "enabled")  # fmt: skip


def truth(*units: Unit, gateway: str = "active", scaler: str | None = "active") -> Truth:
    t = Truth(units=list(units), gateway={"g": gateway}, scaler={"g": scaler})
    for u in units:
        t.sha256[(u.host, f"{MODELS_DIR}/tiny/tiny.gguf")] = GOOD
    return t


def served() -> tuple[Model, Truth]:
    return Model(), truth(unit("sa", 0, "g"), unit("sa", 1, "h2"), unit("sb", 0, "h3", active="inactive"))


def test_a_fleet_that_serves_the_documents_has_no_difference() -> None:
    model, t = served()
    assert differences(model, t, GOOD, {}) == []


def test_each_kind_of_difference_is_seen() -> None:
    model, t = served()
    model.deps["sa"] = Dep("sa", context=768, replicas=2)
    assert any("context_length is 768" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    model.deps["sa"] = Dep("sa", replicas=2, args=("--temp", "0.5"))
    assert any("engine args" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    model.model_file = "corrupt.gguf"
    assert any("not usable weights" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    t.units[1] = unit("sa", 1, "h2", active="inactive")  # stopped by hand
    assert any("replicas [1] do not serve" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    model.deps["sa"] = Dep("sa", replicas=1)
    assert any("replicas [1] still run" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    model.deps["sa"] = Dep("sa", replicas=2, verb="stopped")
    assert any("though sa is stopped" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    t.gateway = {"g": "failed"}
    assert differences(model, t, GOOD, {}) == ["the gateway on g is failed"]
    model, t = served()
    t.sha256[("g", f"{MODELS_DIR}/tiny/tiny.gguf")] = "b" * 64
    assert any("not the weights it should be" in d for d in differences(model, t, GOOD, {}))
    model, t = served()
    model.cut = "h2"
    assert any("cut off" in d for d in differences(model, t, GOOD, {"sa": {"g", "h2"}}))


def test_two_replicas_down_together_is_seen_and_a_sample_lag_is_not() -> None:
    p = Poller.__new__(Poller)
    a0, a1 = "engine-ctl-sa-0a.service", "engine-ctl-sa-1a.service"
    # a roll one at a time, with host h2's samples lagging h1's by 0.2 s: never two down together
    p.samples = [(t + 0.0, "h1", [] if 2 <= t < 4 else [a0]) for t in range(0, 10)]
    p.samples += [(t + 0.2, "h2", [] if 5 <= t < 7 else [a1]) for t in range(0, 10)]
    assert p.down_together("sa", {0, 1}, {"h1", "h2"}) == []
    # both down from 3 s to 6 s
    p.samples = [(t / 2, "h1", [] if 6 <= t < 12 else [a0]) for t in range(0, 20)]
    p.samples += [(t / 2 + 0.1, "h2", [] if 6 <= t < 12 else [a1]) for t in range(0, 20)]
    spans = p.down_together("sa", {0, 1}, {"h1", "h2"})
    assert len(spans) == 1 and spans[0][2] == {0, 1} and spans[0][1] - spans[0][0] >= 2
