"""How facts' time grows with hosts: 1, 4, 8 and 16 fleet hosts, against the floor (N parallel `ssh host true`)
and Ansible's `-m setup` on the same hosts, in-process (gather) and as a whole `engine-ctl facts` process; then
16 hosts with the fan-out bounded (`--fanout 1, 4, 8`). One SSH connection and one remote process per host.
Targets (issue 10, whole processes): 1 host <= 2x one `ssh true`, 16 hosts <= 1.3x the floor.

Run as root:  .venv/bin/python -m bench.facts [--runs 3] [--no-ansible]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.startup import ENV, boot_fleet, engine_ctl, release_fleet
from engine_ctl.core.documents.inventory import load_inventory
from engine_ctl.shell.gather import gather
from tests import fleet as fleet_mod

SIZES = (1, 4, 8, 16)


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(timed(fn) for _ in range(runs))


def ssh_true(fleet: fleet_mod.Fleet, hosts: list[fleet_mod.FleetHost]) -> None:
    def one(h: fleet_mod.FleetHost) -> None:
        subprocess.run([*fleet.ssh_argv(h), "true"], check=True, capture_output=True)

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        list(pool.map(one, hosts))


def facts_cli(fleet: fleet_mod.Fleet, *args: str) -> None:
    """A whole `engine-ctl facts --json` process, as a user runs it."""
    argv = [*engine_ctl(), "facts", "--inventory", fleet.inventory, "--json", *args]
    subprocess.run(argv, check=True, capture_output=True, env=ENV)


def ansible_setup(inventory: Path, n: int, env: dict[str, str]) -> None:
    subprocess.run(
        ["ansible", "all", "-i", str(inventory), "-m", "setup", "-f", str(n), "--limit", f"all[0:{n - 1}]"],
        check=True, capture_output=True, env=env,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-ansible", action="store_true")
    parser.add_argument("--hosts", type=int, default=max(SIZES), help="the largest fleet measured (1, 4, 8, 16)")
    args = parser.parse_args()
    sizes = [n for n in SIZES if n <= args.hosts]

    fleet = boot_fleet(max(sizes))
    try:
        inv = load_inventory(Path(fleet.inventory))
        ansible = shutil.which("ansible") and not args.no_ansible
        env = dict(os.environ)
        tmp = Path(tempfile.mkdtemp())
        ini = tmp / "hosts.ini"
        ini.write_text(
            "[fleet]\n"
            + "".join(
                f"{h.name} ansible_host={h.address} ansible_user=root ansible_ssh_private_key_file={fleet.key} "
                "ansible_python_interpreter=/usr/bin/python3\n"
                for h in fleet.hosts
            )
        )
        env["ANSIBLE_HOST_KEY_CHECKING"] = "True"
        env["ANSIBLE_SSH_ARGS"] = f"-o UserKnownHostsFile={fleet.known_hosts} -o StrictHostKeyChecking=yes"
        print(
            f"{'hosts':>5} {'ssh true':>9} {'facts':>8} {'ratio':>6} {'CLI':>7} {'ratio':>6} {'ansible':>8} "
            f"{'vs ansible':>10}"
        )
        for n in sizes:
            hosts = fleet.hosts[:n]
            floor = median(lambda hosts=hosts: ssh_true(fleet, hosts), args.runs)
            selected = list(inv.hosts[:n])
            ours = median(lambda selected=selected: gather(selected), args.runs)
            names = [h.name for h in selected]
            cli = median(lambda names=names: facts_cli(fleet, *names), args.runs)
            peer = median(lambda n=n: ansible_setup(ini, n, env), 1) if ansible else float("nan")
            print(
                f"{n:>5} {floor:>8.2f}s {ours:>7.2f}s {ours / floor:>5.2f}x {cli:>6.2f}s {cli / floor:>5.2f}x "
                f"{peer:>7.2f}s {peer / ours:>9.1f}x"
            )
        print("ratio = facts / floor; CLI = a whole `engine-ctl facts` process; vs ansible = ansible / facts")
        print(f"{max(sizes)} hosts, fan-out bounded:")
        largest = [h.name for h in inv.hosts[: max(sizes)]]  # a fleet kept up may have more hosts than measured
        for bound in (1, 4, 8):
            took = median(lambda bound=bound: facts_cli(fleet, "--fanout", str(bound), *largest), args.runs)
            print(f"  --fanout {bound:<2} {took:6.2f}s")
    finally:
        release_fleet(fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
