"""Reaching hosts: SSH (paramiko, strict host keys) or local; bounded parallel fan-out.

Remote commands are built from argv with shlex quoting; no value is ever pasted into a shell string unquoted.
paramiko is imported (by `_paramiko()`) when a connection is first made, not with this module: commands that
never open one (validate, --help) do not pay for it. It is used directly, not through fabric. paramiko imports
invoke at import time (only to run `Match exec` lines of ssh_config), and invoke pulls in unittest.mock, asyncio
and ssl: that doubled the cost of every command that reaches a host (bench/startup.py). `_paramiko()` imports
paramiko without invoke; invoke is imported only if an ssh_config file does use `Match exec`.

What the inventory leaves out of a host (HostName, User, Port, IdentityFile, ProxyCommand, ProxyJump) is what
OpenSSH itself answers: `ssh -G HOST`, which applies Include, Match, Host patterns and tokens exactly as `ssh`
does (about 5 ms a host, asked once per host and process). paramiko's SSHConfig, which ignores Include, is only
the fallback where no `ssh` is installed. ENGINE_CTL_SSH_CONFIG names another config file (`ssh -F`).

Two SSH stacks, each for a reason: paramiko here (one process keeps a connection per host for every step of an
apply and opens parallel sessions on it, with strict host keys from the same known_hosts), and OpenSSH on the
gateway hosts for the scaler (stdlib-only Python there: no paramiko to install on a host). Both refuse an
unknown or changed host key.

Connecting is retried twice, with backoff, on a transient failure (a reset, a refused connection, a timeout
while connecting); never after an authentication failure or a changed host key.
"""

from __future__ import annotations

import functools
import io
import itertools
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from engine_ctl.core.documents.inventory import Host

if TYPE_CHECKING:
    from concurrent.futures import Future

    import paramiko

FailureKind = Literal["unreachable", "auth", "host_key", "timeout", "command", "error"]
SYSTEM_PYTHON = "/usr/bin/python3"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
T = TypeVar("T")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


_IMPORT_LOCK = threading.Lock()
# paramiko's transport thread logs a failed handshake (a reset during the banner) with its traceback at ERROR; with no
# handler, Python's last-resort handler would print that on stderr. The connect error itself reaches the caller, which
# retries or reports it in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _paramiko() -> ModuleType:
    """paramiko, imported without invoke (see the module's docstring); `_ssh_config_lookup` brings invoke back
    for `Match exec`. Other code that imports invoke later gets the real one."""
    with _IMPORT_LOCK:
        if "paramiko" not in sys.modules and "invoke" not in sys.modules:
            sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError
            try:
                import paramiko
            finally:
                del sys.modules["invoke"]
        import paramiko
    return paramiko


def python_argv(*args: str, system: str = SYSTEM_PYTHON) -> list[str]:
    """argv that runs the host's Python 3 with `args` (stdlib-only programs: -I -S, or -c): the system's
    /usr/bin/python3 where there is one (as the scaler's unit does), else `python3` on the
    login shell's PATH (exit 127 where there is none). A PATH's python3 may be a version manager's shim (pyenv,
    asdf) that costs a process tree on every start: about 0.4 s a host on the test fleet, where root's .bashrc
    puts pyenv's shims first."""
    pick = f'p={shlex.quote(system)}; [ -x "$p" ] || p=python3; exec "$p" "$@"'
    return ["sh", "-c", pick, "python3", *args]


class HostFailure(Exception):
    """A host-level failure, reported by name without stopping other hosts' work."""

    def __init__(self, host: str, kind: FailureKind, message: str, hint: str | None = None) -> None:
        self.host, self.kind, self.message, self.hint = host, kind, message, hint
        super().__init__(f"{host}: {kind}: {message}")

    def as_json(self) -> dict[str, str | None]:
        return {"host": self.host, "kind": self.kind, "message": self.message, "hint": self.hint}


