"""The recorded state: versioned JSON with serial and lineage (Terraform's discipline). Values only.

A state is input like any document: whoever can write it (a shared PostgreSQL state, say) must not be able to
make engine-ctl stop, overwrite or delete anything it did not create. So every name, path and port read back
is held to the rules engine-ctl itself names things by (engine_ctl.core.names, the inventory's host names),
and a record that breaks them is refused, with its field path, before anything acts on it."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from engine_ctl.core.documents.inventory import HOST_NAME
from engine_ctl.core.fit.runspec import FitPlan, without_empty_group
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.names import (
    MAX_REPLICA_INDEX,
    NAME_MESSAGE,
    UNIT_FORM,
    deployment_name_ok,
    parse_unit_name,
    unit_name,
)

FORMAT_VERSION = 1
ReplicaStatus = Literal["pending", "serving", "stopped", "failed", "removing", "standby", "starting"]
"""standby: an on-demand replica's unit, installed by apply and not started by it (the scaler starts it).
starting: `engine-ctl start deployment` (without --wait) started its unit; it serves once it answers (status asks
its health; the next apply proves it and records it serving)."""
ERRORS_SHOWN = 5
MAX_GPU_INDEX = 1023
GPU_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""What the GPU tools report: GPU-<hex>… (NVIDIA, AMD's unique id), amd-gpu-<n> or card<n> when there is none."""
SHA256 = re.compile(r"[0-9a-f]{64}")


class StateError(Exception):
    """The state cannot be used as it is; the message says why and what to do."""


def refuse(message: str, *tail: str | int) -> PydanticCustomError:
    """A validation error whose message is ours; `tail` continues the field path below the validated field."""
    return PydanticCustomError("state_value", "{message}", {"message": message, "tail": tail})


def _deployment_name(name: str) -> str:
    if not deployment_name_ok(name):
        raise refuse(f"{name!r} is not a deployment name ({NAME_MESSAGE})")
    return name


def _host_name(name: str) -> str:
    if not HOST_NAME.fullmatch(name):
        raise refuse(f"{name!r} is not a host name (letters, digits, '.', '_' and '-', at most 63 characters)")
    return name


def _unit(name: str) -> str:
    if parse_unit_name(name) is None:
        raise refuse(f"{name!r} is not a unit engine-ctl names ({UNIT_FORM})")
    return name


def _port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise refuse(f"{port}: a port is between 1 and 65535")
    return port


def _replica_index(index: int) -> int:
    if not 0 <= index <= MAX_REPLICA_INDEX:
        raise refuse(f"{index}: a replica index is between 0 and {MAX_REPLICA_INDEX}")
    return index


def _gpu_uuid(value: str) -> str:
    if not GPU_UUID.fullmatch(value):
        raise refuse(f"{value!r} is not a GPU UUID (letters, digits, '-', '_', '.' and ':', at most 128)")
    return value


def _gpu_index(index: int) -> int:
    if not 0 <= index <= MAX_GPU_INDEX:
        raise refuse(f"{index}: a GPU index is between 0 and {MAX_GPU_INDEX}")
    return index


def _sha256(value: str) -> str:
    if value and not SHA256.fullmatch(value):
        raise refuse(f"{value!r} is not a sha256 (64 lowercase hex digits), nor empty")
    return value


def _not_negative(value: int) -> int:
    if value < 0:
        raise refuse(f"{value}: at least 0")
    return value


