"""Every systemctl and journalctl command engine-ctl runs on a host, built as data (argv lists, or `sh -c` text
where one exec must do several things): the executor, the gateway, the scaler, the lifecycle verbs and logs run
them through a transport, and tests read them without a host. Nothing here runs anything."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence

from engine_ctl.core.fit.startup import measure_script, sampler
from engine_ctl.core.render.guard import GUARD_LINE, guard_name
from engine_ctl.core.render.units import EXITS_DIR
from engine_ctl.core.unitsetup import DROP_IN_ROOTS, OUTRANKING_ROOTS, drop_in_dirs

UNIT_DIR = "/etc/systemd/system"


def is_active(unit: str) -> list[str]:
    """Exit 0 when the unit is active (running, or reloading), else non-zero."""
    return ["systemctl", "is-active", "--quiet", unit]


def daemon_reload() -> str:
    """Shell text: systemd re-reads every unit file (0.3-1 s); used only where a file changed."""
    return "systemctl daemon-reload"


def reload_then(verb: str, unit: str, *, enable: bool = False) -> list[str]:
    """Reload systemd, (enable and) then `verb` the unit: `start`, `reload` or `restart`. A start resets the unit
    first when it failed: a unit that crashed in a loop (Restart=always) is in systemd's start limit, where a plain
    start fails at once ("start request repeated too quickly")."""
    q = shlex.quote(unit)
    enabled = f"systemctl enable {q} && " if enable else ""
    reset = f"{{ systemctl reset-failed {q} 2>/dev/null; true; }} && " if verb in ("start", "restart") else ""
    return ["sh", "-c", f"{daemon_reload()} && {enabled}{reset}systemctl {verb} {q}"]


def last_words(unit: str, lines: int = 8) -> list[str]:
    """The unit's last journal lines, its program's own words (for a start or reload that failed)."""
    return ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", unit]


def show(properties: Sequence[str], units: Sequence[str]) -> list[str]:
    """`systemctl show` of some properties of some units, in the order given (one blank line between units)."""
    return ["systemctl", "show", "-p", ",".join(properties), "--", *units]


def start_unit_argv(unit: str, wait: bool) -> list[str]:
    """Enable and start an installed unit: with `wait`, returns once its health gate passed (or failed)."""
    q = shlex.quote(unit)
    block = "" if wait else "--no-block "
    return ["sh", "-c", f"systemctl reset-failed {q} 2>/dev/null; systemctl enable --no-reload {q} && "
            f"{{ {_reload_unless_loaded(q)}; }} && systemctl start {block}{q}"]  # fmt: skip


def disable_now(*units: str) -> str:
    """Shell text: disable and stop units, quietly (one that is not there is no error)."""
    return f"systemctl disable --now {' '.join(shlex.quote(u) for u in units)} 2>/dev/null"


PRUNE_NAMED = 3
"""prune_checkout's exit status when a unit file still names the checkout: nothing was deleted."""


def prune_checkout(path: str, unit_dir: str = UNIT_DIR) -> list[str]:
    """Delete an hf: checkout no deployment uses any more (and its fetch's lock file), unless a unit file on the
    host names it by now (exit PRUNE_NAMED, the unit on stderr); then its repository's and organisation's folders
    if they are left empty."""
    q = shlex.quote(path.rstrip("/"))
    repo, org = posixpath.dirname(path.rstrip("/")), posixpath.dirname(posixpath.dirname(path.rstrip("/")))
    check = (f"for f in {shlex.quote(unit_dir)}/engine-ctl-*.service; do [ -f \"$f\" ] && grep -qF -- {q} \"$f\" && "
             f"{{ echo \"still named by $f\" >&2; exit {PRUNE_NAMED}; }}; done; ")  # fmt: skip
    tidy = f"rmdir -- {shlex.quote(repo)} 2>/dev/null; rmdir -- {shlex.quote(org)} 2>/dev/null; true"
    beside = " ".join(shlex.quote(path.rstrip("/") + end) for end in (".partial", ".lock"))  # the fetch's
    return ["sh", "-c", check + f"rm -rf -- {q} {beside} || exit 1; " + tidy]