class Transport(Protocol):
    """What gather, apply, fetch and logs ask of one host's connection, and all they may ask: SSHTransport and
    LocalTransport are both one (mypy checks it where transport_for's result is used as a Transport)."""

    host: Host

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult: ...

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], stop: threading.Event) -> int | None: ...

    def feed(self, argv: Sequence[str], stdin: str, on_line: Callable[[str], None], timeout: float) -> int: ...

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
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None

    def _known_hosts(self) -> Path:
        return Path(os.path.expanduser(self.host.known_hosts or DEFAULT_KNOWN_HOSTS))

    def _connection(self) -> paramiko.SSHClient:
        """The host's connection, made on first use; a transient failure is tried again (see the module)."""
        if self._client is not None:
            return self._client
        attempt = 0
        while True:
            try:
                return self._connect_once()
            except _Transient as exc:
                retries = TIMEOUT_RETRIES if exc.failure.kind == "timeout" else CONNECT_RETRIES
                if attempt >= retries:
                    raise exc.failure from None
                time.sleep(CONNECT_BACKOFF_S * 2**attempt)
                attempt += 1

    def _connect_once(self) -> paramiko.SSHClient:
        paramiko = _paramiko()
        AuthenticationException, BadHostKeyException = paramiko.AuthenticationException, paramiko.BadHostKeyException
        SSHException = paramiko.SSHException

        h = self.host
        known = self._known_hosts()
        timeout = self.options.connect_timeout or h.connect_timeout
        client = None
        try:
            target = _resolve(h.address, h.user, h.port, h.identity_file, timeout)
            sock = self._jump(target, timeout) if target.jumps else _proxy_command(target)
            client = self._client_for(target, host_key=h.host_key, accept_new=not h.host_key)
            client.connect(**target.connect_kwargs(timeout), sock=sock)
        except BadHostKeyException as exc:
            self._close_all()
            raise HostFailure(
                h.name,
                "host_key",
                f"host key CHANGED for {exc.hostname}: got {exc.key.get_name()} {fingerprint(exc.key)}, "
                f"expected {fingerprint(exc.expected_key)}; nothing was run on this host",
                hint=f"if the host was rebuilt, remove its old key from {known} (ssh-keygen -R {exc.hostname})",
            ) from None
        except UnknownHostKey as exc:
            self._close_all()
            raise HostFailure(
                h.name,
                "host_key",
                f"unknown host key for {exc.name}: {exc.key.get_name()} {fingerprint(exc.key)}; nothing was run",
                hint=f"check the fingerprint, then add it to {known} (ssh-keyscan), or pass --accept-new-host-keys",
            ) from None
        except AuthenticationException as exc:
            cut = client is None or _cut_off(client, exc)  # asked before closing: a closed transport is "cut"
            self._close_all()
            if cut:
                raise HostFailure(
                    h.name, "unreachable", f"the connection to {h.address}:{h.port} was cut during authentication "
                    f"({exc}); nothing was run on this host", hint="check the network path to the host",
                ) from None  # fmt: skip
            raise HostFailure(
                h.name,
                "auth",
                f"authentication failed for {target.user}@{h.address}: {exc}",
                hint="check identity_file, user and your SSH agent",
            ) from None
        except TimeoutError as exc:
            self._close_all()
            raise _Transient(
                HostFailure(h.name, "timeout", f"connecting to {h.address}:{h.port} timed out ({exc})")
            ) from None
        except SSHConfigError as exc:
            self._close_all()
            raise HostFailure(
                h.name, "error", f"OpenSSH refused the ssh_config for {h.address}: {exc}",
                hint="fix the line it names (ssh -G shows what OpenSSH makes of it)",
            ) from None  # fmt: skip
        except ImportError as exc:  # paramiko needs invoke for `Match exec` in an ssh_config file
            self._close_all()
            raise HostFailure(
                h.name, "error", f"your ssh_config uses `Match exec`, which paramiko runs only with invoke: {exc}",
                hint="pip install invoke next to engine-ctl, or give this host's settings in the inventory",
            ) from None  # fmt: skip
        except (OSError, SSHException, EOFError) as exc:
            self._close_all()
            failure = HostFailure(
                h.name, "unreachable", f"cannot connect to {h.address}:{h.port}: {exc or type(exc).__name__}"
            )
            if _transient(exc):
                raise _Transient(failure) from None
            raise failure from None
        self._client = client
        return client

    def _client_for(self, target: _Target, *, host_key: str | None, accept_new: bool) -> paramiko.SSHClient:
        """An SSHClient that knows the host keys engine-ctl trusts for `target`: the inventory's `host_key`, else
        the known_hosts file; an unknown key is refused (or, with --accept-new-host-keys, recorded)."""
        paramiko = _paramiko()

        client = paramiko.SSHClient()
        self._jumps.append(client)  # closed with the connection (the last one made is the host's own)
        known = self._known_hosts()
        if host_key:
            key_type, _, blob = host_key.strip().partition(" ")
            name = target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"
            client.get_host_keys().add(name, key_type, paramiko.PKey.from_type_string(key_type, _b64(blob)))
        elif known.exists():
            client.load_host_keys(str(known))
        policy: _StrictPolicy | _AcceptNewPolicy = (
            _AcceptNewPolicy(known) if self.options.accept_new_host_keys and accept_new else _StrictPolicy()
        )
        client.set_missing_host_key_policy(policy)
        return client

    def _jump(self, target: _Target, timeout: float) -> paramiko.Channel:
        """ProxyJump: connect to each jump host in turn (each checked against known_hosts like any host) and open
        a direct-tcpip channel from the last one to the target, as `ssh -J` does."""
        sock: paramiko.Channel | paramiko.ProxyCommand | None = None
        hops = [*target.jumps, (None, target.hostname, target.port)]
        for (hop_user, hop_host, hop_port), (_, next_host, next_port) in itertools.pairwise(hops):
            hop = _resolve(hop_host, hop_user, hop_port, None, timeout)
            client = self._client_for(hop, host_key=None, accept_new=True)
            client.connect(**hop.connect_kwargs(timeout), sock=sock or _proxy_command(hop))
            sock = client.get_transport().open_channel(  # type: ignore[union-attr]
                "direct-tcpip", (next_host, next_port or 22), ("", 0), timeout=timeout
            )
        assert sock is not None
        return sock  # type: ignore[return-value]

    def _close_all(self) -> None:
        for client in reversed(self._jumps):
            client.close()
        self._jumps = []
        self._client = None

    def connect(self) -> None:
        self._connection()

    @contextmanager
    def _session(self, argv: Sequence[str], timeout: float, silent: str | None, pty: bool = False) -> Iterator[Any]:
        """One command on the host's one reused connection: a session channel with argv started on it, closed
        after. Without a pseudo-terminal reads and writes wait at most `timeout`, and running past it is the
        HostFailure "argv[0] <silent>"; a broken connection is the HostFailure "connection lost"."""
        SSHException = _paramiko().SSHException
        client = self._connection()
        chan = None
        try:
            chan = client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
            if pty:
                chan.get_pty(term="dumb", width=4096)
            else:
                chan.settimeout(timeout)
            chan.exec_command(shlex.join(argv))
            yield chan
        except TimeoutError as exc:
            if silent is None:
                raise HostFailure(self.host.name, "unreachable", f"connection lost: {exc}") from None
            raise HostFailure(self.host.name, "timeout", f"{argv[0]} {silent}") from None
        except (SSHException, OSError, EOFError) as exc:
            raise HostFailure(self.host.name, "unreachable", f"connection lost: {exc}") from None
        finally:
            if chan is not None:
                chan.close()

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult:
        limit = timeout or self.options.command_timeout or self.host.command_timeout
        with self._session(argv, limit, f"did not finish within {limit:.0f} s") as chan:
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            out, err = _drain(chan, limit)
            code = chan.recv_exit_status()
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], stop: threading.Event) -> int | None:
        """Run argv and hand each line of its output (stdout and stderr together) to on_line as it comes. Returns
        its exit status, or None once `stop` is set: the channel is closed, and since the command runs on a
        pseudo-terminal the remote side hangs up on it (SIGHUP), so nothing is left running there."""
        limit = self.options.command_timeout or self.host.command_timeout
        with self._session(argv, limit, None, pty=True) as chan:
            ended = _pump(chan, on_line, stop)
            return chan.recv_exit_status() if ended else None

    def feed(self, argv: Sequence[str], stdin: str, on_line: Callable[[str], None], timeout: float) -> int:
        """Run argv with `stdin` (then end of input) and hand each line of its stdout to on_line as it comes; no
        pseudo-terminal, so stdin is passed as it is. Returns its exit status. Should engine-ctl go away, the
        command's next write fails (the channel is gone) and it ends."""
        with self._session(argv, timeout, f"went silent for {timeout:.0f} s") as chan:
            chan.sendall(stdin.encode())
            chan.shutdown_write()
            _pump(chan, on_line, threading.Event(), silent_s=timeout)
            return int(chan.recv_exit_status())

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        paramiko = _paramiko()
        client = self._connection()
        tmp = f"{path}.engine-ctl-tmp"
        try:
            if self._sftp is None:
                self._sftp = client.open_sftp()
            sftp = self._sftp
            sftp.putfo(io.BytesIO(data), tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException, EOFError, paramiko.SFTPError) as exc:
            why = f"uploading {path} failed: {exc or type(exc).__name__}"
            raise HostFailure(self.host.name, "command", why) from None

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        self._close_all()


