"""The plan as a value: what changes, per deployment and per replica, and why. Pure data.

Actions follow Terraform's vocabulary and its order of operations: ["create"], ["update"] (in place),
["create", "delete"] (a replacement that starts the new replica before the old one goes: a surge),
["delete", "create"] (destroy then create: stop-then-start, when there is no room for both), ["delete"],
["no-op"].
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from engine_ctl.core.fit.runspec import FitPlan, Placement
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.gateway import GatewayChange
from engine_ctl.core.plan.scaler import ScalerPlan
from engine_ctl.core.weights import WeightsFetch, human

FORMAT_VERSION = 2
"""2: typed spec/model/fit, and a surge recorded as ["create", "delete"] (1 recorded every replacement as
["delete", "create"] with its strategy beside it; savedplan.decode_plan reads both)."""
Strategy = Literal["surge", "stop-then-start"]


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    NO_OP = "no-op"


CREATE: tuple[Action, ...] = (Action.CREATE,)
UPDATE: tuple[Action, ...] = (Action.UPDATE,)
DELETE: tuple[Action, ...] = (Action.DELETE,)
NO_OP: tuple[Action, ...] = (Action.NO_OP,)
SURGE: tuple[Action, ...] = (Action.CREATE, Action.DELETE)
"""Create before destroy: the new replica serves before the old one stops."""
STOP_START: tuple[Action, ...] = (Action.DELETE, Action.CREATE)
"""Destroy then create: no room for both."""
REPLACE = (SURGE, STOP_START)
SYMBOLS = {CREATE: "+", UPDATE: "~", SURGE: "+/-", STOP_START: "-/+", DELETE: "-", NO_OP: " "}


def replace_actions(strategy: Strategy) -> list[Action]:
    return list(SURGE if strategy == "surge" else STOP_START)


class FieldChange(BaseModel):
    path: str
    old: Any = None
    new: Any = None


class Step(BaseModel):
    """What a deployment or a replica does: its actions, in order."""

    model_config = ConfigDict(extra="forbid")

    action: list[Action]

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(self.action)

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.actions]

    @property
    def replaces(self) -> bool:
        return self.actions in REPLACE


class MemberStep(BaseModel):
    """A worker's unit of a replica group, as the plan writes it on its host."""

    rank: int
    host: str
    unit: str
    port: int
    gpus: list[str] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list)
    unit_text: str | None = None
    unit_sha256: str = ""
    engine_version: str | None = None
    engine_sha256: str = ""
    """The binary the worker runs (argv[0]) as the facts found it on its host: recorded per member when applied."""