def remove_unit(unit: str, *paths: str, only_if_installed: bool = False) -> str:
    """Shell text: disable and stop a unit, delete its file (and `paths`) and its own drop-in directories, reload
    systemd. With `only_if_installed`, nothing at all happens on a host without the unit file (exit 0)."""
    q, path = shlex.quote(unit), shlex.quote(f"{UNIT_DIR}/{unit}")
    first = (
        f"[ -f {path} ] || exit 0; systemctl disable --now {q}"
        if only_if_installed
        else (f"systemctl disable --now {q} 2>/dev/null")
    )
    own = " ".join(shlex.quote(p) for p in [*(f"{root}/{unit}.d" for root in DROP_IN_ROOTS),
                                            *(f"{root}/{unit}" for root in OUTRANKING_ROOTS)])  # fmt: skip
    return f"{first}; rm -f {' '.join([path, *paths])}; rm -rf {own}; {daemon_reload()}"


DROPPED = "engine-ctl: drop-ins removed"
"""What drop_ins_removal prints when it removed any."""


def drop_ins_removal(*units: str) -> str:
    """Shell text: remove the drop-in directories that change these engine-ctl units (engine_ctl.core.unitsetup:
    `systemctl edit`, `set-property`, a hand-written `<unit>.d`) and the files named as them in a directory systemd
    reads first (OUTRANKING_ROOTS); if there was any, print DROPPED and reload systemd
    (a guard's drop-in leaves its replica's unit with nothing to reload for)."""
    paths = sorted(
        {f"{root}/{d}" for unit in units for root in DROP_IN_ROOTS for d in drop_in_dirs(unit)}
        | {f"{root}/{unit}" for unit in units for root in OUTRANKING_ROOTS}
    )  # a file that outranks it
    listed = " ".join(shlex.quote(p) for p in paths)
    return (f"_ectl_dropped=; for d in {listed}; do [ -e \"$d\" ] && rm -rf \"$d\" && _ectl_dropped=1; done; "
            f"[ -z \"$_ectl_dropped\" ] || {{ echo {shlex.quote(DROPPED)}; {daemon_reload()}; }}; ")  # fmt: skip


NO_SOCKET = "engine-ctl: no socket"
"""What unit_setup_argv prints when the unit runs without the socket it was asked about."""


def unit_setup_argv(unit: str, sockets: Sequence[str] = ()) -> list[str]:
    """What the unit says is what runs: the drop-ins that change it removed (drop_ins_removal: DROPPED printed if
    there were any) and, once its file is installed, enabled (it starts at boot; with systemd's reload, only when it
    was not, so that systemd's own UnitFileState says so). Its exit status is whether the unit runs (is_active),
    asked in the same exec; where it runs, NO_SOCKET is printed if any of `sockets` (its admin socket, the ones it
    listens on) is not there."""
    q, path = shlex.quote(unit), shlex.quote(f"{UNIT_DIR}/{unit}")
    enable = f'[ ! -f {path} ] || [ "$(systemctl is-enabled {q})" = enabled ] || systemctl enable --quiet {q}'
    running = f"systemctl is-active --quiet {q}"
    if sockets:
        listed = " ".join(shlex.quote(s) for s in sockets)
        check = f"for s in {listed}; do [ -S \"$s\" ] || {{ echo '{NO_SOCKET}'; break; }}; done"
        running = f"if {running}; then {check}; else exit 3; fi"
    return ["sh", "-c", drop_ins_removal(unit) + enable + "; " + running]


def journal_argv(
    units: Sequence[str], fields: str, since: str | None, lines: int | None, follow: bool, grep: str | None = None
) -> list[str]:
    """journalctl for these units, one JSON entry a line (so each line is known to be the unit's, and when), cut to
    some fields; `grep`: only the entries whose MESSAGE matches (a PCRE2 pattern), and then `lines` counts those:
    systemd 252's journalctl applies --lines before --grep (the last N entries, matching or not), so the newest
    first, cut by head (which stops journalctl there)."""
    argv = ["journalctl", "--no-pager", "--output=json", f"--output-fields={fields}"]
    argv += [f"--unit={u}" for u in units]
    if grep is not None:
        argv.append(f"--grep={grep}")
    if since is not None:
        argv.append(f"--since={since}")
    if grep is not None and lines is not None and not follow:
        return ["sh", "-c", f"{shlex.join([*argv, '--reverse'])} | head -n {int(lines)}"]
    if lines is not None:
        argv.append(f"--lines={lines}")
    if follow:
        argv.append("--follow")
    return argv


# --- what to run: argv only (the executor runs them) ----------------------------------------------------
# Each step is one command on the host (every exec costs the host a session: about 0.3 s on the test fleet), and
# systemd reloads its units only where it must (`enable --no-reload`, then _reload_unless_loaded), not once per
# systemctl call that would reload by itself.
UPLOAD_FAILED = 90
"""The exit status of a step whose unit file could not be written (why on stderr); nothing was started."""