@dataclass(frozen=True)
class _Target:
    """Where and as whom to connect: the inventory's values, completed from ssh_config as OpenSSH would."""

    hostname: str
    port: int
    user: str
    key_filenames: tuple[str, ...]
    look_for_keys: bool
    proxy_command: str | None = None
    jumps: tuple[tuple[str | None, str, int | None], ...] = ()

    def connect_kwargs(self, timeout: float) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "port": self.port,
            "username": self.user,
            "key_filename": list(self.key_filenames) or None,
            "look_for_keys": self.look_for_keys,
            "allow_agent": True,
            "timeout": timeout,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
        }


SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")  # the user's first: the first value found wins
SSH_CONFIG_VARIABLE = "ENGINE_CTL_SSH_CONFIG"
LISTS = ("identityfile",)  # the keys `ssh -G` may print more than once


def _config_files() -> tuple[str, ...]:
    chosen = os.environ.get(SSH_CONFIG_VARIABLE)
    return (chosen,) if chosen else SSH_CONFIG_FILES


@functools.cache
def _ssh_config() -> paramiko.SSHConfig:
    """The ssh_config files, read once per process with paramiko (the fallback where OpenSSH is not installed)."""
    config = _paramiko().SSHConfig()
    for name in _config_files():
        path = os.path.expanduser(name)
        if os.path.isfile(path):
            with open(path) as f:
                config.parse(f)
    return config


