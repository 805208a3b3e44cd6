"""The gateway on its hosts: install its files (checked with `haproxy -c` first), start or reload it without
dropping a connection, change its key maps and its servers' states over the stats socket (no reload)."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine_ctl.core.render.gateway import (
    ADMIN_SOCKET,
    CONFIG_FILE,
    GATEWAY_DIR,
    GATEWAY_KEY,
    GATEWAY_UNIT,
    HAPROXY,
    INTERNAL_ENV,
    INTERNAL_MAP_FILE,
    MASTER_SOCKET,
    PRIVATE_RUN_DIR,
    REPLICA_KEY,
    RUN_DIR,
    RUN_DIR_NAME,
    RUNTIME_MAPS,
    SERVER_STATE,
    START_STATE_FILE,
    RenderedGateway,
    gateway_key_text,
    misrouted,
    parse_gateway_key,
    state_across_reload,
    unix_sockets,
)
from engine_ctl.shell import shipped
from engine_ctl.shell.systemd import DROPPED, NO_SOCKET, UNIT_DIR, is_active, last_words, reload_then, unit_setup_argv
from engine_ctl.shell.transport import LocalTransport, SSHTransport, python_argv

Transport = SSHTransport | LocalTransport


class GatewayFailure(Exception):
    """A gateway step that failed, in words (its command's own stderr included)."""


@dataclass(frozen=True)
class ServerState:
    status: str
    """HAProxy's: UP, DOWN, DRAIN, MAINT, "UP 1/3" (going down), "DOWN 1/2" (going up), no check."""
    in_flight: int
    address: str = ""
    """Where it sends requests now (`show stat`'s addr): the configuration's, unless a state file kept another."""
    weight: str = ""
    """Its weight now (`show stat`'s weight): the configuration's 1, unless an admin command set another (which
    the server-state file keeps across reloads)."""


RESTART_WAIT_S = 30
"""How long an operator's verb waits for a gateway that systemd is restarting (RestartSec=2) to answer again."""


def runtime(t: Transport, commands: Sequence[object], socket: str = ADMIN_SOCKET, wait_s: float = 0) -> list[str]:
    """Send commands to the stats socket (one connection each); a {"map": name, "entries": {...}} item replaces a
    map's entries atomically (prepare, add, commit). Returns HAProxy's answers. `wait_s`: first wait at most that
    long for HAProxy to answer (a gateway restarting), instead of failing at once."""
    argv = python_argv("-c", shipped.script("gateway_maps.py"), socket, str(wait_s))
    result = t.run(argv, stdin=json.dumps(list(commands)), timeout=60 + wait_s)
    if result.exit_code != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise GatewayFailure(f"the gateway's stats socket {socket}: " + (said[-1] if said else "no answer"))
    answers: list[str] = json.loads(result.stdout)
    return answers


def set_maps(
    t: Transport, maps: Mapping[str, Mapping[str, str]], socket: str = ADMIN_SOCKET, wait_s: float = 0
) -> None:
    """Replace the key maps in the running gateway at once (no reload, no dropped connection)."""
    items = [{"map": name, "entries": dict(maps[name])} for name in RUNTIME_MAPS if name in maps]
    for answer in runtime(t, items, socket, wait_s):
        if answer.startswith("prepare failed") or "nknown" in answer or "rror" in answer:
            raise GatewayFailure(f"updating the gateway's maps: {answer.strip()}")


def parse_stat(csv_text: str) -> dict[tuple[str, str], ServerState]:
    """`show stat` CSV -> (backend, server) -> status and requests in flight (scur)."""
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("#"):
        return {}
    header = lines[0].lstrip("# ").split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") in ("FRONTEND", "BACKEND", None):
            continue
        out[(row["pxname"], row["svname"])] = ServerState(
            row.get("status", ""), int(row.get("scur") or 0), row.get("addr", ""), row.get("weight", "")
        )
    return out


def server_states(t: Transport, socket: str = ADMIN_SOCKET, wait_s: float = 0) -> dict[tuple[str, str], ServerState]:
    return parse_stat(runtime(t, ["show stat"], socket, wait_s)[0])


def wait_for(
    t: Transport,
    backend: str,
    server: str,
    ready: Callable[[ServerState], bool],
    timeout: float,
    socket: str = ADMIN_SOCKET,
) -> ServerState | None:
    """Poll the server's state until `ready` says so; the last state seen, or None if it never was."""
    deadline = time.monotonic() + timeout
    while True:
        state = server_states(t, socket).get((backend, server))
        if state is not None and ready(state):
            return state
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def old_workers(show_proc: str) -> list[int]:
    """The master CLI's `show proc` -> the pids of the workers a reload left finishing their requests."""
    section = show_proc.partition("# old workers")[2].partition("#")[0]
    return [int(line.split()[0]) for line in section.splitlines() if line.split() and line.split()[0].isdigit()]


def in_flight_in_old_workers(t: Transport, backend: str, server: str, master: str = MASTER_SOCKET) -> int:
    """Requests to one server still in flight in the workers a reload left (the admin socket reaches only the
    newest worker: a request that began before the reload is invisible there)."""
    try:
        pids = old_workers(runtime(t, ["show proc; quit"], master)[0])  # (the master keeps a connection open)
        answers = runtime(t, [f"@!{pid} show stat; quit" for pid in pids], master) if pids else []
    except GatewayFailure:  # no master socket (a gateway started by an older engine-ctl): the newest worker only
        return 0
    stats = [parse_stat(re.sub(r"^\[\d+\] ", "", a.lstrip())) for a in answers]  # the master adds "[pid] "
    return sum(s.in_flight for stat in stats if (s := stat.get((backend, server))) is not None)


def wait_drained(
    t: Transport, backend: str, server: str, timeout: float, socket: str = ADMIN_SOCKET, master: str = MASTER_SOCKET
) -> bool:
    """Wait (bounded) until no request to the server is in flight in any worker, the newest and those a reload
    left; False if some still were at the timeout."""
    deadline = time.monotonic() + timeout
    if wait_for(t, backend, server, lambda s: s.in_flight == 0, timeout, socket) is None:
        return False
    while in_flight_in_old_workers(t, backend, server, master):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def set_weight(t: Transport, backend: str, server: str, weight: str, socket: str = ADMIN_SOCKET) -> None:
    answer = runtime(t, [f"set weight {backend}/{server} {weight}"], socket)[0].strip()
    if answer and "No such" in answer:
        raise GatewayFailure(f"set weight {backend}/{server} {weight}: {answer}")


def set_state(t: Transport, backend: str, server: str, state: str, socket: str = ADMIN_SOCKET) -> None:
    answer = runtime(t, [f"set server {backend}/{server} state {state}"], socket)[0].strip()
    if answer and "No such" in answer:
        raise GatewayFailure(f"set server {backend}/{server} state {state}: {answer}")


def _ok(t: Transport, argv: list[str], what: str, timeout: float = 120, unit: bool = False) -> str:
    """Run argv; a failure is a GatewayFailure with its last line and, for the unit's start or reload (`unit`), the
    unit's last journal lines: HAProxy's own words, or systemd's."""
    result = t.run(argv, timeout=timeout)
    if result.exit_code != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        words: list[str] = []
        if unit:
            journal = t.run(last_words(GATEWAY_UNIT), timeout=30)
            words = [ln.strip() for ln in journal.stdout.splitlines() if ln.strip()] if journal.exit_code == 0 else []
        raise GatewayFailure(
            f"{what} failed (exit status {result.exit_code})"
            + (f": {said[-1]}" if said else "")
            + ("".join(f"\n    {GATEWAY_UNIT}: {ln}" for ln in words[-6:]))
        )
    return result.stdout


SECRETS_SCRIPT = r"""
import json, os, sys
given = json.load(sys.stdin)
for path, text in given["files"].items():
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if path not in given["owned"]:
        os.chmod(folder, 0o755)
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path + ".new", 0o600)
    if path in given["owned"]:  # the folder's owner reads it (the gateway's dynamic user, its run directory)
        st = os.stat(folder)
        os.chown(path + ".new", st.st_uid, st.st_gid)
    os.replace(path + ".new", path)
"""


def write_secrets(t: Transport, files: Mapping[str, str], owned: Sequence[str] = ()) -> None:
    """Write files holding a secret (0600, root's, or for those in `owned` their folder's owner's), each replaced at
    once. Their contents travel over SSH on stdin, never in an argv, a plan, the state or a log."""
    given = {"files": dict(files), "owned": list(owned)}
    result = t.run(python_argv("-c", SECRETS_SCRIPT), stdin=json.dumps(given), timeout=30)
    if result.exit_code != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise GatewayFailure(f"writing {', '.join(sorted(files))}: " + (said[-1] if said else "failed"))


def read_internal_key(t: Transport) -> tuple[str | None, str | None]:
    """The internal key a gateway host already has (from an earlier apply) and the next one, while a rotation is
    under way; (None, None) on a host with none."""
    files = " ".join(shlex.quote(p) for p in (GATEWAY_KEY, INTERNAL_ENV, REPLICA_KEY))
    result = t.run(["sh", "-c", f"for f in {files}; do [ -r $f ] && {{ cat $f; exit 0; }}; done; true"])
    return parse_gateway_key(result.stdout)


def read_running_key(t: Transport, socket: str = ADMIN_SOCKET) -> str | None:
    """The internal key a running gateway sends (its key map in memory), or None (not running, no key)."""
    try:
        answer = runtime(t, [f"show map {posixpath.dirname(socket)}/{INTERNAL_MAP_FILE}"], socket)[0]
    except GatewayFailure:
        return None
    return parse_gateway_key("\n".join(line.split(" ", 1)[-1] for line in answer.splitlines()))[0]


def internal_key_commands(map_name: str, key: str, following: str | None) -> list[str]:
    """The stats socket's commands that make a running gateway send `key` (and know `following` as next)."""
    commands = [f"set map {map_name} gateway {key}", f"del map {map_name} next"]
    return commands + ([f"add map {map_name} next {following}"] if following else [])


RUN_DIR_LINK = (
    f"if [ -d {PRIVATE_RUN_DIR} ]; then "
    f"if [ -d {RUN_DIR} ] && [ ! -L {RUN_DIR} ]; then rm -rf {RUN_DIR}; fi; "
    f"[ -e {RUN_DIR} ] || ln -s private/{RUN_DIR_NAME} {RUN_DIR}; fi"
)
"""The gateway's run directory as systemd keeps a DynamicUser unit's: a link to /run/private/<name> once the unit
has run (a plain folder beside that private one would keep the unit from starting: RUNTIME_DIRECTORY, File
exists); on a host where it never ran, the folder apply writes is moved there by systemd at the first start."""


def set_internal_key(t: Transport, key: str, following: str | None, socket: str = ADMIN_SOCKET) -> None:
    """The gateway's key map: the root-only file its unit loads at a start, the copy a reload reads in its run
    directory and, in a running gateway, the map itself (no reload: the next request carries the new key)."""
    text, name = gateway_key_text(key, following), f"{RUN_DIR}/{INTERNAL_MAP_FILE}"
    t.run(["sh", "-c", RUN_DIR_LINK])
    write_secrets(t, {GATEWAY_KEY: text, name: text}, owned=[name])
    if t.run(["sh", "-c", f"{shlex.join(is_active(GATEWAY_UNIT))} && [ -S {shlex.quote(socket)} ]"]).exit_code != 0:
        return  # not running, or with no admin socket (install restarts it): it reads the file when it starts
    answer = runtime(t, internal_key_commands(name, key, following), socket)[0].strip()
    if "nknown map" in answer:  # a gateway of an older engine-ctl (its key in its environment): its reload follows
        return
    if answer:
        raise GatewayFailure(f"changing the gateway's internal key: {answer}")


def check_config(t: Transport, path: str, host: str, haproxy: str = HAPROXY) -> None:
    """`haproxy -c` on a configuration; when it refuses it, HAProxy's own lines (its alerts, with the file and
    line they point at) are the error, never a bare exit status."""
    result = t.run([haproxy, "-c", "-f", path], timeout=120)
    if result.exit_code == 0:
        return
    lines = [ln.strip() for ln in (result.stdout + "\n" + result.stderr).splitlines() if ln.strip()]
    said = [ln for ln in lines if "ALERT" in ln] or lines
    raise GatewayFailure(f"haproxy -c on {host} refused the configuration (exit status {result.exit_code}): "
                         + (" | ".join(said[:8]) if said else "HAProxy printed nothing"))  # fmt: skip


def install(
    t: Transport, rendered: RenderedGateway, haproxy: str = HAPROXY, reload: bool = False, restart: bool = False
) -> str:
    """Put the files in place, checked first: the new set is written beside the old (GATEWAY_DIR.new), checked
    with `haproxy -c` there, then the files that changed moved in (one that did not is left untouched: its inode's
    change time tells the plan whether the running gateway loaded it, facts_probe.changed_since_load). Then start
    the unit, or reload it (master-worker: the listening sockets stay open, requests in flight finish in the old
    worker) after saving the servers' states, and set the key maps over the socket. `reload`: reload even with no
    file changed (the plan found the running gateway is not what its files say); `restart`: restart it (it runs
    another executable or command line than its unit gives: a reload keeps them); a changed unit file restarts it
    too (its settings apply at a start only). Returns what was done: started, restarted, reloaded or maps."""
    staging = GATEWAY_DIR + ".new"
    prepare = (
        f"rm -rf {staging} && mkdir -p {staging} {GATEWAY_DIR} && chmod 755 /etc/engine-ctl {GATEWAY_DIR} {staging}"
    )
    _ok(t, ["sh", "-c", prepare], "preparing the gateway directory")
    for name, text in rendered.files.items():
        t.put(f"{staging}/{name}", text.encode(), 0o644)
    check_config(t, f"{staging}/haproxy.cfg", rendered.host, haproxy)
    old = t.run(["sh", "-c", f"cd {GATEWAY_DIR} && sha256sum * {UNIT_DIR}/{GATEWAY_UNIT} 2>/dev/null"]).stdout
    before = {
        line.split()[1].rsplit("/", 1)[-1]: line.split()[0] for line in old.splitlines() if len(line.split()) == 2
    }
    moved = [n for n, sha in rendered.file_sha256.items() if before.get(n) != sha]
    moves = "".join(f"mv -f {staging}/{name} {GATEWAY_DIR}/{name} && " for name in moved)
    _ok(t, ["sh", "-c", moves + f"rm -rf {staging}"], "installing the gateway's files")
    unit_changed = before.get(GATEWAY_UNIT) != rendered.unit_sha256
    if unit_changed:
        t.put(f"{UNIT_DIR}/{GATEWAY_UNIT}", rendered.unit_text.encode(), 0o644)
    # what the unit says is what runs: drop-ins that change it removed (then a restart: a reload keeps the
    # process's environment and command line), and enabled, so that it starts at boot
    sockets = (ADMIN_SOCKET, *unix_sockets(rendered.files[CONFIG_FILE]))
    setup = t.run(unit_setup_argv(GATEWAY_UNIT, sockets))  # one exec: set up, then whether it runs
    dropped, active = DROPPED in setup.stdout, setup.exit_code == 0
    reload_files = [n for n in rendered.files if n not in RUNTIME_MAPS]
    if not active:
        start_gateway(t)
        return "started"
    deaf = NO_SOCKET in setup.stdout  # a running gateway without its admin or held sockets: only a restart makes them
    # a changed unit takes effect at a start only: a reload keeps the master's environment, credentials and
    # sandbox (the next plan would find the gateway started before its unit file changed)
    if dropped or deaf or restart or unit_changed:
        if not deaf:  # (a deaf one has no states to save: it starts from the start state)
            save_server_state(t, rendered.files[START_STATE_FILE])
        _ok(t, reload_then("restart", GATEWAY_UNIT), "restarting the gateway", unit=True)
        set_maps(t, rendered.maps, wait_s=15)
        return "restarted"
    changed = any(before.get(n) != s for n, s in rendered.file_sha256.items() if n in reload_files)
    if changed or reload or misrouted(rendered.files[CONFIG_FILE], live_addresses(t)):
        save_server_state(t, rendered.files[START_STATE_FILE])
        _ok(t, reload_then("reload", GATEWAY_UNIT), "reloading the gateway", unit=True)
        wait_reloaded(t)
        set_maps(t, rendered.maps)
        return "reloaded"
    set_maps(t, rendered.maps)
    return "maps"


SETUP_FAILURE = re.compile(r"status=2(?:[0-3][0-9]|4[0-3])/[A-Z_]+")
"""systemd's own exit statuses (200-243: EXIT_CGROUP, EXIT_NAMESPACE, ...): it failed to set the process up, before
HAProxy ran; HAProxy's own failures exit 1 (its configuration was checked with `haproxy -c` before)."""


def start_gateway(t: Transport, wait_s: float = 15) -> None:
    """Start the gateway's unit. When the start failed in systemd's own set-up of the process (seen once on a fleet
    host, cause not established: 219/CGROUP, just after systemd moved the run directory an earlier gateway left
    into /run/private), systemd starts it again by itself (Restart=always, RestartSec=2): that start is waited
    for (`wait_s`) before the failure is reported."""
    try:
        _ok(t, reload_then("start", GATEWAY_UNIT, enable=True), "starting the gateway", unit=True)
    except GatewayFailure as exc:
        if not SETUP_FAILURE.search(str(exc)):
            raise
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(1)
            if t.run(is_active(GATEWAY_UNIT)).exit_code == 0:
                return
        raise


def live_addresses(t: Transport, socket: str = ADMIN_SOCKET) -> dict[str, str]:
    """ "backend/server" -> where the running gateway sends its requests ({} when it does not answer)."""
    try:
        return {f"{b}/{s}": state.address for (b, s), state in server_states(t, socket).items()}
    except GatewayFailure:
        return {}


def save_server_state(t: Transport, start: str) -> None:
    """Dump the servers' states where the next worker loads them from (server-state-file), so a reload does not
    take servers out until their next check; a server the new configuration (whose start state is `start`) moves
    to another address or port starts DOWN there instead (state_across_reload)."""
    text = runtime(t, ["show servers state"])[0]
    t.put(SERVER_STATE, state_across_reload(text, start).encode(), 0o644)


def wait_reloaded(t: Transport, timeout: float = 30) -> None:
    """After a reload, wait for the new worker to answer on the stats socket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            runtime(t, ["show info"])
            return
        except GatewayFailure:
            time.sleep(0.3)
    raise GatewayFailure("the gateway did not come back after its reload")