def _upload(unit: str) -> str:
    """Shell text: write the unit file from stdin atomically (a temporary file renamed over it, mode 0644), and
    its guard's; remove the drop-ins that change either (what the unit says is what runs)."""
    path = shlex.quote(f"{UNIT_DIR}/{unit}")
    tmp = shlex.quote(f"{UNIT_DIR}/{unit}.engine-ctl-tmp")
    why = shlex.quote(f"writing {UNIT_DIR}/{unit} failed")
    return (f"umask 022; cat > {tmp} && chmod 644 {tmp} && mv -f {tmp} {path} || "
            f"{{ rm -f {tmp}; echo {why} >&2; exit {UPLOAD_FAILED}; }}; " + guard_upload(unit)
            + drop_ins_removal(unit, guard_name(unit)))  # fmt: skip


def guard_upload(unit: str, unit_dir: str = UNIT_DIR) -> str:
    """Shell text, once the replica's unit file is written: its guard's unit (engine_ctl.core.render.guard), the
    file's `#|` lines, written beside it; a unit with none has no guard, and one left from before is stopped and
    removed (before the replica restarts on the address it held)."""
    path = shlex.quote(f"{unit_dir}/{unit}")
    guard = guard_name(unit)
    q, gpath = shlex.quote(guard), shlex.quote(f"{unit_dir}/{guard}")
    tmp = shlex.quote(f"{unit_dir}/{guard}.engine-ctl-tmp")
    why = shlex.quote(f"writing {unit_dir}/{guard} failed")
    return (
        f"if grep -q '^{GUARD_LINE}' {path}; then sed -n 's/^{GUARD_LINE} \\{{0,1\\}}//p' {path} > {tmp} && "
        f"chmod 644 {tmp} && mv -f {tmp} {gpath} || {{ rm -f {tmp}; echo {why} >&2; exit {UPLOAD_FAILED}; }}; "
        f"elif [ -e {gpath} ]; then systemctl stop {q} 2>/dev/null; rm -f {gpath}; fi; "
    )


def _reload_unless_loaded(q: str, enabled: bool = True) -> str:
    """Shell text: `systemctl daemon-reload` (0.3-1 s, every unit re-read) only where it is needed. systemd loads
    a unit file it has not loaded before when it is first asked for it (here, by `systemctl show`), so a new
    replica's unit needs no reload; a unit already loaded whose file changed (a repair) says
    NeedDaemonReload=yes, an old systemd that cached the name as not found says LoadState=not-found, and one
    enabled or disabled just now with --no-reload still has its old UnitFileState (which the plan reads)."""
    state = f"$(systemctl show -p LoadState,NeedDaemonReload,UnitFileState {q} | sort | tr '\\n' ' ')"
    want = "enabled" if enabled else "disabled"
    return f"[ \"{state}\" = 'LoadState=loaded NeedDaemonReload=no UnitFileState={want} ' ] || systemctl daemon-reload"


def _enable_and(verb: str, unit: str, upload: bool, enable: bool = True) -> list[str]:
    q = shlex.quote(unit)
    then = f"{{ systemctl reset-failed {q} 2>/dev/null; systemctl {verb} {q}; }}"
    first = f"systemctl enable --no-reload {q}" if enable else f"systemctl disable --no-reload {q} 2>/dev/null; true"
    load = f"{first} && {{ {_reload_unless_loaded(q, enable)}; }} && {then}"
    return ["sh", "-c", (_upload(unit) if upload else "") + load]


def start_argv(unit: str, upload: bool = False) -> list[str]:
    """(Write the unit file from stdin,) enable, reload and start; `start` returns once the unit's health-gated
    ExecStartPost passed."""
    return _enable_and("start", unit, upload)


MEASURED = "--- engine-ctl start-up measurement ---"
"""The line after which measured_argv's output is the measurement (measure_script's output)."""


def measured_argv(start: list[str], unit: str) -> list[str]:
    """A start (start_argv, on_demand_argv: `sh -c SCRIPT`) with nvidia-smi's per-process figures sampled in the
    background while the engine starts (where there is an nvidia-smi), for the first start of a revision to
    measure its peak; once the start succeeded, the measurement follows a MEASURED line in the same session (one
    exec less on the host than a separate measure_script: see measurement())."""
    script = start[2]
    return ["sh", "-c", f"{sampler(unit)}( {script} ); rc=$?; [ -n \"$sampler\" ] && kill $sampler 2>/dev/null; "
            f"[ $rc = 0 ] && {{ echo '{MEASURED}'; {measure_script(unit)[2]}; }}; exit $rc"]  # fmt: skip