def _resolve(address: str, user: str | None, port: int | None, identity: str | None, timeout: float) -> _Target:
    """The inventory's address, user, port and identity_file win; ssh_config fills in what they leave out
    (HostName, User, Port, IdentityFile, ProxyCommand, ProxyJump); then OpenSSH's defaults."""
    import getpass

    found = _ssh_config_lookup(address)
    keys = [os.path.expanduser(identity)] if identity else []
    keys += [os.path.expanduser(k) for k in found.get("identityfile", []) if os.path.exists(os.path.expanduser(k))]
    jumps = tuple(_jump_hop(hop) for hop in found.get("proxyjump", "").split(",") if hop and hop != "none")
    command = found.get("proxycommand")
    return _Target(
        hostname=found.get("hostname", address),
        port=port or int(found.get("port", 22)),
        user=user or found.get("user") or getpass.getuser(),
        key_filenames=tuple(dict.fromkeys(keys)),
        look_for_keys=identity is None,
        proxy_command=None if not command or command == "none" or jumps else command,
        jumps=jumps,
    )


class SSHConfigError(Exception):
    """`ssh -G` refused the configuration (a bad line, an Include that loops): its own words."""


@functools.cache
def openssh_settings(address: str, config: str | None = None) -> dict[str, Any]:
    """OpenSSH's own answer for `address` (`ssh -G`): every setting, keys lowercased, IdentityFile a list."""
    ssh = shutil.which("ssh")
    assert ssh is not None
    argv = [ssh, *(["-F", config] if config else []), "-G", "--", address]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise SSHConfigError(said[-1] if said else f"ssh -G {address} exited {done.returncode}")
    found: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in LISTS:
            found.setdefault(key, []).append(value)
        else:
            found.setdefault(key, value)
    if "proxycommand" in found:  # `ssh -G` leaves its tokens for the connection to expand
        found["proxycommand"] = _expand_tokens(found["proxycommand"], found, address)
    return found


