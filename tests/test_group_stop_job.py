"""A replica group's worker is stopped on its own host once its head has let go (engine-ctl stop, delete --stop):
the job (engine_ctl.shell.lifecycle.hosts.HOST_JOB, as a stop runs it there) waits while a TCP connection joins the
worker to its head's address, read from the kernel's own tables (/proc/net/tcp), then runs its last command. Here
the real script runs in place through the real LocalTransport, with real sockets on loopback standing in for the
head (127.0.0.1) and the worker's listening port, both ways round: the head dialling the worker's port (llama.cpp's
RPC) and the worker dialling the head's rendezvous port (vLLM, SGLang)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.record.model import MemberRecord, ReplicaRecord
from engine_ctl.shell.lifecycle.hosts import WORKER_WAIT_S, job_argv, member_stop_job
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port

HEAD = Host(name="head", address="127.0.0.1")


def _records(worker_port: int, group_port: int) -> tuple[ReplicaRecord, MemberRecord]:
    r = ReplicaRecord(index=0, host="head", unit="engine-ctl-g-0a.service", port=free_port(), unit_sha256="",
                      revision=1, group_port=group_port)  # fmt: skip
    m = MemberRecord(rank=1, host="w", unit="engine-ctl-g-0a-w1.service", port=worker_port, unit_sha256="")
    return r, m


def _run(job_json_argv: list[str], marker: Path) -> tuple[float, str]:
    """The job in place; its last command replaced by one that leaves a file (the stop it would run)."""
    began = time.monotonic()
    result = LocalTransport(HEAD).run(job_json_argv, timeout=60)
    assert result.exit_code == 0, result.stderr
    assert marker.exists()
    return time.monotonic() - began, result.stdout


def _job(r: ReplicaRecord, m: MemberRecord, marker: Path) -> list[str]:
    job = member_stop_job(HEAD, r, m)
    assert job.then[:3] == ("systemctl", "disable", "--no-reload") and job.then[-1] == m.unit  # the real stop
    assert job.wait_head is not None and job.wait_head["within_s"] == WORKER_WAIT_S
    return job_argv(type(job)(**{**job.__dict__, "then": ("touch", str(marker))}))


def _held_for(seconds: float, listen_port: int) -> threading.Thread:
    """A connection to 127.0.0.1:listen_port held open for `seconds`, then closed."""
    server = socket.create_server(("127.0.0.1", listen_port))
    client = socket.create_connection(("127.0.0.1", listen_port))
    accepted, _ = server.accept()

    def later() -> None:
        time.sleep(seconds)
        for s in (client, accepted, server):
            s.close()

    t = threading.Thread(target=later)
    t.start()
    return t


def test_a_worker_whose_head_dials_it_is_stopped_only_once_the_head_let_go(tmp_path: Path) -> None:
    worker_port = free_port()
    r, m = _records(worker_port, free_port())
    held = _held_for(2.0, worker_port)  # the head's connection to the worker's port (llama.cpp's --rpc)
    took, said = _run(_job(r, m, tmp_path / "stopped"), tmp_path / "stopped")
    held.join()
    assert took >= 1.8 and "the head let go" in said, (took, said)


def test_a_worker_that_dials_its_heads_rendezvous_port_is_stopped_once_that_connection_ends(tmp_path: Path) -> None:
    group_port = free_port()
    r, m = _records(free_port(), group_port)
    held = _held_for(2.0, group_port)  # the worker's connection to the head's rendezvous port (vLLM, SGLang)
    took, said = _run(_job(r, m, tmp_path / "stopped"), tmp_path / "stopped")
    held.join()
    assert took >= 1.8 and "the head let go" in said, (took, said)


def test_a_worker_with_no_connection_to_its_head_is_stopped_at_once(tmp_path: Path) -> None:
    r, m = _records(free_port(), free_port())
    took, said = _run(_job(r, m, tmp_path / "stopped"), tmp_path / "stopped")
    assert took < 5 and "the head let go" in said, (took, said)
