"""What changes an engine-ctl unit outside its file: whether it is enabled, and its drop-ins. Pure.

A unit engine-ctl enables (an always-on replica, a gateway, the scaler) that is not enabled (`systemctl disable`,
or `enabled-runtime`: for this boot only) would not start at the next boot: drift, which apply enables.

Drop-ins: the files that change a unit without touching its file (`systemctl edit`, `systemctl set-property`,
a hand-written `<unit>.d/*.conf`).

systemd reads a unit's drop-ins from `<root>/<unit>.d/` and from the directories named for each of its dash-prefixes
(`engine-ctl-.service.d` for every `engine-ctl-*.service`), under each unit root, and from `service.d/` (every
service on the host). Those under the roots a person or `systemctl` writes (/etc and /run) in a directory named for
an engine-ctl unit change what engine-ctl rendered: they are drift, and apply removes them. The type-wide
`service.d/` (distributions and containers put theirs there) and prefix directories outside engine-ctl's names
serve other units too: engine-ctl neither reports nor removes them."""

from __future__ import annotations

from collections.abc import Iterable

from engine_ctl.core.names import UNIT_PREFIX

DROP_IN_ROOTS = (
    "/etc/systemd/system",
    "/etc/systemd/system.control",
    "/run/systemd/system",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/run/systemd/generator",
    "/run/systemd/generator.late",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
"""Every unit directory systemd reads a unit's drop-ins from (systemd.unit(5), the unit load path): where
`systemctl edit` (/etc), `systemctl edit --runtime` (/run) and `systemctl set-property [--runtime]`
(system.control) write them, and the packages' and generators' directories, which change a unit as much."""


OUTRANKING_ROOTS = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
)
"""Unit directories systemd reads before /etc/systemd/system (systemd.unit(5), the unit load path): a file there
named as an engine-ctl unit is the unit systemd loads (its FragmentPath), and engine-ctl's own file is ignored."""


def outranking_files(unit: str, fragment_path: str | None) -> tuple[str, ...]:
    """systemd's FragmentPath for `unit` when it is a file that outranks engine-ctl's (drift, which apply removes),
    else nothing."""
    if not fragment_path or not unit.startswith(UNIT_PREFIX):
        return ()
    where, _, name = fragment_path.rpartition("/")
    return (fragment_path,) if where in OUTRANKING_ROOTS and name == unit else ()


def drop_in_dirs(unit: str) -> tuple[str, ...]:
    """The drop-in directories systemd reads for `unit` that are named for engine-ctl's units: its dash-prefixes
    from `engine-ctl-` on (`engine-ctl-.service.d`, `engine-ctl-chat-.service.d`, ...), then its own."""
    stem, dot, suffix = unit.rpartition(".")
    if not dot or not unit.startswith(UNIT_PREFIX):
        return ()
    out = []
    at = len(UNIT_PREFIX) - 1
    while at != -1:
        out.append(f"{stem[: at + 1]}.{suffix}.d")
        at = stem.find("-", at + 1)
    out.append(f"{unit}.d")
    return tuple(out)


def own_drop_ins(unit: str, paths: Iterable[str]) -> tuple[str, ...]:
    """Of systemd's DropInPaths for `unit`, the ones that are drift: under a root of DROP_IN_ROOTS, in a directory
    of drop_in_dirs(unit)."""
    dirs = {f"{root}/{d}" for root in DROP_IN_ROOTS for d in drop_in_dirs(unit)}
    return tuple(sorted(p for p in paths if p.rpartition("/")[0] in dirs))


def shared_drop_ins(unit: str, paths: Iterable[str]) -> tuple[str, ...]:
    """Of systemd's DropInPaths for `unit`, the ones an administrator wrote (under /etc) that change it from a
    directory not named for it (`service.d/`, `engine-.service.d/`: every service, or every unit named `engine-…`,
    alike). Not engine-ctl's, so apply removes none of them; the plan warns of each (shared_drop_in_warning), never
    passes one over in silence. Those a package or a container ships (/usr/lib, /run: LXC's service.d) are not
    named: every host of that kind has them."""
    ours = set(own_drop_ins(unit, paths))
    return tuple(sorted(p for p in paths if p not in ours and p.startswith("/etc/") and p.endswith(".conf")))


def shared_drop_in_warning(what: str, host: str, unit: str, paths: Iterable[str]) -> str:
    listed = ", ".join(paths)
    return (
        f"{what} on {host}: {listed} changes {unit} though it is no drop-in of engine-ctl's (it changes other "
        "units alike): apply leaves it; remove it unless it is meant"
    )


def not_enabled_detail(host: str, unit: str, unit_file_state: str | None) -> str:
    """The drift's words for a unit engine-ctl enables that is not enabled."""
    return f"{unit} is {unit_file_state} on {host}, not enabled: it would not start at boot; apply enables it"


def drop_ins_detail(unit: str, host: str, paths: Iterable[str]) -> str:
    """The drift's words: which drop-ins change the unit (or which file outranks its own), and what apply does."""
    paths = list(paths)
    whole = [p for p in paths if p.rpartition("/")[0] in OUTRANKING_ROOTS and p.rpartition("/")[2] == unit]
    said = []
    if whole:
        said.append(f"{', '.join(whole)} replaces {unit} on {host} (systemd loads it, not engine-ctl's file in "
                    "/etc/systemd/system)")  # fmt: skip
    rest = [p for p in paths if p not in whole]
    if rest:
        said.append(f"drop-in files change {unit} on {host} ({', '.join(rest)})")
    return "; ".join(said) + (": apply removes it" if whole and not rest else ": apply removes them")


__all__ = [
    "DROP_IN_ROOTS",
    "OUTRANKING_ROOTS",
    "drop_in_dirs",
    "drop_ins_detail",
    "not_enabled_detail",
    "outranking_files",
    "own_drop_ins",
    "shared_drop_in_warning",
    "shared_drop_ins",
]
