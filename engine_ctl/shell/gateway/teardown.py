"""What `destroy` (every deployment, no --target) leaves on no host, once the replicas' units and the gateways are
gone: the internal key in each engine's form, the gateway's and the scaler's files and units, the scaler's key
and forced command, its state and its lock password. Model files (models_dir) and the engine cache (cache_dir)
stay. A host where another state (another lineage) still has units keeps the keys they need."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.gateway import (
    GATEWAY_DIR,
    GATEWAY_UNIT,
    PRIVATE_RUN_DIR,
    REPLICA_KEY,
    RUN_DIR,
    replica_key_files,
)
from engine_ctl.core.render.scaler import (
    COMMAND_PATH,
    GATEWAY_HOST_UNITS,
    KEY_COMMENT,
    SCALER_DIR,
    SCALER_STATE,
    SCALER_UNIT,
)
from engine_ctl.core.render.scalerlock import PASSWORD_FILE
from engine_ctl.shell.systemd import UNIT_DIR, daemon_reload, disable_now
from engine_ctl.shell.transport import HostFailure, SSHOptions, transport_for


def teardown_script(gateway: bool, shared: bool) -> str:
    """The shell script that removes engine-ctl's own files from a host. `gateway`: this state's gateway (and
    scaler) host, where they go too (another state's gateway elsewhere is never touched); `shared`: another state
    still has units on the host, so the replicas' key (which they read) and the scalers' access stay."""
    steps = []
    if gateway:
        # RUN_DIR is a DynamicUser unit's link to /run/private/<name>: both go, or the next start of the gateway
        # finds its private folder with no link to it and fails (RUNTIME_DIRECTORY: File exists)
        paths = [GATEWAY_DIR, GATEWAY_DIR + ".new", RUN_DIR, PRIVATE_RUN_DIR, SCALER_DIR, PASSWORD_FILE, SCALER_STATE]
        steps += [
            disable_now(*GATEWAY_HOST_UNITS),
            f"rm -f {UNIT_DIR}/{GATEWAY_UNIT} {UNIT_DIR}/{SCALER_UNIT}",
            "rm -rf " + " ".join(shlex.quote(p) for p in paths),
        ]
    if not shared:
        comment = shlex.quote(f" {KEY_COMMENT}(@[A-Za-z0-9_.-]+)?$")
        keys = '"$HOME/.ssh/authorized_keys"'
        paths = [COMMAND_PATH, REPLICA_KEY, *replica_key_files(["0" * 64])]
        steps += [
            "rm -f " + " ".join(shlex.quote(p) for p in paths),
            f"if [ -f {keys} ] && grep -Eq {comment} {keys}; then umask 077; "
            f"{{ grep -Ev {comment} {keys} || true; }} > {keys}.new && mv {keys}.new {keys}; fi",
        ]
    folders = [SCALER_STATE.rsplit("/", 1)[0], COMMAND_PATH.rsplit("/", 1)[0], "/etc/engine-ctl"]
    steps += [f"rmdir {' '.join(folders)} 2>/dev/null", daemon_reload(), "true"]
    return "; ".join(steps)


def teardown(
    hosts: Iterable[Host], gateways: Iterable[str], shared: Iterable[str], options: SSHOptions | None,
    progress: Callable[[str], None],
) -> list[str]:  # fmt: skip
    """Run the teardown on each host; what could not be done (host: why), never raised: destroy has already
    removed the deployments, and a host out of reach is said, for the next destroy."""
    gateways, shared = set(gateways), set(shared)
    failed = []
    for host in hosts:
        script = teardown_script(host.name in gateways, host.name in shared)
        try:
            t = transport_for(host, options)
            try:
                result = t.run(["sh", "-c", script], timeout=120)
            finally:
                t.close()
        except (HostFailure, OSError) as exc:
            failed.append(f"{host.name}: {exc}")
            continue
        if result.exit_code != 0:
            failed.append(f"{host.name}: {(result.stderr or result.stdout).strip()[-300:]}")
            continue
        kept = " (the replicas' key kept: another state has units there)" if host.name in shared else ""
        progress(f"{host.name}: engine-ctl's keys and files removed{kept}")
    return failed