DeploymentName = Annotated[str, AfterValidator(_deployment_name)]
HostName = Annotated[str, AfterValidator(_host_name)]
UnitFile = Annotated[str, AfterValidator(_unit)]
Port = Annotated[int, AfterValidator(_port)]
ReplicaIndex = Annotated[int, AfterValidator(_replica_index)]
GpuUuid = Annotated[str, AfterValidator(_gpu_uuid)]
GpuIndex = Annotated[int, AfterValidator(_gpu_index)]
Sha256 = Annotated[str, AfterValidator(_sha256)]
Count = Annotated[int, AfterValidator(_not_negative)]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemberRecord(Record):
    """A worker of a replica group (spec.nodes > 1): its unit on its own host, the port its engine's distributed
    runtime listens on, and the unit's sha256 as written (drift of a member is drift of its replica)."""

    rank: int
    host: HostName
    unit: str
    port: Port
    gpus: list[GpuUuid] = Field(default_factory=list)
    unit_sha256: Sha256
    argv: list[str] = Field(default_factory=list)
    engine_version: str | None = None
    engine_sha256: Sha256 = ""
    """The binary the worker was applied with (argv[0]'s sha256; empty in a state written before members recorded
    it: not checked): a change under it is drift of the replica."""


class ReplicaRecord(Record):
    index: ReplicaIndex
    slot: Literal["a", "b"] = "a"
    host: HostName
    unit: UnitFile
    port: Port
    gpus: list[GpuUuid] = Field(default_factory=list)
    """GPU UUIDs."""
    gpu_indexes: list[GpuIndex] = Field(default_factory=list)
    unit_sha256: Sha256
    revision: Count
    argv: list[str] = Field(default_factory=list)
    status: ReplicaStatus = "pending"
    reason: str | None = None
    checkpoint_digest: Sha256 = ""
    engine_version: str | None = None
    engine_sha256: Sha256 = ""
    """The engine build the replica was applied with (its binary's sha256): a change under it is drift."""
    """For an hf: model: the checkpoint digest its host measured once the files were in place."""
    on_demand: bool = False
    """A slot above the deployment's `min` (all of them with min: 0): its unit is installed, never enabled or
    started by apply; the scaler starts and stops it. Its being active or not is never drift."""
    group_port: int | None = None
    """A replica group's head (spec.nodes > 1): its runtime port beside `port`."""
    members: list[MemberRecord] = Field(default_factory=list)
    """A replica group's workers, rank 1 first (empty: a replica on one machine)."""

    @model_serializer(mode="wrap")
    def _without_group(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_empty_group(handler(self))

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.host, *(m.host for m in self.members))


class FailedStart(Record):
    """A replica whose start failed and whose unit apply removed again: its instance row stays in status (seed 003:
    `0  gpu-box  failed  active  gpu0  launch_failed: …`) until a start of that replica serves."""

    index: ReplicaIndex
    slot: Literal["a", "b"] = "a"
    host: HostName
    unit: UnitFile
    port: Port
    gpu_indexes: list[GpuIndex] = Field(default_factory=list)
    revision: Count
    error: str


def known_fields(model: type[BaseModel]) -> Any:
    """A before-validator: {} (what an empty record was written as) reads as None, and a field this engine-ctl's
    model does not have (one an older or newer engine-ctl wrote) is left out. The spec_hash beside it still says
    which revision it was, so leaving a field out never makes a new revision."""

    def read(value: Any) -> Any:
        if value == {}:
            return None
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k in model.model_fields}
        return value

    return read


# --- lifecycle records (issue 13 §2-4): start-up measured, last operation, request identities ---------------
ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
"""A ULID as python-ulid writes it: 26 characters of Crockford's base 32, the first at most 7."""


def _ulid(value: str) -> str:
    if not ULID.fullmatch(value):
        raise refuse(f"{value!r} is not a ULID (26 characters of Crockford's base 32)")
    return value


RequestId = Annotated[str, AfterValidator(_ulid)]
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def derived_id(*parts: str, at: str = "") -> str:
    """A ULID-form ID derived from `parts` (26 characters of Crockford's base 32, the first at most 7): the same
    parts give the same ID, so that a plan (pure) can name the ID its apply records. `at` (an ISO time, the
    plan's created_at) is its time, as a ULID's first 10 characters hold one: what /v1/models says as `created`."""
    n = int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:16], "big")  # 128 bits, as a ULID
    ident = "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(26)))
    ms = _epoch_ms(at)
    if not ms:
        return ident
    return "".join(CROCKFORD[(ms >> (5 * i)) & 31] for i in reversed(range(10))) + ident[10:]


