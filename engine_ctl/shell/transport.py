"""Reaching hosts: SSH (fabric/paramiko, strict host keys) or local; bounded parallel fan-out.

Remote commands are built from argv with shlex quoting; no value is ever pasted into a shell string unquoted.
paramiko and fabric (about 0.2 s of imports) are imported by the SSH code that uses them, not with this module:
commands that never open a connection (validate, --help) do not pay for them.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, Protocol, TypeVar

from engine_ctl.core.documents.inventory import Host

if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

FailureKind = Literal["unreachable", "auth", "host_key", "timeout", "command", "error"]
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
T = TypeVar("T")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


class HostFailure(Exception):
    """A host-level failure, reported by name without stopping other hosts' work."""

    def __init__(self, host: str, kind: FailureKind, message: str, hint: str | None = None) -> None:
        self.host, self.kind, self.message, self.hint = host, kind, message, hint
        super().__init__(f"{host}: {kind}: {message}")

    def as_json(self) -> dict[str, str | None]:
        return {"host": self.host, "kind": self.kind, "message": self.message, "hint": self.hint}


class Transport(Protocol):
    host: Host

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult: ...

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], stop: threading.Event) -> int | None: ...

    def close(self) -> None: ...


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(Exception):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        self.name, self.key = name, key
        super().__init__(f"unknown host key {key.get_name()} {fingerprint(key)} for {name}")


# paramiko asks a policy object for missing_host_key(client, hostname, key); its MissingHostKeyPolicy base
# adds nothing, so these policies need no paramiko at import.
class _StrictPolicy:
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class _AcceptNewPolicy:
    """Accept a key only for a host with no key recorded (never a changed one: paramiko raises
    BadHostKeyException for that before asking a policy); record it in the known_hosts file."""

    _lock = threading.Lock()

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        with self._lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclass
class SSHOptions:
    accept_new_host_keys: bool = False
    connect_timeout: float | None = None
    command_timeout: float | None = None


