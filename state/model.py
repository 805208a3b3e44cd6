"""The recorded state: versioned JSON with serial and lineage (Terraform's discipline). Values only."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT_VERSION = 1
ReplicaStatus = Literal["pending", "serving", "stopped", "failed", "removing"]


class StateError(Exception):
    """The state cannot be used as it is; the message says why and what to do."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaRecord(Record):
    index: int
    slot: str = "a"
    host: str
    unit: str
    port: int
    gpus: list[str] = Field(default_factory=list)
    """GPU UUIDs."""
    gpu_indexes: list[int] = Field(default_factory=list)
    unit_sha256: str
    revision: int
    argv: list[str] = Field(default_factory=list)
    status: ReplicaStatus = "pending"
    reason: str | None = None


class DeploymentRecord(Record):
    name: str
    revision: int = 0
    spec: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str = ""
    plan: dict[str, Any] | None = None
    state: Literal["Pending", "Starting", "Ready", "ScaledToZero", "Failed"] = "Pending"
    reason: str | None = None
    replicas: list[ReplicaRecord] = Field(default_factory=list)

    def replica(self, index: int, slot: str | None = None) -> ReplicaRecord | None:
        for r in self.replicas:
            if r.index == index and (slot is None or r.slot == slot):
                return r
        return None


class HostRecord(Record):
    facts_fingerprint: str


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


class State(Record):
    format_version: int = FORMAT_VERSION
    serial: int = 0
    lineage: str = Field(default_factory=lambda: str(uuid.uuid4()))
    engine_ctl_version: str = ""
    deployments: dict[str, DeploymentRecord] = Field(default_factory=dict)
    hosts: dict[str, HostRecord] = Field(default_factory=dict)
    operations: list[Operation] = Field(default_factory=list)

    def ports_on(self, host: str) -> set[int]:
        return {r.port for d in self.deployments.values() for r in d.replicas if r.host == host}

    def gpus_held(self) -> set[str]:
        return {g for d in self.deployments.values() for r in d.replicas for g in r.gpus}