def _epoch_ms(at: str) -> int:
    """An ISO time -> milliseconds since the epoch (0 for none, an unreadable one, or past a ULID's 48 bits)."""
    try:
        ms = int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000) if at else 0
    except ValueError:
        return 0
    return ms if 0 < ms < 2**48 else 0


def deployment_id_for(record: DeploymentRecord | None, lineage: str, name: str, serial: int, at: str = "") -> str:
    """A deployment's ID: the recorded one, or, for one not yet given one, the ID its next apply records, derived
    from the state (lineage and serial) and its name (a deployment made again after a destroy gets another)."""
    if record is not None and record.id:
        return record.id
    return derived_id("deployment", lineage, name, str(serial), at=at)


class StartupRecord(Record):
    """What the first start of a revision measured: the peak host RAM of the engine's unit (its cgroup), the peak
    GPU memory of each device (the GPU tool's per-process figures, sampled while it started), and the time from
    start to ready. Later fits of the revision set these aside instead of the estimate."""

    revision: Count
    host: HostName
    host_peak_bytes: Count | None = None
    host_source: str = ""
    """Where the host figure came from: `cgroup v1 memory.max_usage_in_bytes` or `cgroup v2 memory.peak`."""
    device_peak_bytes: dict[GpuUuid, Count] = Field(default_factory=dict)
    device_source: str = ""
    """Where the device figures came from: `nvidia-smi --query-compute-apps`."""
    initialize_s: float | None = None
    measured_at: str = ""


class RequestRecord(Record):
    """A command that changes something, by its request identity: what it was, the steps it completed (so a
    re-run with --request-id does none twice) and, once it ended, its result and exit status."""

    id: RequestId
    command: str
    who: str = ""
    started: str = ""
    steps: list[str] = Field(default_factory=list)
    finished: str | None = None
    result: str | None = None
    exit_code: int | None = None


REQUESTS_KEPT = 200


# --- operator actions (engine-ctl stop, park, delete): recorded, shown in every plan, never undone by apply ---
OperatorVerb = Literal["stopped", "parked", "deleted"]


def _ulid_or_empty(value: str) -> str:
    return _ulid(value) if value else value


Ulid = Annotated[str, AfterValidator(_ulid_or_empty)]
"""A ULID, or empty (records written before it was given)."""


class OperatorAction(Record):
    """What an operator did to a deployment by a verb: `stopped` (engine-ctl stop), `parked` (engine-ctl park),
    `deleted` (engine-ctl delete: a tombstone while its document is still in the repository). Apply keeps it so
    until `engine-ctl start` (or, for a tombstone, until the document is removed)."""

    verb: OperatorVerb
    when: str
    who: str = ""
    operation: Ulid = ""
    level: int = 0
    """For `parked`: the engine's sleep level (1 keeps the weights in host RAM, 2 drops them; 0: a restart)."""