class ReplicaChange(Step):
    index: int
    host: str
    unit: str
    slot: str
    port: int
    gpus: list[str] = Field(default_factory=list)
    gpu_indexes: list[int] = Field(default_factory=list)
    revision: int
    argv: list[str] = Field(default_factory=list)
    unit_text: str | None = None
    unit_sha256: str | None = None
    engine_version: str | None = None
    engine_sha256: str = ""
    """The build the unit runs (argv[0]) as the facts found it: recorded per replica when applied."""
    old_unit: str | None = None
    old_host: str | None = None
    old_slot: str | None = None
    old_argv: list[str] | None = None
    strategy: Strategy | None = None
    reason: str = ""
    cleanup: bool = False
    """Removes what an interrupted apply left (a never-ready or second slot): done before anything else."""
    placement: Placement | None = None
    """Where the unit was rendered for (host, GPUs, port, threads): apply renders it again from this to prove a
    saved plan's unit is engine-ctl's own."""
    on_demand: bool = False
    """The slot is above `min`: apply installs its unit (file + daemon-reload) and never enables or starts it; a
    replacement is rolled only if the unit is active when apply comes to it (the scaler started it)."""
    active: bool = False
    """An on-demand unit that the facts found active (the scaler runs it): its gateway server stays enabled."""
    role: Literal["always-on", "on-demand", "held"] | None = None
    """An update that only changes the slot's role (min changed): always-on enables and starts the unit (a no-op
    for one already active), on-demand disables it and leaves it running. Nothing is rewritten or restarted.
    held: a replica of a deployment an operator stopped whose unit file drifted (edited, missing, drop-ins): its
    file is written again and it stays disabled and stopped (`engine-ctl start` then starts what engine-ctl wrote)."""
    members: list[MemberStep] = Field(default_factory=list)
    """A replica group's workers (spec.nodes > 1): started before this unit (the head), removed with it."""
    old_members: list[MemberStep] = Field(default_factory=list)
    """The workers of the group this step replaces or deletes: removed with its head."""

    @property
    def units(self) -> list[tuple[str, str]]:
        """(host, unit) of the replica's head and of each of its group's workers."""
        return [(self.host, self.unit), *((m.host, m.unit) for m in self.members)]

    @model_serializer(mode="wrap")
    def _without_group(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A replica on one machine is written as before groups existed (older plans read the same)."""
        data: dict[str, Any] = handler(self)
        for key in ("members", "old_members"):
            if not data.get(key):
                data.pop(key, None)
        return data


def _none_if_empty(value: Any) -> Any:
    """Format 1 wrote {} for a spec or model it did not have."""
    return None if value == {} else value


class Slot(BaseModel):
    """One place a replica of the deployment may run, as the plan leaves it (the scaling envelope)."""

    index: int
    host: str
    port: int
    gpu_indexes: list[int] = Field(default_factory=list)
    cpu_cores: int = 0
    memory_bytes: int = 0
    on_demand: bool = False
    shares: list[str] = Field(default_factory=list)
    """Other deployments' on-demand slots this one overlaps (`embed replica 1`): they never run at once."""


class DeploymentChange(Step):
    name: str
    deployment_id: str = ""
    """The deployment's ID: the recorded one, or the one its first apply records (deployment_id_for); its units'
    headers carry it, so that `import` keeps it."""
    reasons: list[str] = Field(default_factory=list)
    old_revision: int = 0
    revision: int = 0
    spec: Deployment | None = None
    model: Model | None = None
    spec_hash: str = ""
    fit: FitPlan | None = None
    startup_provenance: Literal["measured", "default"] = Field(default="default", exclude=True)
    whole_host: bool = Field(default=False, exclude_if=lambda v: not v)
    """The estimated start-up peak is above what any host can give: the first start runs alone on one host and
    sets aside all of it (the fit's memory_bytes is that host's)."""
    """Where the fit's start-up memory came from: `measured` (the revision's first start, recorded) or `default`
    (the estimate)."""
    field_changes: list[FieldChange] = Field(default_factory=list)
    strategy: Strategy | None = None
    warnings: list[str] = Field(default_factory=list)
    unmendable: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    """Of the warnings, what runs otherwise than the documents say and apply cannot mend (an engine or weights gone
    under a serving replica, a drop-in not engine-ctl's, a group worker its head cannot reach): a plan with no
    change then says so instead of "The hosts match the documents"."""
    pending_reason: str | None = None
    failed_reason: str | None = None
    waiting: dict[str, str] = Field(default_factory=dict)
    blocked: list[str] = Field(default_factory=list)
    """Replicas that could not be checked or changed (their host is unreachable or left the inventory): apply
    leaves them as they are, records them at the revision they run, and exits 1."""
    chosen: dict[str, int] = Field(default_factory=dict)
    """Fields the documents leave out that engine-ctl chose (gpus, parallel), each with the revision it was
    chosen at; kept until the documents change."""
    adopt: list[str] = Field(default_factory=list)
    """Units recorded pending that run (they became ready before an apply was interrupted): recorded serving."""
    replicas: list[ReplicaChange] = Field(default_factory=list)
    fetches: list[WeightsFetch] = Field(default_factory=list)
    """hf: weights each host with a new replica fetches first (engine_ctl.core.plan.fetching)."""
    operator: str | None = None
    """Held by an operator's verb (stop, park, delete): why nothing of it changes (engine_ctl.core.plan.operator)."""
    envelope: list[Slot] = Field(default_factory=list)
    """Every slot (0..max-1) placed, always on (below `min`) or on demand; empty when max equals min."""

    _empty = field_validator("spec", "model", mode="before")(_none_if_empty)

    @property
    def changed(self) -> bool:
        return self.actions != NO_OP

    @property
    def state_only(self) -> bool:
        """An update that changes only the state: nothing on the hosts changes."""
        return self.actions == UPDATE and not self.replicas


class Drift(BaseModel):
    host: str
    unit: str
    deployment: str | None = None
    kind: Literal[
        "edited", "missing", "stopped", "crash-looping", "gpu-held", "unmanaged", "weights-changed", "engine-changed",
        "start-failed", "interrupted", "misrouted", "drop-in", "disabled", "set-aside", "internal-key",
        "unanswered", "port-taken", "unloaded", "launch", "unstopped",
    ]  # fmt: skip
    """drop-in: drop-in files (`systemctl edit`, `set-property`) change an engine-ctl unit: apply removes them.
    disabled: a unit engine-ctl enables is not enabled (it would not start at boot): apply enables it.
    set-aside: a gateway keeps an always-on replica out of rotation (MAINT or DRAIN, by an admin command): apply
    puts it back.
    unanswered: a running gateway does not answer on its admin socket (the file removed): apply restarts it.
    unloaded: the running gateway is not what its files say though they are (its routes changed in memory, or a
    file changed after it loaded them): apply reloads it.
    launch: a replica's engine runs with arguments or settings its unit does not give (a wrapper at its
    executable's path, systemd's manager environment): apply restarts it, the manager's settings unset first.
    unstopped: a unit of a deployment an operator stopped runs again, started outside engine-ctl: apply stops it.
    port-taken: another process listens on the port of a replica whose engine does not run: its start fails until
    that process lets the port go (apply cannot free it; the plan names it).
    internal-key: a replica behind a gateway refuses the key the gateways send, or a host holds another one (its
    files, a gateway's running map): apply gives every place the key (core.internalkey), restarting such a replica.
    start-failed: an on-demand slot whose last start failed (systemd's start limit): no start runs until reset.
    interrupted: a gateway's files as an apply cut off (a kill) left them mid-install: engine-ctl's own, not a
    person's edit. misrouted: the running gateway sends a server's requests elsewhere than its configuration says
    (an address HAProxy kept from its state file): a reload puts it right."""
    detail: str
    diff: list[str] = Field(default_factory=list)
    """A hand-edited unit: the unified diff from the file on the host to engine-ctl's (secret values hidden)."""


class PlanContext(BaseModel):
    """Where the plan came from, for `apply PLANFILE`: the documents, the inventory, how to reopen the state,
    and the model paths probed on each host."""

    documents: list[str] = Field(default_factory=list)
    inventory: str | None = None
    state: str | None = None
    model_paths: dict[str, list[str]] = Field(default_factory=dict)
    env: str | None = None
    """The environment (--env, ENGINE_CTL_ENV) it was planned in: `apply PLANFILE` refuses it in another."""


class ForeignUnit(BaseModel):
    """A unit on a host of this inventory that another state (another lineage) made and manages."""

    model_config = ConfigDict(frozen=True)

    host: str
    unit: str
    deployment: str
    lineage: str
    revision: int
    port: int | None = None
    active_state: str | None = None
    gpus: tuple[str, ...] = ()
    cpu_cores: int = 0
    """The CPU cores its unit was given: placement counts them as taken, like its port and GPUs."""

    @property
    def holds(self) -> str:
        """What placement leaves to it: `port 8001, 2 CPU cores, GPUs GPU-a,GPU-b`."""
        held = [f"port {self.port}"] if self.port is not None else []
        held += [f"{self.cpu_cores} CPU core{'s' if self.cpu_cores != 1 else ''}"] if self.cpu_cores else []
        held += [f"GPU{'s' if len(self.gpus) != 1 else ''} {','.join(self.gpus)}"] if self.gpus else []
        return ", ".join(held)

    @property
    def line(self) -> str:
        state = f", {self.active_state}" if self.active_state else ""
        held = f"; placement leaves it {self.holds}" if self.holds else ""
        return (
            f"{self.host} {self.unit}: deployment {self.deployment} revision {self.revision}{state}, "
            f"owned by the state of lineage {self.lineage}{held}"
        )


class Prune(BaseModel):
    """An hf: checkout on a host that no deployment uses any more: apply deletes it once everything else
    succeeded (engine_ctl.core.plan.prune)."""

    model_config = ConfigDict(extra="forbid")

    host: str
    repo: str
    commit: str
    path: str
    freed_bytes: int

    @property
    def line(self) -> str:
        return f"{self.host}: {self.repo}@{self.commit[:12]} ({self.path}), frees up to {human(self.freed_bytes)}"


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    created_at: str = ""
    state_serial: int
    state_lineage: str
    host_fingerprints: dict[str, str] = Field(default_factory=dict)
    host_machines: dict[str, str] = Field(default_factory=dict)
    """Each host's /etc/machine-id as the plan found it: apply records it (HostRecord.machine_id)."""
    unreachable: dict[str, str] = Field(default_factory=dict)
    targets: list[str] = Field(default_factory=list)
    refresh_only: bool = False
    changes: list[DeploymentChange] = Field(default_factory=list)
    drift: list[Drift] = Field(default_factory=list)
    context: PlanContext = Field(default_factory=PlanContext)
    """Where the plan came from (documents, inventory, state file, model paths), for `apply PLANFILE`."""
    absent: list[str] = Field(default_factory=list)
    """Deployments this plan destroys because their documents are not among those passed (shown first)."""
    refused: list[str] = Field(default_factory=list)
    """Why the plan may not be applied at all (a deployment with prevent_destroy: true would be destroyed)."""
    owned_elsewhere: list[ForeignUnit] = Field(default_factory=list)
    """Units on these hosts that another state (another lineage) owns: listed, never drift, never touched."""
    gateways: list[GatewayChange] = Field(default_factory=list)
    """The gateway hosts (inventory role gateway): their HAProxy configuration, maps and unit."""
    scaler: ScalerPlan | None = None
    """The scaler (on the first gateway host by name) when a deployment scales; apply installs it."""
    prunes: list[Prune] = Field(default_factory=list, exclude_if=lambda v: not v)
    """Checkouts of hf: weights no deployment uses any more, deleted by apply after everything else succeeded."""

    def summary(self) -> dict[str, int]:
        """Deployments and gateways to add, change and destroy."""
        add = sum(1 for c in self.changes if c.actions == CREATE)
        change = sum(1 for c in self.changes if c.actions == UPDATE or c.replaces)
        destroy = sum(1 for c in self.changes if c.actions == DELETE)
        add += sum(1 for g in self.gateways if g.action == ["create"])
        change += sum(1 for g in self.gateways if g.action == ["update"])
        destroy += sum(1 for g in self.gateways if g.action == ["delete"])
        return {"add": add, "change": change, "destroy": destroy}

    @property
    def has_changes(self) -> bool:
        return (
            any(c.changed for c in self.changes)
            or any(g.changed for g in self.gateways)
            or (
                self.scaler is not None
                and bool(self.scaler.stopped or self.scaler.stale or self.scaler.unit_drift)
                and not self.refresh_only
            )
            or (self.refresh_only and bool(self.drift))
            or bool(self.prunes)
        )

    @property
    def problems(self) -> list[str]:
        """What makes plan and apply exit 1: deployments that cannot be served as asked (Failed) or not now
        (Pending: its documents are not served, and no apply can serve them yet), replicas that could not be
        checked, hosts that could not be reached. A deployment an operator holds is Pending here only when its
        documents changed since (what they ask cannot be served, and its start would roll them in)."""
        out = list(self.refused)
        out += [f"{c.name} is Failed: {c.failed_reason}" for c in self.changes if c.failed_reason]
        out += [f"{c.name} is Pending: {c.pending_reason}" for c in self.changes
                if c.pending_reason and (not c.operator or c.field_changes)]  # fmt: skip
        out += [f"{c.name}: {b}" for c in self.changes for b in c.blocked]
        out += [f"host {h} could not be checked: {why}" for h, why in sorted(self.unreachable.items())]
        return out

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


__all__ = [
    "FORMAT_VERSION", "Action", "DeploymentChange", "Drift", "FieldChange", "Plan", "PlanContext", "Prune",
    "ReplicaChange", "Slot", "Strategy",
]  # fmt: skip
