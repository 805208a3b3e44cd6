"""The test fleet: real hosts with systemd as PID 1 and sshd, each in its own network namespace.

Each host boots with `systemd-nspawn -b` on an overlayfs whose lower layer is this machine's `/` (so the
llama-server built here is visible inside), gets its own SSH host keys and the fleet's test key, and
answers SSH on 198.18.0.(10+i) (RFC 2544's benchmarking range) behind the bridge `ectl-br0`.
Everything it creates is named with the prefix `ectl`, and leftovers with that prefix are cleared first.

Several fleets can run side by side (one per run): fleet id N (0 to 24) names everything `ectl` (0) or `ect<letter>`
(1: ecta, 2: ectb, ..., 11: ectk, 12: ectm: `l` is id 0's), uses 198.18.N.0/24 and /var/tmp/engine-ctl-fleet-N.
ENGINE_CTL_FLEET_ID=N chooses the id; unset, a run takes the lowest id no live run owns (and reserves it at import).
A fleet is owned: /var/tmp/engine-ctl-fleet-owners/N.json holds the owner's PID (with its start time) and checkout,
and up() and down() refuse to clear a fleet whose owner is another live process.
ENGINE_CTL_FLEET_ROOT moves /var/tmp.

From a shell:  python -m tests.fleet up 4   |   python -m tests.fleet down   |   python -m tests.fleet status
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEETS = Path(os.environ.get("ENGINE_CTL_FLEET_ROOT", "/var/tmp"))
OWNERS = FLEETS / "engine-ctl-fleet-owners"
IDS = range(25)


class FleetBusy(RuntimeError):
    """The fleet id is owned by a live process of another run: clearing it would stomp that run."""


def base_of(fleet_id: int) -> Path:
    return FLEETS / ("engine-ctl-fleet" + (f"-{fleet_id}" if fleet_id else ""))


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot), or "" when there is no such process: a PID and its start
    time name one process, even after the PID is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Owner:
    pid: int
    start: str
    checkout: str
    since: str = ""

    def live(self) -> bool:
        return self.pid > 0 and _start_time(self.pid) == self.start

    def mine(self) -> bool:
        return self.pid == os.getpid()

    def __str__(self) -> str:
        return f"PID {self.pid} of the checkout {self.checkout} (since {self.since})"


def owner_of(fleet_id: int) -> Owner | None:
    try:
        return Owner(**json.loads((OWNERS / f"{fleet_id}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _other_live_owner(fleet_id: int) -> Owner | None:
    owner = owner_of(fleet_id)
    return owner if owner is not None and owner.live() and not owner.mine() else None


def _unowned_but_running(fleet_id: int) -> bool:
    """A fleet booted before owner files (no owner file) whose hosts still run: maybe in use, so not free."""
    state = base_of(fleet_id) / "fleet.json"
    if owner_of(fleet_id) is not None or not state.exists():
        return False
    try:
        pids = [int(h["pid"]) for h in json.loads(state.read_text())["hosts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(_start_time(pid) for pid in pids if pid > 0)


@contextlib.contextmanager
def _owners_locked() -> Iterator[None]:
    """One process at a time reads and writes the owner files (flock, released when the process dies)."""
    OWNERS.mkdir(parents=True, exist_ok=True)
    with open(OWNERS / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _claim(fleet_id: int) -> None:
    me = Owner(os.getpid(), _start_time(os.getpid()), str(ROOT), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    tmp = OWNERS / f".{fleet_id}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(asdict(me)))
    tmp.replace(OWNERS / f"{fleet_id}.json")


def _release(fleet_id: int) -> None:
    owner = owner_of(fleet_id)
    if owner is not None and (owner.mine() or not owner.live()):
        (OWNERS / f"{fleet_id}.json").unlink(missing_ok=True)


def _free(fleet_id: int) -> bool:
    return _other_live_owner(fleet_id) is None and not _unowned_but_running(fleet_id)


def pick_fleet_id() -> int:
    """ENGINE_CTL_FLEET_ID when set; otherwise the lowest id no live run owns, reserved for this process."""
    chosen = os.environ.get("ENGINE_CTL_FLEET_ID")
    if chosen is not None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...: workers side by side, a fleet each
        offset = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
        if not chosen.isdigit() or int(chosen) + offset not in IDS:
            raise SystemExit(f"ENGINE_CTL_FLEET_ID={chosen} (+{offset} for pytest-xdist's {worker or 'main'}): write "
                             f"{IDS[0]} to {IDS[-1] - offset}")  # fmt: skip
        return int(chosen) + offset
    try:
        with _owners_locked():
            fleet_id = next((i for i in IDS if _free(i)), None)
            if fleet_id is not None:
                _claim(fleet_id)
    except OSError:  # the owner files are not ours to write (not root): choose without reserving
        fleet_id = next((i for i in IDS if _free(i)), None)
    if fleet_id is None:
        busy = "\n".join(f"  {i}: {owner_of(i) or 'hosts running, no owner file'}" for i in IDS)
        raise SystemExit(f"every fleet id is in use by a live run:\n{busy}\nwait for one, or `down` a stale one")
    return fleet_id


FLEET_ID = pick_fleet_id()
LETTERS = "abcdefghijkmnopqrstuvwxyz"  # every letter but `l`: `ectl` is id 0's
PREFIX = "ectl" if FLEET_ID == 0 else f"ect{LETTERS[FLEET_ID - 1]}"  # all four letters: none prefixes another
BRIDGE = f"{PREFIX}-br0"
SUBNET = f"198.18.{FLEET_ID}"
BASE = base_of(FLEET_ID)
STATE = BASE / "fleet.json"
MASK = (
    "systemd-firstboot.service", "postgresql.service", "cron.service", "exim4.service", "getty@tty1.service",
    "console-getty.service", "systemd-timesyncd.service", "haproxy.service", "apt-daily.timer",
    "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer", "fstrim.timer", "docker.service",
    "docker.socket", "containerd.service", "systemd-journald-audit.socket",
)  # fmt: skip


def sh(*argv: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a set-up command; a best-effort one (check=False) stays quiet about what is already gone."""
    return subprocess.run(list(argv), check=check, text=True, capture_output=capture or not check)