class DeploymentRecord(Record):
    name: DeploymentName
    revision: Count = 0
    spec: Deployment | None = None
    model: Model | None = None
    spec_hash: str = ""
    plan: FitPlan | None = None
    """The fit's plan object of the recorded revision (FitPlan): what each replica takes."""
    state: Literal["Pending", "Starting", "Ready", "ScaledToZero", "Failed"] = "Pending"
    reason: str | None = None
    last_error: str | None = None
    """Why the last change failed (cleared by the next apply that completes)."""
    chosen: dict[str, int] = Field(default_factory=dict)
    """Fields the documents leave out that engine-ctl chose (gpus, parallel; the values are in `plan`), each with
    the revision it was chosen at: kept until the documents change, so hosts joining do not move them."""
    moved_from: list[DeploymentName] = Field(default_factory=list)
    """The names this record had before `engine-ctl state mv`: its replicas may still run units named after them
    until a roll replaces them with units of this name."""
    replicas: list[ReplicaRecord] = Field(default_factory=list)
    failed_starts: list[FailedStart] = Field(default_factory=list)
    """Replicas whose last start failed (their units removed again): rows status keeps, with their error."""
    startup: StartupRecord | None = None
    """The measured start-up of the recorded revision (None until its first start measured it)."""
    whole_host: bool = False
    """The recorded revision's estimated start-up peak was above what any host gives: its first start runs alone
    on one host and sets aside all of it (until a start measures it)."""
    last_operation: str | None = None
    """The seed's LAST OPERATION: `initialize succeeded`, `initialize failed (launch_failed)`."""
    id: Ulid = ""
    """The deployment's stable ID (a ULID), given when it is first created; empty in states written before IDs."""
    operator: OperatorAction | None = None
    """An operator's stop, park or delete (engine_ctl.core.plan.operator): kept by apply until `start`."""
    decision_reference: dict[str, Any] | None = None
    """A decisions deployment's first complete answer to the readiness question, for the wake check:
    {"version": the check's version, "choice", "probabilities"} (engine_ctl.core.decisions)."""

    _spec = field_validator("spec", mode="before")(known_fields(Deployment))
    _model = field_validator("model", mode="before")(known_fields(Model))
    _plan = field_validator("plan", mode="before")(known_fields(FitPlan))

    @field_validator("replicas")
    @classmethod
    def _units_are_this_deployments(cls, replicas: list[ReplicaRecord], info: ValidationInfo) -> list[ReplicaRecord]:
        """Each replica's unit is the one engine-ctl names for this deployment (or a name it had before `state
        mv`), index and slot: never another's."""
        name = info.data.get("name")
        if name is None:  # the name itself was refused, and says so
            return replicas
        names = [name, *info.data.get("moved_from", [])]
        for i, r in enumerate(replicas):
            expected = unit_name(name, r.index, r.slot)
            if r.unit not in {unit_name(n, r.index, r.slot) for n in names}:
                raise refuse(
                    f"{r.unit!r} is not the unit of replica {r.index}{r.slot} of deployment {name!r} "
                    f"(that is {expected!r})",
                    i,
                    "unit",
                )
        return replicas

    @model_serializer(mode="wrap")
    def _without_empty_moves(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """moved_from is written only when set, so a state no deployment was moved in reads in older engine-ctl."""
        data: dict[str, Any] = handler(self)
        for key in ("moved_from", "failed_starts"):  # written only when set: older states read the same
            if not data.get(key):
                data.pop(key, None)
        for key in ("id", "operator"):  # written only when set, as moved_from (older states read the same)
            if not data.get(key):
                data.pop(key, None)
        if data.get("decision_reference") is None:
            data.pop("decision_reference", None)  # written only for a decisions deployment
        return data

    def replica(self, index: int, slot: str | None = None) -> ReplicaRecord | None:
        for r in self.replicas:
            if r.index == index and (slot is None or r.slot == slot):
                return r
        return None


class GatewayRecord(Record):
    """A gateway host as the last apply left it: its files' and unit's sha256 (what drift is checked against),
    and its configuration's text (no secrets: key maps hold hashes), for the next plan's diff."""

    endpoint: str = ""
    files_sha256: dict[str, Sha256] = Field(default_factory=dict)
    unit_sha256: Sha256
    config: str = ""
    installing: dict[str, Sha256] = Field(default_factory=dict)
    """The files (and the unit, by its name) an apply is installing, recorded before it writes them and cleared once
    they are in place: a kill in between leaves engine-ctl's own files there, which the next plan finishes, never
    an edit by hand."""


class HostRecord(Record):
    facts_fingerprint: str
    machine_id: str | None = None
    """The machine that answered at the host's address when this state last applied (/etc/machine-id): a plan
    that finds another one there is refused (planner.other_machines); None: recorded by an older engine-ctl."""


class Operation(Record):
    id: str
    who: str
    when: str
    command: str
    plan_hash: str | None = None
    result: str | None = None


class LockInfo(Record):
    id: str
    operation: str
    who: str
    when: str
    path: str | None = None
    host: str | None = None
    """The machine of the holder (its host name), and below, what tells whether the holder still runs there:
    the kernel's boot ID, the pid and the pid's start time (so a reused pid is not taken for the holder).
    Lock files from before these fields read as they are, and are never called stale."""
    boot_id: str | None = None
    pid: int | None = None
    pid_start: int | None = None
    unreadable: str | None = Field(None, exclude=True)
    """Set (never written) when the lock file exists but cannot be read: why."""


class State(Record):
    format_version: int = FORMAT_VERSION
    serial: Count = 0
    """Up by one at every write, from 0 (never written); a negative one is not a serial engine-ctl wrote."""
    lineage: str = Field(default_factory=lambda: str(uuid.uuid4()))
    engine_ctl_version: str = ""
    deployments: dict[DeploymentName, DeploymentRecord] = Field(default_factory=dict)
    hosts: dict[HostName, HostRecord] = Field(default_factory=dict)
    gateways: dict[HostName, GatewayRecord] = Field(default_factory=dict)
    operations: list[Operation] = Field(default_factory=list)
    requests: list[RequestRecord] = Field(default_factory=list)
    """The last REQUESTS_KEPT commands that changed something, by request identity."""

    def request(self, request_id: str) -> RequestRecord | None:
        return next((r for r in self.requests if r.id == request_id), None)

    @field_validator("deployments")
    @classmethod
    def _keys_are_names(cls, deployments: dict[str, DeploymentRecord]) -> dict[str, DeploymentRecord]:
        for key, rec in deployments.items():
            if rec.name != key:
                raise refuse(f"{rec.name!r}: the record under {key!r} must be named {key!r}", key, "name")
        return deployments

    def gpus_held(self) -> set[str]:
        return {g for d in self.deployments.values() for r in d.replicas for g in r.gpus}


def _path_part(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    if part == "[key]":
        return " (the key)"
    if re.fullmatch(r"[A-Za-z0-9_-]+", part):
        return f".{part}"
    return f"[{part!r}]"


def field_path(loc: tuple[str | int, ...]) -> str:
    """('deployments', 'chat', 'replicas', 0, 'unit') -> 'deployments.chat.replicas[0].unit'."""
    return "".join(_path_part(p) for p in loc).lstrip(".") or "(the whole state)"


def describe(error: Any) -> str:
    """One pydantic error as `field.path: what is wrong`."""
    ctx = error.get("ctx") or {}
    loc = tuple(error["loc"]) + tuple(ctx.get("tail", ()))
    if error["type"] == "state_value":
        return f"{field_path(loc)}: {error['msg']}"
    value = error.get("input")
    got = f" (got {value!r})" if isinstance(value, str | int | float | bool) and len(repr(value)) <= 80 else ""
    return f"{field_path(loc)}: {error['msg']}{got}"


def parse_state(raw: object, location: str, recovery: str | None = None) -> State:
    """Validate a state read back (file or database); a record that breaks the rules raises StateError
    naming each field (the first few), and nothing has been acted on. `recovery` says where a previous
    version is, when one exists."""
    try:
        return State.model_validate(raw)
    except ValidationError as exc:
        problems = [describe(e) for e in exc.errors()]
        shown = "; ".join(problems[:ERRORS_SHOWN])
        more = f"; and {len(problems) - ERRORS_SHOWN} more" if len(problems) > ERRORS_SHOWN else ""
        tail = f" {recovery}" if recovery else ""
        raise StateError(
            f"{location}: the state does not match its format, so engine-ctl did nothing: {shown}{more}.{tail}"
        ) from None
