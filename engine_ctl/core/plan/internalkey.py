"""Whether every host holds the internal key the gateways send their replicas, and every replica accepts it. Pure.

The key itself never leaves the hosts: the facts probe reports a fingerprint of each key it finds (key_fingerprint,
the same function in engine_ctl/shell/remote/facts_probe.py), and a replica's answer to an authenticated request
sent with the key its host holds (KEY_CHECK_PATH). Where the key is:
- on a gateway host: its key file (GATEWAY_KEY, which the unit loads at a start), the copy in its run directory (what
  a reload reads) and the map in the running gateway (what each request to a replica carries);
- on an engine host: REPLICA_KEY and each engine's form of it beside (replica_key_files), which a replica's engine
  loads when it starts.

The key the first gateway's key file holds (in inventory order) is the key, else (no gateway has its file) the key the
first running gateway sends: apply gives every other place that one (engine_ctl.shell.gateway.apply's `_internal_key`
reads it so). A replica that refuses it, or whose host holds another
one (it would refuse it at its next start), is drift that apply repairs by writing the files and restarting it,
drained first; a gateway that holds another one gets it back over its runtime socket, with no restart."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.record.model import DeploymentRecord
from engine_ctl.core.render.gateway import REPLICA_KEY, internal_key_path
from engine_ctl.core.render.units import CREDENTIALS_DIR
from engine_ctl.providers import PROVIDERS, Provider

FINGERPRINT_CONTEXT = b"engine-ctl internal key fingerprint\0"
FINGERPRINT_DIGITS = 16
KEY_CHECK_PATH = "/v1/models"
"""A GET every engine answers only with its key (each provider's engine guards /v1/models; /health is open on every
one): 200 with the key the replica accepts, 401 with another."""
REFUSED = ("401", "403")


def internal_key_file(argv: Sequence[str] | None) -> str | None:
    """Where the host keeps the internal key a replica requires (it runs behind a gateway: its argv names the key
    credential systemd gives it), for a request to send it; None when it requires none."""
    credentials = tuple(f"/{p.internal_key_credential}" for p in PROVIDERS.values() if p.internal_key_credential)
    needs = any(a.startswith(CREDENTIALS_DIR + "/") and a.endswith(credentials) for a in argv or ())
    return REPLICA_KEY if needs else None  # one key a line, the one the gateways send first (render.gateway)


def key_fingerprint(key: str) -> str:
    """What the facts report of a key: 64 bits of a SHA-256 under engine-ctl's own context, enough to tell two
    256-bit keys apart and useless for sending one."""
    return hashlib.sha256(FINGERPRINT_CONTEXT + key.encode()).hexdigest()[:FINGERPRINT_DIGITS]


def key_checks(records: Iterable[DeploymentRecord]) -> dict[str, list[dict[str, object]]]:
    """host -> the requests the facts probe sends the replicas behind a gateway (those whose argv names the key):
    GET KEY_CHECK_PATH with the key the host holds."""
    out: dict[str, list[dict[str, object]]] = {}
    for record in records:
        for r in record.replicas:
            key_file = internal_key_file(r.argv)
            if key_file is not None:
                out.setdefault(r.host, []).append({"port": r.port, "path": KEY_CHECK_PATH, "key_file": key_file,
                                                   "unit": r.unit})  # sent only to the unit's own process  # fmt: skip
    return out


def key_files() -> list[str]:
    """Every file on an engine host that holds the internal key in an engine's form (the probe fingerprints them)."""
    forms = {internal_key_path(p) for p in PROVIDERS.values()} - {None}
    return sorted({REPLICA_KEY} | {f for f in forms if f is not None})


def key_sent(gateways: Iterable[Host], facts: Mapping[str, HostFacts]) -> str | None:
    """The fingerprint of the key: the first gateway's key file's (inventory order) among those reached that have
    one, else the first running gateway's (its file was deleted); None where no gateway has a key yet (apply makes
    one) or none was reached."""
    held = [facts[h.name].gateway_key or {} for h in gateways if h.name in facts]
    for place in ("file", "running"):  # a key file deleted by hand: the key the running gateway sends
        found = next((h[place] for h in held if h.get(place)), None)
        if found:
            return found
    return None


PLACES = {"file": "its key file", "copy": "its run directory's copy", "running": "the running gateway's key map"}


def gateway_key_drift(host: str, hf: HostFacts | None, sent: str | None) -> list[dict[str, str]]:
    """Where a gateway holds a key other than the key (or none, where it runs): drift that apply repairs by giving
    it the key (its files and its running map; no restart)."""
    if hf is None or sent is None or hf.gateway_files is None or hf.gateway_key is None:
        return []
    held = hf.gateway_key
    wrong = [place for place in ("file", "copy", "running") if held.get(place) not in (None, sent)]
    missing = [place for place in ("file", "copy", "running") if place in held and held[place] is None]
    if not wrong and not missing:
        return []
    said = [f"{PLACES[p]} holds another key" for p in wrong]
    said += [f"{PLACES[p]} {'holds no key' if p == 'running' else 'is missing'}" for p in missing]
    detail = f"the internal key on gateway {host}: {', '.join(said)}; apply gives it the key (fingerprint {sent[:8]}…)"
    return [{"host": host, "kind": "internal-key", "detail": detail}]


def loose_secret_drift(facts: Mapping[str, HostFacts]) -> list[dict[str, str]]:
    """Each file holding the internal key, on any host, that others may read (or that is not root's): drift that
    apply repairs by writing it again, root-only (0600), as it writes the key to every host."""
    return [
        {"host": host, "kind": "internal-key", "detail": f"{path} on {host} holds the internal key with {how}: others "
         "may read it (the key opens every replica); apply writes it again, root-only (0600)"}
        for host, hf in sorted(facts.items()) for path, how in sorted(hf.loose_secrets.items())
    ]  # fmt: skip


def key_forms(provider: Provider) -> list[str]:
    """The key files a replica of this engine depends on: REPLICA_KEY (what the probe's key check sends, and
    llama-server's own form) and the engine's form."""
    form = internal_key_path(provider)
    return sorted({REPLICA_KEY} | ({form} if form else set()))