@dataclass
class FleetHost:
    name: str
    address: str
    root: str
    pid: int = 0


@dataclass
class Fleet:
    hosts: list[FleetHost] = field(default_factory=list)
    key: str = ""
    known_hosts: str = ""
    inventory: str = ""

    def save(self) -> None:
        STATE.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls) -> Fleet:
        data = json.loads(STATE.read_text())
        return cls(hosts=[FleetHost(**h) for h in data.pop("hosts")], **data)

    def ssh_argv(self, host: FleetHost) -> list[str]:
        return [
            "ssh", "-i", self.key, "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{host.address}",
        ]  # fmt: skip

    def ssh(self, host: FleetHost, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.ssh_argv(host), command], capture_output=True, text=True, check=check, timeout=60)

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.hosts if h.name == name)


def clear_leftovers() -> None:
    """Remove whatever an earlier run with our prefix left: processes in our namespaces, mounts, links."""
    if STATE.exists():
        try:
            for h in Fleet.load().hosts:
                _kill(h.pid)
        except (ValueError, KeyError, TypeError):
            pass
    netns = sh("ip", "netns", "list", capture=True, check=False).stdout.split("\n")
    for line in netns:
        name = line.split(" ")[0]
        if name.startswith(PREFIX):
            pids = sh("ip", "netns", "pids", name, capture=True, check=False).stdout.split()
            for pid in pids:
                _kill(int(pid), grace=0.0)
            sh("ip", "netns", "del", name, check=False)
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        target = line.split()[1]
        if target.startswith(str(BASE)):
            sh("umount", "-l", target, check=False)
    links = sh("ip", "-o", "link", "show", capture=True, check=False).stdout.splitlines()
    for line in links:
        dev = line.split(":")[1].strip().split("@")[0]
        if dev.startswith(PREFIX):
            sh("ip", "link", "del", dev, check=False)
    if BASE.exists():
        sh("rm", "-rf", "--one-file-system", str(BASE), check=False)


