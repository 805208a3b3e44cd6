"""What `destroy` (every deployment, no --target) leaves on no host, once the replicas' units and the gateways are
gone: the internal key in each engine's form, the gateway's and the scaler's files and units, the scaler's key
and forced command, its state and its lock password. Model files (models_dir) and the engine cache (cache_dir)
stay. A host where another state (another lineage) still has units keeps the keys they need."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.gateway import GATEWAY_DIR, GATEWAY_UNIT, REPLICA_KEY, RUN_DIR, replica_key_files
from engine_ctl.core.render.scaler import COMMAND_PATH, KEY_COMMENT, SCALER_DIR, SCALER_STATE, SCALER_UNIT
from engine_ctl.core.render.scalerlock import PASSWORD_FILE
from engine_ctl.shell.transport import HostFailure, SSHOptions, transport_for

UNIT_DIR = "/etc/systemd/system"


def teardown_script(shared: bool) -> str:
    """The shell script that removes engine-ctl's own files from a host. `shared`: another state still has units
    on the host, so the replicas' key (which they read) stays."""
    units = f"{GATEWAY_UNIT} {SCALER_UNIT}"
    paths = [GATEWAY_DIR, GATEWAY_DIR + ".new", RUN_DIR, SCALER_DIR, PASSWORD_FILE, SCALER_STATE, COMMAND_PATH]
    if not shared:
        paths += [REPLICA_KEY, *replica_key_files(["0" * 64])]
    quoted = " ".join(shlex.quote(p) for p in paths)
    comment = shlex.quote(f" {KEY_COMMENT}(@[A-Za-z0-9_.-]+)?$")
    keys = '"$HOME/.ssh/authorized_keys"'
    return "; ".join([
        f"systemctl disable --now {units} 2>/dev/null",
        f"rm -f {UNIT_DIR}/{GATEWAY_UNIT} {UNIT_DIR}/{SCALER_UNIT}",
        f"rm -rf {quoted}",
        f"rmdir {shlex.quote(SCALER_STATE.rsplit('/', 1)[0])} /usr/local/lib/engine-ctl /etc/engine-ctl 2>/dev/null",
        f"if [ -f {keys} ] && grep -Eq {comment} {keys}; then umask 077; "
        f"{{ grep -Ev {comment} {keys} || true; }} > {keys}.new && mv {keys}.new {keys}; fi",
        "systemctl daemon-reload",
        "true",
    ])  # fmt: skip


def teardown(
    hosts: Iterable[Host], shared: Mapping[str, bool], options: SSHOptions | None, progress: Callable[[str], None]
) -> list[str]:
    """Run the teardown on each host; what could not be done (host: why), never raised: destroy has already
    removed the deployments, and a host out of reach is said, for the next destroy."""
    failed = []
    for host in hosts:
        try:
            t = transport_for(host, options)
            try:
                result = t.run(["sh", "-c", teardown_script(shared.get(host.name, False))], timeout=120)
            finally:
                t.close()
        except (HostFailure, OSError) as exc:
            failed.append(f"{host.name}: {exc}")
            continue
        if result.exit_code != 0:
            failed.append(f"{host.name}: {(result.stderr or result.stdout).strip()[-300:]}")
            continue
        kept = " (the replicas' key kept: another state has units there)" if shared.get(host.name) else ""
        progress(f"{host.name}: engine-ctl's keys, gateway and scaler files removed{kept}")
    return failed