class SSHTransport:
    """One SSH connection per host, reused for everything one command does there."""

    def __init__(self, host: Host, options: SSHOptions | None = None) -> None:
        self.host = host
        self.options = options or SSHOptions()
        self._conn: Connection | None = None

    def _known_hosts(self) -> Path:
        return Path(os.path.expanduser(self.host.known_hosts or DEFAULT_KNOWN_HOSTS))

    def _connection(self) -> Connection:
        if self._conn is not None:
            return self._conn
        import paramiko
        from fabric import Config, Connection
        from paramiko.ssh_exception import AuthenticationException, BadHostKeyException, SSHException

        h = self.host
        timeout = self.options.connect_timeout or h.connect_timeout
        connect_kwargs: dict[str, object] = {
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            "allow_agent": True,
            "look_for_keys": h.identity_file is None,
        }
        if h.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(h.identity_file)]
        config = Config(overrides={"load_ssh_configs": True})
        conn = Connection(
            h.address, user=h.user, port=h.port, connect_timeout=int(timeout),
            connect_kwargs=connect_kwargs, config=config,
        )  # fmt: skip
        client = conn.client
        known = self._known_hosts()
        if h.host_key:
            key_type, _, blob = h.host_key.strip().partition(" ")
            name = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
            client.get_host_keys().add(name, key_type, paramiko.PKey.from_type_string(key_type, _b64(blob)))
        elif known.exists():
            client.load_host_keys(str(known))
        policy: _StrictPolicy | _AcceptNewPolicy = (
            _AcceptNewPolicy(known) if self.options.accept_new_host_keys and not h.host_key else _StrictPolicy()
        )
        client.set_missing_host_key_policy(policy)
        try:
            conn.open()
        except BadHostKeyException as exc:
            raise HostFailure(
                h.name,
                "host_key",
                f"host key CHANGED for {h.address}: got {exc.key.get_name()} {fingerprint(exc.key)}, "
                f"expected {fingerprint(exc.expected_key)}; nothing was run on this host",
                hint=f"if the host was rebuilt, remove its old key from {known} (ssh-keygen -R {h.address})",
            ) from None
        except UnknownHostKey as exc:
            raise HostFailure(
                h.name,
                "host_key",
                f"unknown host key for {h.address}: {exc.key.get_name()} {fingerprint(exc.key)}; nothing was run",
                hint=f"check the fingerprint, then add it to {known} (ssh-keyscan), or pass --accept-new-host-keys",
            ) from None
        except AuthenticationException as exc:
            if _cut_off(client, exc):
                raise HostFailure(
                    h.name, "unreachable", f"the connection to {h.address}:{h.port} was cut during authentication "
                    f"({exc}); nothing was run on this host", hint="check the network path to the host",
                ) from None  # fmt: skip
            raise HostFailure(
                h.name,
                "auth",
                f"authentication failed for {h.user or 'the default user'}@{h.address}: {exc}",
                hint="check identity_file, user and your SSH agent",
            ) from None
        except TimeoutError as exc:
            raise HostFailure(h.name, "timeout", f"connecting to {h.address}:{h.port} timed out ({exc})") from None
        except (OSError, SSHException, EOFError) as exc:
            raise HostFailure(
                h.name, "unreachable", f"cannot connect to {h.address}:{h.port}: {exc or type(exc).__name__}"
            ) from None
        self._conn = conn
        return conn

    def connect(self) -> None:
        self._connection()

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult:
        from paramiko.ssh_exception import SSHException

        conn = self._connection()
        command = shlex.join(argv)
        limit = timeout or self.options.command_timeout or self.host.command_timeout
        try:
            chan = conn.client.get_transport().open_session(timeout=limit)  # type: ignore[union-attr]
            chan.settimeout(limit)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            out, err = _drain(chan, limit)
            code = chan.recv_exit_status()
            chan.close()
        except TimeoutError:
            raise HostFailure(self.host.name, "timeout", f"{argv[0]} did not finish within {limit:.0f} s") from None
        except (SSHException, OSError, EOFError) as exc:
            raise HostFailure(self.host.name, "unreachable", f"connection lost: {exc}") from None
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], stop: threading.Event) -> int | None:
        """Run argv and hand each line of its output (stdout and stderr together) to on_line as it comes. Returns
        its exit status, or None once `stop` is set: the channel is closed, and since the command runs on a
        pseudo-terminal the remote side hangs up on it (SIGHUP), so nothing is left running there."""
        from paramiko.ssh_exception import SSHException

        conn = self._connection()
        limit = self.options.command_timeout or self.host.command_timeout
        chan = None
        try:
            chan = conn.client.get_transport().open_session(timeout=limit)  # type: ignore[union-attr]
            chan.get_pty(term="dumb", width=4096)
            chan.exec_command(shlex.join(argv))
            ended = _pump(chan, on_line, stop)
            return chan.recv_exit_status() if ended else None
        except (SSHException, OSError, EOFError) as exc:
            raise HostFailure(self.host.name, "unreachable", f"connection lost: {exc}") from None
        finally:
            if chan is not None:
                chan.close()

    def feed(self, argv: Sequence[str], stdin: str, on_line: Callable[[str], None], timeout: float) -> int:
        """Run argv with `stdin` (then end of input) and hand each line of its stdout to on_line as it comes; no
        pseudo-terminal, so stdin is passed as it is. Returns its exit status. Should engine-ctl go away, the
        command's next write fails (the channel is gone) and it ends."""
        from paramiko.ssh_exception import SSHException

        conn = self._connection()
        try:
            chan = conn.client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
            chan.settimeout(timeout)
            chan.exec_command(shlex.join(argv))
            chan.sendall(stdin.encode())
            chan.shutdown_write()
            try:
                _pump(chan, on_line, threading.Event())
                return int(chan.recv_exit_status())
            finally:
                chan.close()
        except TimeoutError:
            raise HostFailure(self.host.name, "timeout", f"{argv[0]} went silent for {timeout:.0f} s") from None
        except (SSHException, OSError, EOFError) as exc:
            raise HostFailure(self.host.name, "unreachable", f"connection lost: {exc}") from None

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        import paramiko
        from paramiko.ssh_exception import SSHException

        conn = self._connection()
        tmp = f"{path}.engine-ctl-tmp"
        try:
            sftp = conn.sftp()
            sftp.putfo(io.BytesIO(data), tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, SSHException, EOFError, paramiko.SFTPError) as exc:
            why = f"uploading {path} failed: {exc or type(exc).__name__}"
            raise HostFailure(self.host.name, "command", why) from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _cut_off(client: paramiko.SSHClient, exc: paramiko.AuthenticationException) -> bool:
    """paramiko reports a connection that died mid-authentication (a network outage) as an authentication
    failure: a timeout, or a transport that is no longer up, is the network, not the key."""
    transport = client.get_transport()
    return "timeout" in str(exc).lower() or transport is None or not transport.is_active()