def _kill(pid: int, grace: float = 5.0) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _prepare_host(i: int, pubkey: str) -> FleetHost:
    name = f"{PREFIX}{i}"
    address = f"{SUBNET}.{10 + i}"
    base = BASE / name
    upper, work, root = base / "upper", base / "work", base / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}", str(root))
    units = root / "etc/systemd/system"
    for unit in MASK:
        link = units / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    for old in (root / "etc/systemd/system").glob("engine-ctl-*.service"):
        old.unlink()
    (root / "etc/hostname").write_text(name + "\n")
    (root / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    sh("ssh-keygen", "-A", "-f", str(root), capture=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    (ssh_dir / "authorized_keys").chmod(0o600)
    # the network: a namespace with eth0 on our bridge
    veth = f"{name}-v"
    sh("ip", "netns", "add", name)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{name}-p")
    sh("ip", "link", "set", f"{name}-p", "netns", name)
    sh("ip", "link", "set", veth, "master", BRIDGE, "up")
    for cmd in (
        ["ip", "link", "set", f"{name}-p", "name", "eth0"],
        ["ip", "addr", "add", f"{address}/24", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "link", "set", "lo", "up"],
        ["ip", "route", "add", "default", "via", f"{SUBNET}.1"],
    ):
        sh("ip", "netns", "exec", name, *cmd)
    log = open(base / "nspawn.log", "w")  # noqa: SIM115 - kept open by the child
    proc = subprocess.Popen(
        ["systemd-nspawn", "-q", "-D", str(root), "-b", f"--machine={name}", "--register=no", "--keep-unit",
         f"--network-namespace-path=/run/netns/{name}", "--console=passive"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return FleetHost(name=name, address=address, root=str(root), pid=proc.pid)


def _wait_ssh(host: FleetHost, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = sh("ssh-keyscan", "-T", "2", "-t", "ed25519", host.address, capture=True, check=False).stdout
        if out.strip():
            return out
        time.sleep(0.3)
    raise RuntimeError(f"{host.name} ({host.address}) did not answer SSH within {timeout:.0f} s")


def _take_ownership() -> None:
    """Own FLEET_ID before clearing it, or refuse: another live run's fleet is never stomped."""
    with _owners_locked():
        other = _other_live_owner(FLEET_ID)
        if other is not None:
            raise FleetBusy(
                f"fleet {FLEET_ID} ({PREFIX}*) is in use by {other}; it is not cleared. "
                "Unset ENGINE_CTL_FLEET_ID to take the next free id, or set another one (0 to 24)"
            )
        _claim(FLEET_ID)


def up(n: int, engines: dict[str, object] | None = None) -> Fleet:
    _take_ownership()
    clear_leftovers()
    BASE.mkdir(parents=True, exist_ok=True)
    key = BASE / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "engine-ctl-fleet", "-f", str(key))
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    pubkey = (BASE / "id_ed25519.pub").read_text()
    fleet = Fleet(key=str(key), known_hosts=str(BASE / "known_hosts"), inventory=str(BASE / "hosts.yaml"))
    try:
        for i in range(1, n + 1):
            fleet.hosts.append(_prepare_host(i, pubkey))
            fleet.save()
        with ThreadPoolExecutor(max_workers=n) as pool:
            keys = list(pool.map(_wait_ssh, fleet.hosts))
    except BaseException:
        down(fleet)
        raise
    Path(fleet.known_hosts).write_text("".join(keys))
    lines = [
        "# the test fleet (tests/fleet.py)",
        "defaults:",
        "  user: root",
        f"  identity_file: {fleet.key}",
        f"  known_hosts: {fleet.known_hosts}",
        "  connect_timeout: 5",
        *([f"  engines: {json.dumps(engines)}"] if engines else []),
        "hosts:",
        *(f"  - {{name: {h.name}, address: {h.address}}}" for h in fleet.hosts),
    ]
    Path(fleet.inventory).write_text("\n".join(lines) + "\n")
    fleet.save()
    return fleet


def down(fleet: Fleet | None = None) -> None:
    _take_ownership()
    try:
        _down(fleet)
    finally:
        with _owners_locked():
            _release(FLEET_ID)


def _down(fleet: Fleet | None) -> None:
    if fleet is None:
        if not STATE.exists():
            clear_leftovers()
            return
        fleet = Fleet.load()
    with ThreadPoolExecutor(max_workers=max(1, len(fleet.hosts))) as pool:
        list(pool.map(lambda h: _kill(h.pid), fleet.hosts))
    for h in fleet.hosts:
        sh("umount", "-l", h.root, check=False)
        sh("ip", "netns", "del", h.name, check=False)
        sh("ip", "link", "del", f"{h.name}-v", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    clear_leftovers()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "status"):
        print(__doc__)
        return 2
    if argv[0] == "up":
        from tests.llama import llama_engine

        fleet = up(int(argv[1]) if len(argv) > 1 else 4, engines={"llama.cpp": llama_engine()})
        print(f"fleet {FLEET_ID}: {len(fleet.hosts)} hosts up; inventory: {fleet.inventory}")
        print(f"  take it down with: ENGINE_CTL_FLEET_ID={FLEET_ID} python -m tests.fleet down")
        for h in fleet.hosts:
            print(f"  {h.name}  {h.address}   ssh: {' '.join(fleet.ssh_argv(h))}")
        return 0
    if argv[0] == "down":
        down()
        print("fleet down")
        return 0
    print(f"fleet {FLEET_ID}, owner: {owner_of(FLEET_ID) or 'none'}")
    if STATE.exists():
        print(STATE.read_text())
    else:
        print("no fleet")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
