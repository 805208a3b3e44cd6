"""What changes an engine-ctl unit outside its file (engine_ctl.core.unitsetup): drop-ins (`systemctl edit`,
`systemctl set-property`) and a unit engine-ctl enables that is not enabled. Each is drift the plan shows and apply
sets right; the fleet test is tests/test_fleet_gateway_truth.py::test_drop_ins_and_a_disabled_unit_are_drift_...
Here: the pure rules, the planner on synthetic facts, and the removal's shell text run by a real sh on a copy of
the drop-in roots."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from engine_ctl.cli.views.plan import plan_text, replicas_line
from engine_ctl.core.fit.hostfacts import UnitFact
from engine_ctl.core.plan.gateway import _drift as gateway_drift
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.scaler import scaler_unit_drift
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import GATEWAY_UNIT
from engine_ctl.core.render.scaler import SCALER_UNIT
from engine_ctl.core.unitsetup import (
    DROP_IN_ROOTS,
    OUTRANKING_ROOTS,
    drop_in_dirs,
    outranking_files,
    own_drop_ins,
    shared_drop_ins,
)
from engine_ctl.shell.systemd import DROPPED, drop_ins_removal
from tests.fleetfacts import h100x8
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world

UNIT = "engine-ctl-chat-0a.service"


def test_the_drop_in_directories_of_a_unit_are_its_own_and_its_engine_ctl_prefixes() -> None:
    assert drop_in_dirs(UNIT) == ("engine-ctl-.service.d", "engine-ctl-chat-.service.d", "engine-ctl-chat-0a.service.d")
    assert drop_in_dirs(GATEWAY_UNIT) == ("engine-ctl-.service.d", "engine-ctl-gateway.service.d")
    assert drop_in_dirs("sshd.service") == ()


def test_only_drop_ins_written_for_engine_ctl_units_are_drift_in_every_unit_directory() -> None:
    """A drop-in directory named for an engine-ctl unit is drift wherever systemd reads it: /etc and /run, and the
    packages' directories too (a probe, session 16: CPUQuota=2% and an Environment= from /usr/lib/systemd/system/
    <unit>.d, beside "No changes"). A directory every service reads (a container's service.d) is not engine-ctl's."""
    paths = [
        f"/etc/systemd/system/{UNIT}.d/override.conf",  # systemctl edit
        f"/run/systemd/system.control/{UNIT}.d/50-CPUWeight.conf",  # systemctl set-property --runtime
        "/etc/systemd/system/engine-ctl-.service.d/all.conf",  # every engine-ctl unit
        f"/usr/lib/systemd/system/{UNIT}.d/vendor.conf",  # a package's directory
        f"/usr/local/lib/systemd/system/{UNIT}.d/local.conf",
        "/run/systemd/transient/engine-ctl-chat-.service.d/t.conf",
        "/run/systemd/system/service.d/zzz-lxc-service.conf",  # every service (a container's)
        "/etc/systemd/system/engine-.service.d/other.conf",  # a prefix outside engine-ctl's names
    ]
    assert own_drop_ins(UNIT, paths) == tuple(sorted(paths[:6]))


def test_a_drop_in_shared_with_other_units_is_a_warning_beside_no_changes_never_passed_over() -> None:
    """`service.d/` and `engine-.service.d/` change engine-ctl's units too, and every other service (or `engine-…`
    unit) alike: apply may not remove them, but the plan names each for the replica it changes (a probe, session
    16: `Nice=19` and an Environment= there beside a bare "No changes")."""
    paths = [
        "/etc/systemd/system/service.d/50-probe.conf",
        f"/etc/systemd/system/{UNIT}.d/override.conf",
        "/etc/systemd/system/engine-.service.d/nice.conf",
        "/run/systemd/system/service.d/zzz-lxc-service.conf",
    ]  # fmt: skip  (a container's: every host has it)
    assert shared_drop_ins(UNIT, paths) == (paths[2], paths[0])
    h = h100x8()
    state, facts = applied(plan_for("gpus: 1", State(), h), State(), {h.host: h})
    (unit,) = facts[h.host].units
    now = facts[h.host].model_copy(update={"units": (unit.model_copy(update={"shared_drop_ins": (paths[0],)}),)})
    plan = make_plan(desired("gpus: 1"), state, world(now)[0], {h.host: now}, {"m": SHAPE})
    assert not plan.has_changes and not plan.drift
    assert (
        f"replica 0 on {h.host}: {paths[0]} changes {unit.name} though it is no drop-in of engine-ctl's (it "
        "changes other units alike): apply leaves it; remove it unless it is meant" in plan.changes[0].warnings
    )
    text = plan_text(plan)  # never "The hosts match the documents" beside it
    assert "No changes apply can make; but not everything runs as the documents say, and apply cannot mend it" in text
    assert "The hosts match the documents" not in text and not plan.has_changes


def test_a_unit_file_that_outranks_engine_ctls_is_drift_named_for_what_it_is() -> None:
    """A file named as the unit in a directory systemd reads before /etc/systemd/system (system.control, transient,
    generator.early) is the unit systemd loads (its FragmentPath): engine-ctl's file is ignored. Before, plan said
    "No changes" while such a copy ran the engine without its key (a probe, session 15)."""
    for root in OUTRANKING_ROOTS:
        assert outranking_files(UNIT, f"{root}/{UNIT}") == (f"{root}/{UNIT}",)
    for path in (f"/etc/systemd/system/{UNIT}", f"/run/systemd/system/{UNIT}", f"/usr/lib/systemd/system/{UNIT}",
                 "/etc/systemd/system.control/other.service", "", None):  # fmt: skip
        assert outranking_files(UNIT, path) == (), path
    assert outranking_files("sshd.service", "/etc/systemd/system.control/sshd.service") == ()
    h = h100x8()
    state, facts = applied(plan_for("gpus: 1", State(), h), State(), {h.host: h})
    (unit,) = facts[h.host].units
    path = f"/etc/systemd/system.control/{unit.name}"
    now = facts[h.host].model_copy(update={"units": (unit.model_copy(update={"drop_ins": (path,)}),)})
    plan = make_plan(desired("gpus: 1"), state, world(now)[0], {h.host: now}, {"m": SHAPE})
    (d,) = plan.drift
    assert (d.kind, d.detail) == ("drop-in", f"{path} replaces {unit.name} on {h.host} (systemd loads it, not "
                                  "engine-ctl's file in /etc/systemd/system): apply removes it")  # fmt: skip
    assert plan.changes[0].replicas[0].action == ["update"] and plan.has_changes


def test_a_replicas_drop_in_is_drift_and_an_always_on_one_not_enabled_is_too() -> None:
    h = h100x8()
    state, facts = applied(plan_for("gpus: 1", State(), h), State(), {h.host: h})
    (unit,) = facts[h.host].units
    for change, kind in (({"drop_ins": (f"/etc/systemd/system/{unit.name}.d/override.conf",)}, "drop-in"),
                         ({"unit_file_state": "disabled"}, "disabled"),
                         ({"unit_file_state": "enabled-runtime"}, "disabled")):  # fmt: skip
        now = facts[h.host].model_copy(update={"units": (unit.model_copy(update=change),)})
        plan = make_plan(desired("gpus: 1"), state, world(now)[0], {h.host: now}, {"m": SHAPE})
        assert [d.kind for d in plan.drift] == [kind], plan.drift
        assert plan.has_changes
        (rc,) = plan.changes[0].replicas
        # a unit that is only not enabled is enabled (started only if it does not run): nothing restarts
        assert rc.role == ("always-on" if kind == "disabled" else None)
        assert replicas_line(plan) == "Replicas: 1 to repair.", "enabled again is a repair, not a start"
    enabled = facts[h.host].model_copy(update={"units": (unit.model_copy(update={"unit_file_state": "enabled"}),)})
    plan = make_plan(desired("gpus: 1"), state, world(enabled)[0], {h.host: enabled}, {"m": SHAPE})
    assert not plan.drift and not plan.has_changes


def test_an_on_demand_replica_is_disabled_by_design() -> None:
    h = h100x8()
    spec = "gpus: 1, replicas: {min: 0, max: 1}"
    state, facts = applied(plan_for(spec, State(), h), State(), {h.host: h})
    (unit,) = facts[h.host].units
    now = facts[h.host].model_copy(update={"units": (unit.model_copy(update={"unit_file_state": "disabled"}),)})
    plan = make_plan(desired(spec), state, world(now)[0], {h.host: now}, {"m": SHAPE})
    assert not [d for d in plan.drift if d.kind == "disabled"]


def test_the_gateways_and_the_scalers_units_with_drop_ins_or_not_enabled_are_drift() -> None:
    unit = UnitFact(name=GATEWAY_UNIT, sha256="a" * 64, active_state="active", unit_file_state="enabled")
    h = h100x8()
    clean = h.model_copy(update={"units": (unit,), "gateway_maps": {}})  # it answers on its admin socket
    assert gateway_drift("g1", {}, "a" * 64, clean) == []
    edited = unit.model_copy(update={"drop_ins": ("/etc/systemd/system/engine-ctl-gateway.service.d/x.conf",),
                                     "unit_file_state": "disabled"})  # fmt: skip
    found = gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (edited,), "gateway_maps": {}}))
    assert [d["kind"] for d in found] == ["drop-in", "disabled"]
    (deaf,) = gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (unit,), "gateway_maps": None}))
    assert deaf == {"host": "g1", "kind": "unanswered", "detail": "the gateway on g1 runs but does not answer on its "
                    "admin socket (/run/engine-ctl-gateway/admin.sock): its keys in memory cannot be checked, and no "
                    "roll can drain a replica through it; apply restarts it"}  # fmt: skip
    stopped = unit.model_copy(update={"active_state": "inactive"})
    assert [d["kind"] for d in gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (stopped,)}))] == [
        "stopped"
    ], "a gateway that does not run is stopped, not deaf"
    assert "engine-ctl-gateway.service.d/x.conf" in found[0]["detail"] and "apply enables it" in found[1]["detail"]

    scaler = UnitFact(name=SCALER_UNIT, sha256="b" * 64, active_state="active", unit_file_state="enabled")
    assert scaler_unit_drift("g1", h.model_copy(update={"units": (scaler,)})) is None
    off = scaler.model_copy(update={"unit_file_state": "disabled"})
    said = scaler_unit_drift("g1", h.model_copy(update={"units": (off,)}))
    assert said is not None and said.startswith(f"{SCALER_UNIT} is disabled on g1")
    # its file or its program edited (a probe, session 16: ExecStart=/bin/sleep infinity; a decide() that never
    # acts): the header's content-sha256 and program-sha256 say what engine-ctl wrote
    from engine_ctl.core.render.scaler import render_unit

    text = render_unit("g1", "c" * 64)
    body = hashlib.sha256(re.sub(r"(?m)^# content-sha256: [0-9a-f]{64}$", "# content-sha256: ", text).encode())
    written = scaler.model_copy(update={"text": text, "body_sha256": body.hexdigest()})
    same = h.model_copy(update={"units": (written,), "scaler_program_sha256": "c" * 64})
    assert scaler_unit_drift("g1", same) is None
    edited = written.model_copy(update={"body_sha256": "e" * 64})
    said = scaler_unit_drift("g1", h.model_copy(update={"units": (edited,)}))
    assert said == (f"{SCALER_UNIT} edited by hand on g1 (its content-sha256 is not its text's): apply writes it again "
                    "and restarts it")  # fmt: skip
    said = scaler_unit_drift("g1", h.model_copy(update={"units": (written,), "scaler_program_sha256": "d" * 64}))
    assert said is not None and said.startswith(
        "the scaler's program on g1 (/etc/engine-ctl/scaler/scaler.py) is not the one its unit was written for "
        "(sha256 dddddddddddd… ≠ cccc"
    )
    frozen = scaler.model_copy(update={"process_state": "T", "main_pid": 77})  # systemctl kill -s SIGSTOP
    said = scaler_unit_drift("g1", h.model_copy(update={"units": (frozen,)}))
    assert said == (f"{SCALER_UNIT} runs on g1 but its process (PID 77) is stopped by a signal (SIGSTOP): it wakes "
                    "no deployment and scales none; apply restarts it")  # fmt: skip


def test_the_removal_deletes_what_the_plan_reports_and_nothing_else(tmp_path: Path) -> None:
    """The shell text, run by a real sh with the roots moved under tmp_path (the text names absolute paths)."""
    script = drop_ins_removal(UNIT).replace("systemctl daemon-reload", "echo reloaded")
    for root in sorted({*DROP_IN_ROOTS, *OUTRANKING_ROOTS}, key=len, reverse=True):
        script = script.replace(f" {root}/", f" {tmp_path}{root}/").replace(f"'{root}/", f"'{tmp_path}{root}/")
    mine = [tmp_path / "etc/systemd/system" / f"{UNIT}.d" / "override.conf",
            tmp_path / "run/systemd/system.control" / f"{UNIT}.d" / "50-CPUWeight.conf",
            tmp_path / "etc/systemd/system/engine-ctl-.service.d/all.conf"]  # fmt: skip
    outranking = [tmp_path / "etc/systemd/system.control" / UNIT, tmp_path / "run/systemd/transient" / UNIT]
    others = [tmp_path / "etc/systemd/system/engine-ctl-other-0a.service.d/keep.conf",
              tmp_path / "run/systemd/system/service.d/zzz.conf",
              tmp_path / "etc/systemd/system/engine-.service.d/keep.conf"]  # fmt: skip
    others.append(tmp_path / "etc/systemd/system" / UNIT)  # engine-ctl's own file: never removed here
    for path in mine + others + outranking:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[Service]\n")
    ran = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout.splitlines() == [DROPPED, "reloaded"], ran
    assert not any(p.parent.exists() for p in mine) and all(p.exists() for p in others)
    assert not any(p.exists() for p in outranking)
    again = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and again.stdout == ""  # nothing there: nothing said, no reload


def test_the_scalers_key_authorized_without_its_forced_command_is_drift(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A probe (session 16): the `restrict,command="…"` of the scalers' key on a replica host removed, and its
    forced command edited: the key (kept on the gateway host) was a root shell there, beside "No changes". The
    probe reads the host's authorized_keys lines of a scaler's key (not the key) and the forced command's sha256,
    and the plan says what apply writes again."""
    from engine_ctl.core.plan.scaler import authorization_drift
    from engine_ctl.shell.gather import scaler_authorization
    from engine_ctl.shell.remote import facts_probe
    from engine_ctl.shell.scaler.apply import authorized_line

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    keys = tmp_path / ".ssh" / "authorized_keys"
    wanted = scaler_authorization()
    keys.write_text("ssh-ed25519 AAAAother admin@laptop\n" + authorized_line("ssh-ed25519 AAAAscaler") + "\n")
    monkeypatch.setattr(facts_probe, "SCALER_COMMAND", str(tmp_path / "scaler-command"))
    assert facts_probe.scaler_authorization(wanted) == {"loose": [], "command": "missing"}
    (tmp_path / "scaler-command").write_text("print('not engine-ctl')\n")
    assert facts_probe.scaler_authorization(wanted) == {"loose": [], "command": "changed"}
    keys.write_text("ssh-ed25519 AAAAscaler engine-ctl-scaler@g1\n")  # the options taken away
    found = facts_probe.scaler_authorization(wanted)
    assert found == {"loose": [""], "command": "changed"}, found  # no options (the key itself is never said)
    h = h100x8()
    said = authorization_drift({"r1": h.model_copy(update={"scaler_authorization": found})})
    assert said == [
        "the scalers' key is authorized on r1 without its forced command (authorized_keys: ''): it opens a shell "
        "there; apply writes its line again",
        "the scalers' forced command on r1 (/usr/local/lib/engine-ctl/scaler-command) is changed: apply writes it "
        "again",
    ]
    assert authorization_drift({"r1": h}) == []