def measurement(stdout: str) -> str:
    """measured_argv's output -> the measurement alone (what follows its MEASURED line)."""
    return stdout.rpartition(MEASURED + "\n")[2] if MEASURED in stdout else ""


def restart_argv(unit: str, upload: bool = False) -> list[str]:
    return _enable_and("restart", unit, upload)


def install_argv(unit: str) -> list[str]:
    """An on-demand replica's unit: write the file from stdin and load it (daemon-reload); never enabled or started
    (the scaler starts it)."""
    q = shlex.quote(unit)
    return ["sh", "-c", _upload(unit) + f"systemctl disable --no-reload {q} 2>/dev/null; systemctl daemon-reload"]


def unset_manager_env_argv(prefixes: Sequence[str]) -> list[str]:
    """Unset the variables of systemd's manager environment (`systemctl set-environment`) whose names begin with
    one of `prefixes` (an engine's settings), so that no unit it starts inherits them."""
    pattern = "|".join(re.escape(p) for p in prefixes)
    return ["sh", "-c", f"for v in $(systemctl show-environment | cut -d= -f1 | grep -E '^({pattern})'); do "
            'systemctl unset-environment "$v" || exit 1; done']  # fmt: skip


def held_stop_argv(unit: str) -> list[str]:
    """A stopped deployment's unit that runs again (started outside engine-ctl): written again from stdin, then
    disabled and stopped as the operator's stop left it."""
    q = shlex.quote(unit)
    return ["sh", "-c", _upload(unit) + f"systemctl disable --now {q} 2>/dev/null; systemctl daemon-reload"]


def rewrite_argv(unit: str) -> list[str]:
    """A parked replica's unit (its engine asleep, its unit active): write the file from stdin (its guard's with it,
    its drop-ins removed) and load it; enabled and running as it was (a reload restarts nothing)."""
    return ["sh", "-c", _upload(unit) + "systemctl daemon-reload"]


def on_demand_argv(verb: str, unit: str, upload: bool = False) -> list[str]:
    """(Write the unit file from stdin,) keep it disabled, reload, then `verb` it: `start` (a roll of an on-demand
    replica the scaler runs) or `try-restart` (a repair: restarted only if it runs)."""
    return _enable_and(verb, unit, upload, enable=False)


def disable_argv(unit: str) -> list[str]:
    """A replica that becomes on demand: not started at boot any more, left running."""
    return ["systemctl", "disable", "--no-reload", unit]


def stop_argv(unit: str) -> list[str]:
    return ["systemctl", "disable", "--no-reload", "--now", unit]


NOT_THERE = "engine-ctl: no such unit"
"""What remove_argv prints when the host had neither the unit's file nor a loaded unit of that name."""


def remove_argv(unit: str) -> list[str]:
    """Stop, disable and delete the unit; fails (non-zero, with why on stderr) if it is still there afterwards.
    Prints NOT_THERE where there was no such unit to remove (the host is not the one that had it)."""
    q = shlex.quote(unit)
    path = shlex.quote(f"{UNIT_DIR}/{unit}")
    guard = shlex.quote(guard_name(unit))
    gpath = shlex.quote(f"{UNIT_DIR}/{guard_name(unit)}")
    absent = f"[ -e {path} ] || [ \"$(systemctl show -p LoadState --value {q})\" != not-found ] || echo '{NOT_THERE}'; "
    exits = shlex.quote(f"{EXITS_DIR}/{unit}")  # its crashes go with it: a new unit of that name starts clean
    return ["sh", "-c", absent + f"systemctl disable --no-reload --now {q} 2>/dev/null; "
            f"systemctl stop {guard} 2>/dev/null; "
            f"rm -f {path} {gpath} {exits} || exit 1; "
            f"systemctl daemon-reload || exit 1; systemctl reset-failed {q} 2>/dev/null; "
            f"if systemctl is-active --quiet {q}; then echo '{unit} is still active' >&2; exit 1; fi"]  # fmt: skip


def failure_argv(unit: str) -> list[str]:
    """systemctl's verdict, then the engine's own last lines (messages of the unit's processes only, from its last
    invocation: not systemd's "Failed to start …")."""
    q = shlex.quote(unit)
    return ["sh", "-c", f"systemctl show -p Result,ExecMainStatus,ExecMainCode,NRestarts {q}; echo ---; "
            f"inv=$(systemctl show -p InvocationID --value {q}); "
            f"journalctl _SYSTEMD_UNIT={q} ${{inv:+_SYSTEMD_INVOCATION_ID=$inv}} -n 40 --no-pager -o cat 2>/dev/null "
            "| tail -n 40"]  # fmt: skip