def _drain(chan: paramiko.Channel, timeout: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr together until the command exits (select on the channel, with a deadline)."""
    import select
    import time

    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        drained = not chan.recv_ready() and not chan.recv_stderr_ready()
        if chan.exit_status_ready() and drained and (chan.eof_received or chan.closed):
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        select.select([chan], [], [], min(left, 0.5))
    return bytes(out), bytes(err)


def _pump(source: paramiko.Channel | IO[bytes], on_line: Callable[[str], None], stop: threading.Event) -> bool:
    """Read `source` line by line into on_line until it ends (True) or `stop` is set (False)."""
    import select

    pending = b""
    while not stop.is_set():
        ready, _, _ = select.select([source], [], [], 0.25)
        if not ready:
            continue
        data = source.recv(65536) if hasattr(source, "recv") else os.read(source.fileno(), 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            on_line(line.rstrip(b"\r").decode("utf-8", "replace"))
    if pending and not stop.is_set():
        on_line(pending.rstrip(b"\r").decode("utf-8", "replace"))
    return not stop.is_set()


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text.split()[0])


class LocalTransport:
    """The machine engine-ctl runs on (`transport: local`): subprocesses, no SSH."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def connect(self) -> None:
        return None

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv), input=stdin, capture_output=True, text=True,
                timeout=timeout or self.host.command_timeout, check=False,
            )  # fmt: skip
        except FileNotFoundError as exc:
            return CommandResult(127, "", str(exc))
        except subprocess.TimeoutExpired:
            raise HostFailure(self.host.name, "timeout", f"{argv[0]} did not finish in time") from None
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], stop: threading.Event) -> int | None:
        """As SSHTransport.stream, with a subprocess: ended (SIGTERM, then SIGKILL) once `stop` is set."""
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        except OSError as exc:
            on_line(f"{argv[0]}: {exc.strerror or exc}")
            return 127
        assert proc.stdout is not None
        try:
            ended = _pump(proc.stdout, on_line, stop)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.stdout.close()
        return proc.wait() if ended else None

    def feed(self, argv: Sequence[str], stdin: str, on_line: Callable[[str], None], timeout: float) -> int:
        """As SSHTransport.feed, with a subprocess."""
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        except OSError as exc:
            on_line(f"{argv[0]}: {exc.strerror or exc}")
            return 127
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return proc.wait()

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = Path(path)
        tmp = target.with_name(target.name + ".engine-ctl-tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(target)

    def close(self) -> None:
        return None


def transport_for(host: Host, options: SSHOptions | None = None) -> SSHTransport | LocalTransport:
    return LocalTransport(host) if host.transport == "local" else SSHTransport(host, options)


def fan_out(
    hosts: Sequence[Host],
    work: Callable[[SSHTransport | LocalTransport], T],
    *,
    options: SSHOptions | None = None,
    parallel: int = 32,
) -> tuple[dict[str, T], dict[str, HostFailure]]:
    """Run `work` on each host over its own connection, at most `parallel` at once; failures never stop
    the other hosts' work."""
    results: dict[str, T] = {}
    failures: dict[str, HostFailure] = {}

    def one(host: Host) -> None:
        transport = transport_for(host, options)
        try:
            results[host.name] = work(transport)
        except HostFailure as exc:
            failures[host.name] = exc
        except Exception as exc:  # a bug or an unexpected answer must not take the other hosts down
            failures[host.name] = HostFailure(host.name, "error", f"{type(exc).__name__}: {exc}")
        finally:
            transport.close()

    if not hosts:
        return results, failures
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as pool:
        list(pool.map(one, hosts))
    return results, failures
