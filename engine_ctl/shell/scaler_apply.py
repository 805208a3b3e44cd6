"""The scaler's part of an apply, after the deployments and the gateways: its key, its forced command on the
replica hosts, its configuration (from the recorded state: what apply placed), its program and its unit.

The key is generated on the scaler host itself (ssh-keygen there, 0600, root's): only its public half travels,
into each replica host's and each other gateway host's authorized_keys with `restrict` and a forced command that
allows start, stop and is-active of engine-ctl's replica units, a read-only status, and on a gateway host the
state of one server of one engine-ctl backend and its counts (remote/scaler_command.py). Nothing of the key is
in a plan, the state or a log."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from importlib import resources

from engine_ctl.core.documents.inventory import GATEWAY_ROLE, Host
from engine_ctl.core.plan.scaler import ScalerPlan, scaler_deployments
from engine_ctl.core.render.scaler import (
    COMMAND_PATH,
    KEY_COMMENT,
    PYTHON,
    SCALER_CONFIG,
    SCALER_DIR,
    SCALER_KEY,
    SCALER_KNOWN_HOSTS,
    SCALER_PROGRAM,
    SCALER_UNIT,
    ScalerDeployment,
    render_scaler,
    sha256,
)
from engine_ctl.shell.transport import LocalTransport, SSHOptions, SSHTransport, transport_for
from engine_ctl.state.model import State

Transport = SSHTransport | LocalTransport
UNIT_DIR = "/etc/systemd/system"
AUTHORIZE = r"""
set -e
line=$(cat)
mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
touch "$HOME/.ssh/authorized_keys" && chmod 600 "$HOME/.ssh/authorized_keys"
{ grep -v ' %(comment)s$' "$HOME/.ssh/authorized_keys" || true; echo "$line"; } > "$HOME/.ssh/authorized_keys.new"
mv "$HOME/.ssh/authorized_keys.new" "$HOME/.ssh/authorized_keys"
cat /etc/ssh/ssh_host_ed25519_key.pub
"""


class ScalerFailure(Exception):
    pass


def program_text() -> str:
    return resources.files("engine_ctl.shell.remote").joinpath("scaler.py").read_text()


def command_text() -> str:
    return resources.files("engine_ctl.shell.remote").joinpath("scaler_command.py").read_text()


def authorized_line(public_key: str) -> str:
    """The scaler's key on a replica host: no pty, no forwarding (restrict), only the forced command."""
    key = " ".join(public_key.split()[:2])
    return f'restrict,command="{PYTHON} -I -S {COMMAND_PATH}" {key} {KEY_COMMENT}'


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
    def __init__(self, plan: ScalerPlan, hosts: Mapping[str, Host], state: Callable[[], State],
                 options: SSHOptions | None, progress: Callable[[str], None]) -> None:  # fmt: skip
        self.plan, self.hosts, self.state, self.options, self.progress = plan, hosts, state, options, progress

    def run(self) -> None:
        """Install (or update) the scaler; remove it where no deployment scales any more."""
        host = self.hosts.get(self.plan.host)
        if host is None:
            return
        self.install(host, scaler_deployments(self.state(), self.hosts))

    def install(self, host: Host, deployments: list[ScalerDeployment]) -> None:
        """The key, the forced command on the slots' hosts, then the scaler's files and unit (removed when no
        deployment scales)."""
        t = transport_for(host, self.options)
        try:
            if not deployments:
                self._remove(t)
                return
            public = self._key(t)
            known = [self._authorize(h, public) for h in self._reached(host, deployments)]
            self._install(t, host, deployments, "".join(line + "\n" for line in known))
        finally:
            t.close()

    def _gateways(self) -> list[Host]:
        return sorted((h for h in self.hosts.values() if GATEWAY_ROLE in h.roles), key=lambda h: h.name)

    def _reached(self, host: Host, deployments: list[ScalerDeployment]) -> list[str]:
        """The hosts the scaler's key reaches: the slots' hosts (start, stop) and the other gateway hosts (their
        servers' states, their counts)."""
        others = {g.name for g in self._gateways() if g.name != host.name}
        return sorted({s.host for d in deployments for s in d.slots} | others)

    def _key(self, t: Transport) -> str:
        q = shlex.quote(SCALER_KEY)
        script = (f"mkdir -p {SCALER_DIR} && chmod 755 /etc/engine-ctl {SCALER_DIR} && "
                  f"{{ [ -f {q} ] || ssh-keygen -q -t ed25519 -N '' -C {KEY_COMMENT} -f {q}; }} && "
                  f"chmod 600 {q} && cat {q}.pub")  # fmt: skip
        public = _ok(t, ["sh", "-c", script], f"the scaler's key on {self.plan.host}").strip()
        if not public.startswith("ssh-ed25519 "):
            raise ScalerFailure(f"the scaler's public key on {self.plan.host} is not an ed25519 key")
        return public

    def _authorize(self, name: str, public: str) -> str:
        """The forced command and the key on a replica host; returns its known_hosts line for the scaler."""
        host = self.hosts[name]
        t = transport_for(host, self.options)
        try:
            _ok(t, ["mkdir", "-p", COMMAND_PATH.rsplit("/", 1)[0]], f"preparing {COMMAND_PATH} on {name}")
            t.put(COMMAND_PATH, command_text().encode(), 0o755)
            out = _ok(t, ["sh", "-c", AUTHORIZE % {"comment": KEY_COMMENT}], f"authorizing the scaler on {name}",
                      stdin=authorized_line(public) + "\n")  # fmt: skip
        finally:
            t.close()
        return known_hosts_line(host, out.strip())

    def _install(self, t: Transport, host: Host, deployments: list[ScalerDeployment], known: str) -> None:
        program = program_text()
        p = self.plan
        rendered = render_scaler(host, deployments, sha256(program), self._gateways(), poll_s=p.poll_s,
                                 decide_every_s=p.decide_every_s, hold_s=p.hold_s)  # fmt: skip
        files = {SCALER_PROGRAM: program, SCALER_CONFIG: rendered.config, SCALER_KNOWN_HOSTS: known,
                 f"{UNIT_DIR}/{SCALER_UNIT}": rendered.unit_text}  # fmt: skip
        listed = " ".join(shlex.quote(f) for f in files)
        before = t.run(["sh", "-c", f"sha256sum {listed} 2>/dev/null"]).stdout
        old = {ln.split()[1]: ln.split()[0] for ln in before.splitlines() if len(ln.split()) == 2}
        changed = [f for f, text in files.items() if old.get(f) != sha256(text)]
        for path in changed:
            t.put(path, files[path].encode(), 0o644)
        verb = "restart" if changed else "start"
        _ok(t, ["sh", "-c", f"systemctl daemon-reload && systemctl enable {SCALER_UNIT} && systemctl {verb} "
                f"{SCALER_UNIT}"], f"starting the scaler on {host.name}")  # fmt: skip
        names = ", ".join(d.name for d in deployments)
        self.progress(f"scaler {host.name}: {'updated' if changed else 'running'}, scaling {names}")

    def _remove(self, t: Transport) -> None:
        script = (f"[ -f {UNIT_DIR}/{SCALER_UNIT} ] || exit 0; systemctl disable --now {SCALER_UNIT}; "
                  f"rm -f {UNIT_DIR}/{SCALER_UNIT} {SCALER_CONFIG}; systemctl daemon-reload")  # fmt: skip
        _ok(t, ["sh", "-c", script], f"removing the scaler from {self.plan.host}")