def _expand_tokens(text: str, found: Mapping[str, Any], address: str) -> str:
    """ProxyCommand's %h %p %r %n and %%, as ssh_config(5) TOKENS says."""
    values = {"h": found.get("hostname", address), "p": found.get("port", "22"), "r": found.get("user", ""),
              "n": address, "%": "%"}  # fmt: skip
    return re.sub(r"%([hprn%])", lambda m: str(values[m.group(1)]), text)


def _ssh_config_lookup(address: str) -> dict[str, Any]:
    """ssh_config's settings for `address`, as OpenSSH resolves them (`ssh -G`); without OpenSSH, paramiko's
    reading (a `Match exec` line there needs invoke, imported then, and only then)."""
    if shutil.which("ssh"):
        return openssh_settings(address, os.environ.get(SSH_CONFIG_VARIABLE))
    try:
        return dict(_ssh_config().lookup(address))
    except ImportError:
        import importlib

        config_module: Any = importlib.import_module("paramiko.config")
        if config_module.invoke is not None:
            raise
        config_module.invoke = importlib.import_module("invoke")
        return dict(_ssh_config().lookup(address))


def _jump_hop(hop: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` of ProxyJump: what it leaves out comes from ssh_config for that host."""
    user, _, host = hop.strip().rpartition("@")
    if host.startswith("["):  # `ssh -G` writes [host]:port
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, _, port = host.partition(":")
    return user or None, name, int(port) if port else None


def _proxy_command(target: _Target) -> paramiko.ProxyCommand | None:
    return _paramiko().ProxyCommand(target.proxy_command) if target.proxy_command else None


CONNECT_RETRIES = 2  # a reset or a refused connection: tried 3 times in all
TIMEOUT_RETRIES = 1  # a timeout while connecting: twice (a host cut off costs two connect timeouts, not three)
CONNECT_BACKOFF_S = 0.5


class _Transient(Exception):
    """A connection failure worth another try; `failure` is what the user hears if none works."""

    def __init__(self, failure: HostFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


def _transient(exc: BaseException) -> bool:
    """A reset, a refusal or an aborted connection, the SSH banner never read (a reset mid-handshake), or a
    transport that was gone before authentication began (paramiko's "No existing session": the server hung up, or
    this process was suspended past the handshake's timeouts, as with Ctrl-Z then fg); nothing ran on the host in
    any of these. Not a DNS failure, an unreachable network, or anything about keys."""
    if isinstance(exc, ConnectionResetError | ConnectionRefusedError | ConnectionAbortedError | EOFError):
        return True
    return "Error reading SSH protocol banner" in str(exc) or str(exc) == "No existing session"


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


def _pump(
    source: paramiko.Channel | IO[bytes],
    on_line: Callable[[str], None],
    stop: threading.Event,
    silent_s: float | None = None,
) -> bool:
    """Read `source` line by line into on_line until it ends (True) or `stop` is set (False); TimeoutError when
    it says nothing for `silent_s` seconds."""
    import select
    import time

    pending = b""
    heard = time.monotonic()
    while not stop.is_set():
        ready, _, _ = select.select([source], [], [], 0.25)
        if not ready:
            if silent_s is not None and time.monotonic() - heard > silent_s:
                raise TimeoutError(f"nothing for {silent_s:.0f} s")
            continue
        heard = time.monotonic()
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


Ahead = Mapping[str, "Future[SSHTransport]"]
"""Connections already being opened (connect_ahead), by host name."""
Kept = dict[str, SSHTransport | LocalTransport]
"""Connections fan_out left open for a command's next steps, by host name."""


def connect_ahead(hosts: Sequence[Host], options: SSHOptions | None = None, parallel: int = 32) -> Ahead:
    """Start connecting to the first `parallel` SSH hosts now, in the background, and return at once: the
    handshakes (mostly the hosts' own work) then overlap whatever the command still has to import, load and check
    before fan_out uses them. Never more than `parallel` connections are opening at once. Only connections are
    opened (host keys checked as always); nothing runs on a host until fan_out's work does. The threads are
    daemons: a command that stops early (bad input) exits without waiting on a slow host's handshake."""
    from concurrent.futures import Future

    ssh = [h for h in hosts if h.transport != "local"][:parallel]
    if not ssh:
        return {}
    _paramiko()  # here, not in the threads: they start straight on the network

    def open_into(host: Host, future: Future[SSHTransport]) -> None:
        transport = SSHTransport(host, options)
        try:
            transport.connect()
        except BaseException as exc:  # HostFailure, or a bug: fan_out reports it for this host
            future.set_exception(exc)
        else:
            future.set_result(transport)

    ahead: dict[str, Future[SSHTransport]] = {}
    for h in ssh:
        ahead[h.name] = Future()
        threading.Thread(target=open_into, args=(h, ahead[h.name]), daemon=True,
                         name=f"engine-ctl-connect-{h.name}").start()  # fmt: skip
    return ahead


def fan_out(
    hosts: Sequence[Host],
    work: Callable[[SSHTransport | LocalTransport], T],
    *,
    options: SSHOptions | None = None,
    parallel: int = 32,
    ahead: Ahead | None = None,
    keep: Kept | None = None,
) -> tuple[dict[str, T], dict[str, HostFailure]]:
    """Run `work` on each host over its own connection (one connect_ahead began, or a new one), at most `parallel`
    at once; failures never stop the other hosts' work. Each connection is closed after its work, or, given
    `keep`, the connection of each host whose work succeeded is left open there, by host name, for the command's
    next steps on that host (apply's roll reuses gather's: one handshake per host, not two); the caller closes
    them."""
    from concurrent.futures import ThreadPoolExecutor

    results: dict[str, T] = {}
    failures: dict[str, HostFailure] = {}
    begun = ahead or {}

    def one(host: Host) -> None:
        transport: SSHTransport | LocalTransport | None = None
        try:
            transport = begun[host.name].result() if host.name in begun else transport_for(host, options)
            results[host.name] = work(transport)
            if keep is not None:
                keep[host.name], transport = transport, None
        except HostFailure as exc:
            failures[host.name] = exc
        except Exception as exc:  # a bug or an unexpected answer must not take the other hosts down
            failures[host.name] = HostFailure(host.name, "error", f"{type(exc).__name__}: {exc}")
        finally:
            if transport is not None:
                transport.close()

    if not hosts:
        return results, failures
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as pool:
        list(pool.map(one, hosts))
    return results, failures
