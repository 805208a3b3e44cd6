"""The scaler's part of an apply, after the deployments and the gateways: its key, its forced command on the
replica hosts, its configuration (from the recorded state: what apply placed), its program and its unit.

The key is generated on the scaler host itself (ssh-keygen there, 0600, root's): only its public half travels,
into each replica host's and each other gateway host's authorized_keys with `restrict` and a forced command that
allows start, stop, is-active and reset-failed of engine-ctl's replica units, a read-only status, and on a gateway
host the state of one server of one engine-ctl backend and its counts (remote/scaler_command.py). Nothing of the key is
in a plan, the state or a log."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping

from engine_ctl.core.documents.inventory import GATEWAY_ROLE, Host
from engine_ctl.core.plan.scaler import ScalerPlan, scaler_deployments
from engine_ctl.core.record.model import State
from engine_ctl.core.render.scaler import (
    COMMAND_PATH,
    KEY_COMMENT,
    PYTHON,
    SCALER_CONFIG,
    SCALER_DIR,
    SCALER_KEY,
    SCALER_KNOWN_HOSTS,
    SCALER_PROGRAM,
    SCALER_STATE,
    SCALER_UNIT,
    ScalerDeployment,
    render_scaler,
    sha256,
)
from engine_ctl.core.render.scalerlock import PASSWORD_FILE
from engine_ctl.shell import shipped
from engine_ctl.shell.scaler.lock import LockFailure, prepare_lock
from engine_ctl.shell.systemd import DROPPED, UNIT_DIR, drop_ins_removal, reload_then, remove_unit
from engine_ctl.shell.transport import LocalTransport, SSHOptions, SSHTransport, transport_for

Transport = SSHTransport | LocalTransport
AUTHORIZE = r"""
set -e
lines=$(cat)
mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
touch "$HOME/.ssh/authorized_keys" && chmod 600 "$HOME/.ssh/authorized_keys"
keys="$HOME/.ssh/authorized_keys"
{ grep -Ev ' %(comment)s(@[A-Za-z0-9_.-]+)?$' "$keys" || true; echo "$lines"; } > "$keys.new"
mv "$HOME/.ssh/authorized_keys.new" "$HOME/.ssh/authorized_keys"
cat /etc/ssh/ssh_host_ed25519_key.pub
"""

REVOKE = r"""
set -e
keys="$HOME/.ssh/authorized_keys"
rm -f %(command)s
[ -f "$keys" ] && grep -Eq ' %(comment)s(@[A-Za-z0-9_.-]+)?$' "$keys" || exit 0
umask 077
{ grep -Ev ' %(comment)s(@[A-Za-z0-9_.-]+)?$' "$keys" || true; } > "$keys.new"
mv "$keys.new" "$keys"
"""
"""A host the scalers no longer reach: their keys out of authorized_keys, and their forced command gone."""


def reached_names(known_hosts: str, hosts: Mapping[str, Host]) -> set[str]:
    """The inventory's hosts a scaler's known_hosts file (known_hosts_line's lines) names; an address no host of
    the inventory has any more is left out (engine-ctl has no way to reach it)."""
    by_where = {known_hosts_line(h, "").split()[0]: h.name for h in hosts.values()}
    named = (line.split()[0] for line in known_hosts.splitlines() if line.strip())
    return {by_where[w] for w in named if w in by_where}


class ScalerFailure(Exception):
    pass


def program_text() -> str:
    return shipped.script("scaler.py")


def command_text() -> str:
    return shipped.script("scaler_command.py")


def authorized_line(public_key: str, scaler: str | None = None) -> str:
    """A scaler's key on a replica host: no pty, no forwarding (restrict), only the forced command. `scaler`: the
    gateway host it is from, where each gateway host runs one (PostgreSQL lock)."""
    key = " ".join(public_key.split()[:2])
    return f'restrict,command="{PYTHON} -I -S {COMMAND_PATH}" {key} {KEY_COMMENT}' + (f"@{scaler}" if scaler else "")


def known_hosts_line(host: Host, host_key: str) -> str:
    where = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    return f"{where} {' '.join(host_key.split()[:2])}"


def _ok(t: Transport, argv: list[str], what: str, stdin: str | None = None, timeout: float = 120) -> str:
    result = t.run(argv, stdin=stdin, timeout=timeout)
    if result.exit_code != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise ScalerFailure(f"{what} failed (exit status {result.exit_code})" + (f": {said[-1]}" if said else ""))
    return result.stdout


class ScalerApply:
    def __init__(
        self, plan: ScalerPlan, hosts: Mapping[str, Host], state: Callable[[], State], options: SSHOptions | None,
        progress: Callable[[str], None], dsn: str | None = None,
    ) -> None:  # fmt: skip
        self.plan, self.hosts, self.state, self.options, self.progress = plan, hosts, state, options, progress
        self.dsn = dsn
        """The operator's state DSN, with the PostgreSQL lock: apply creates the scalers' role with it."""

    def run(self) -> None:
        """Install (or update) the scaler: on the plan's host, or with the PostgreSQL lock on every gateway host;
        remove it from the other gateway hosts, and everywhere when no deployment scales any more."""
        lock = self.plan.lock
        names = list(lock.hosts) if lock is not None else [self.plan.host]
        scalers = [self.hosts[n] for n in names if n in self.hosts]
        if not scalers:
            return
        deployments = scaler_deployments(self.state(), self.hosts)
        before = self._reached_before()
        keep = {h.name for h in scalers} if deployments else set()
        for g in self._gateways():
            if g.name not in keep:
                self._remove_from(g, forget=g.name not in names)
        if deployments:
            self.install(scalers, deployments)
        now = {r for h in scalers for r in self._reached(h, deployments)} if deployments else set()
        for name in sorted(before - now):
            self._revoke(name)

    def _reached_before(self) -> set[str]:
        """The hosts the scalers' keys were authorized on by the last apply: what their known_hosts files name."""
        reached: set[str] = set()
        for g in self._gateways():
            t = transport_for(g, self.options)
            try:
                said = t.run(["sh", "-c", f"cat {shlex.quote(SCALER_KNOWN_HOSTS)} 2>/dev/null; true"])
            finally:
                t.close()
            reached |= reached_names(said.stdout, self.hosts)
        return reached

    def _revoke(self, name: str) -> None:
        """A host no scaler reaches any more (its slots moved, or nothing scales): the scalers' keys and their
        forced command removed, so that no key is left able to start or stop its replicas."""
        t = transport_for(self.hosts[name], self.options)
        try:
            _ok(t, ["sh", "-c", REVOKE % {"comment": KEY_COMMENT, "command": shlex.quote(COMMAND_PATH)}],
                f"removing the scalers' key from {name}")  # fmt: skip
        finally:
            t.close()
        self.progress(f"scaler: its key removed from {name}")

    def install(self, scalers: list[Host], deployments: list[ScalerDeployment]) -> None:
        """Each scaler's key, all of them on the slots' hosts (forced command), the lock's role and password,
        then each scaler's files and unit."""
        transports = [(h, transport_for(h, self.options)) for h in scalers]
        try:
            several = self.plan.lock is not None
            publics = {h.name: self._key(t, h.name) for h, t in transports}
            lines = [authorized_line(publics[h.name], h.name if several else None) for h in scalers]
            reached = sorted({r for h in scalers for r in self._reached(h, deployments)})
            known = {name: self._authorize(name, lines) for name in reached}
            if self.plan.lock is not None:
                said = prepare_lock(self.plan.lock, self.dsn, [(h.name, t) for h, t in transports])
                self.progress(f"scaler lock: {said}")
            for h, t in transports:
                mine = "".join(known[r] + "\n" for r in self._reached(h, deployments))
                self._install(t, h, deployments, mine)
        except LockFailure as exc:
            raise ScalerFailure(str(exc)) from None
        finally:
            for _, t in transports:
                t.close()

    def _gateways(self) -> list[Host]:
        return sorted((h for h in self.hosts.values() if GATEWAY_ROLE in h.roles), key=lambda h: h.name)

    def _reached(self, host: Host, deployments: list[ScalerDeployment]) -> list[str]:
        """The hosts the scaler's key reaches: the slots' hosts (start, stop) and the other gateway hosts (their
        servers' states, their counts)."""
        others = {g.name for g in self._gateways() if g.name != host.name}
        return sorted({s.host for d in deployments for s in d.slots} | others)

    def _key(self, t: Transport, name: str) -> str:
        q = shlex.quote(SCALER_KEY)
        script = (f"mkdir -p {SCALER_DIR} && chmod 755 /etc/engine-ctl {SCALER_DIR} && "
                  f"{{ [ -f {q} ] || ssh-keygen -q -t ed25519 -N '' -C {KEY_COMMENT} -f {q}; }} && "
                  f"chmod 600 {q} && cat {q}.pub")  # fmt: skip
        public = _ok(t, ["sh", "-c", script], f"the scaler's key on {name}").strip()
        if not public.startswith("ssh-ed25519 "):
            raise ScalerFailure(f"the scaler's public key on {name} is not an ed25519 key")
        return public

    def _authorize(self, name: str, lines: list[str]) -> str:
        """The forced command and the scalers' keys on a replica host (any other scaler key there removed);
        returns its known_hosts line for the scalers."""
        host = self.hosts[name]
        t = transport_for(host, self.options)
        try:
            _ok(t, ["mkdir", "-p", COMMAND_PATH.rsplit("/", 1)[0]], f"preparing {COMMAND_PATH} on {name}")
            t.put(COMMAND_PATH, command_text().encode(), 0o755)
            out = _ok(t, ["sh", "-c", AUTHORIZE % {"comment": KEY_COMMENT}], f"authorizing the scaler on {name}",
                      stdin="".join(line + "\n" for line in lines))  # fmt: skip
        finally:
            t.close()
        return known_hosts_line(host, out.strip())

    def _install(self, t: Transport, host: Host, deployments: list[ScalerDeployment], known: str) -> None:
        program = program_text()
        p = self.plan
        rendered = render_scaler(host, deployments, sha256(program), self._gateways(), lock=p.lock, poll_s=p.poll_s,
                                 decide_every_s=p.decide_every_s, hold_s=p.hold_s)  # fmt: skip
        files = {SCALER_PROGRAM: program, SCALER_CONFIG: rendered.config, SCALER_KNOWN_HOSTS: known,
                 f"{UNIT_DIR}/{SCALER_UNIT}": rendered.unit_text}  # fmt: skip
        listed = " ".join(shlex.quote(f) for f in files)
        # drop-ins that change the unit are removed (then a restart): what the unit says is what runs
        before = t.run(["sh", "-c", drop_ins_removal(SCALER_UNIT) + f"sha256sum {listed} 2>/dev/null"]).stdout
        old = {ln.split()[1]: ln.split()[0] for ln in before.splitlines() if len(ln.split()) == 2}
        changed = [f for f, text in files.items() if old.get(f) != sha256(text)]
        for path in changed:
            t.put(path, files[path].encode(), 0o644)
        # a unit the plan found otherwise than apply leaves it (a process stopped by a signal, ...) starts anew
        verb = "restart" if changed or DROPPED in before or host.name in p.unit_drift else "start"
        _ok(t, reload_then(verb, SCALER_UNIT, enable=True), f"starting the scaler on {host.name}")
        names = ", ".join(d.name for d in deployments)
        self.progress(f"scaler {host.name}: {'updated' if changed else 'running'}, scaling {names}")

    def _remove_from(self, host: Host, forget: bool) -> None:
        """No scaler on `host` (none runs there in this plan): its unit, configuration and lock password gone, and
        (`forget`: a host that runs no scaler at all now, as a lock's follower did) its state.json too, so that
        nothing reads its old decisions as the scaler's."""
        extra = [SCALER_CONFIG, PASSWORD_FILE, *([SCALER_STATE] if forget else [])]
        script = remove_unit(SCALER_UNIT, *extra, only_if_installed=True)
        t = transport_for(host, self.options)
        try:
            _ok(t, ["sh", "-c", script], f"removing the scaler from {host.name}")
        finally:
            t.close()
