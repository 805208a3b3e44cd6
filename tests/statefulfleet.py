"""The model-based test of issue 24, in the style of Hypothesis's RuleBasedStateMachine: rules (edits of the
documents, apply, apply killed with SIGKILL, operator verbs, a host cut off and back, a unit stopped or edited by
hand, the gateway or the scaler killed, the state lost then imported) drawn at random from a seed, run against the
real fleet through the real CLI, and invariants checked after every step against what the hosts really run
(tests/fleettruth.py reads it over SSH; engine-ctl is never asked what is true).

The promise checked (README, "The promise of a plan"):
- the state is readable;
- `plan` says "No changes" (exit 0) only when the hosts serve the documents as written;
- after an `apply` that exits 0, the next `plan` is empty;
- every deployment the plan says serves answers 200 through the gateway within the hold;
- never two replicas of one deployment down at once during an apply (one replica rolls at a time);
- `status` agrees with `plan`, and `list` with `status`.

Shrinking as Hypothesis does would replay a real fleet dozens of times (each step takes seconds to a minute), so a
violation prints instead the seed, the whole sequence, and the shortest suffix that shows it: the steps since the
last point where the plan was empty and true (the world was converged, so those steps alone lead from a converged
fleet to the violation). The draws come from the seed alone: `python -m bench.soak --seed N --steps K` runs the same
rules with the same values again (the rules a step may take depend on what the earlier ones did, so a fleet that
answers differently may take another path).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.render.scaler import SCALER_STATE
from tests.cliforks import CliForks
from tests.fleet import Fleet, FleetHost
from tests.fleettruth import MuxFleet, Poller, Truth, probe
from tests.llama import tiny_model

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = "/var/lib/engine-ctl/models"
KEY = "ak-test-stateful-" + "e5" * 24
HOLD_S = 20
GOOD_FILES = ("tiny.gguf", "tiny2.gguf")
CORRUPT = "corrupt.gguf"
CONTEXTS = (384, 512, 768)
ARGS: tuple[tuple[str, ...], ...] = ((), ("--temp", "0.5"))
NAMES = ("sa", "sb")
IDENTITY = re.compile(r"Request identity: ([0-9A-Z]{26})")
FORCE_UNLOCK = re.compile(r"engine-ctl force-unlock ([0-9a-f-]{36})")


@dataclass(frozen=True)
class Dep:
    """One deployment's document, and the operator verb in force on it."""

    name: str
    context: int = 512
    replicas: int = 1
    zero: bool = False
    args: tuple[str, ...] = ()
    verb: str | None = None  # stopped | parked | deleted

    def document(self) -> str:
        replicas = (
            "{min: 0, max: 1, idle_minutes: 1}" if self.zero else f"{{min: {self.replicas}, max: {self.replicas}}}"
        )
        args = f", engine_args: [{', '.join(json.dumps(a) for a in self.args)}]" if self.args else ""
        return (
            f"metadata: {{name: {self.name}}}\n"
            f"spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {self.context}, "
            f"replicas: {replicas}{args}}}\n"
        )


@dataclass
class Model:
    """What the documents say and what the operator did: the test's own account, never engine-ctl's."""

    deps: dict[str, Dep] = field(default_factory=lambda: {"sa": Dep("sa", replicas=2), "sb": Dep("sb", zero=True)})
    model_file: str = "tiny.gguf"
    cut: str | None = None

    def documents(self) -> str:
        model = (
            "kind: Model\nmetadata: {name: tiny}\n"
            f"spec: {{format: gguf, path: tiny/{self.model_file}, parameters: 4170048}}\n"
        )
        key = f"kind: ApiKey\nmetadata: {{name: all}}\nspec: {{sha256: {key_sha256(KEY)}}}\n"
        return "---\n".join([model, *(d.document() for d in self.deps.values()), key])


@dataclass
class Violation:
    step: int
    invariant: str
    observed: str
    expected: str
    sequence: list[str]
    since_converged: list[str]
    seed: int

    def __str__(self) -> str:
        return textwrap.dedent(
            f"""\
            VIOLATION at step {self.step} ({self.invariant}), seed {self.seed}
              observed: {self.observed}
              expected: {self.expected}
              shortest sequence (from the last converged point): {"; ".join(self.since_converged)}
              whole sequence: {"; ".join(self.sequence)}"""
        )


@dataclass
class Run:
    """What the CLI did: its exit status, its output, and how long it took."""

    rc: int
    out: str
    err: str
    seconds: float


class Project:
    """A directory of documents, an inventory of three fleet hosts (the first a gateway), a state beside the
    documents, and the real CLI run there in its own process, as a user runs it (forked from an interpreter that has
    imported it: tests/cliforks.py)."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, MuxFleet.of(fleet)
        self.hosts = fleet.hosts[:3]
        self.gateway = self.hosts[0]
        self.docs = path / "docs"
        self.docs.mkdir(parents=True, exist_ok=True)
        self.inventory = path / "hosts.yaml"
        lines = [line for line in Path(fleet.inventory).read_text().splitlines() if not line.startswith("  - {name")]
        for h in self.hosts:
            roles = ", roles: [gateway]" if h is self.gateway else ""
            lines.append(f"  - {{name: {h.name}, address: {h.address}{roles}}}")
        lines += [f"gateway: {{hold_s: {HOLD_S}}}", "scaling: {decide_every_s: 20, poll_s: 2}"]
        self.inventory.write_text("\n".join(lines) + "\n")
        self.forks: CliForks | None = None

    @property
    def state_file(self) -> Path:
        """Where engine-ctl keeps the state by default: the project's root (the directory holding the inventory),
        or, in older versions, beside the documents."""
        for where in (self.path, self.docs):
            if (where / "engine-ctl.state.json").exists():
                return where / "engine-ctl.state.json"
        return self.path / "engine-ctl.state.json"

    def state_files(self) -> list[Path]:
        return [f for where in (self.path, self.docs) for f in where.glob("engine-ctl.state.json*")]

    def put_weights(self) -> None:
        tiny = tiny_model()
        for h in self.hosts:
            self.fleet.ssh(
                h,
                f"mkdir -p {MODELS_DIR}/tiny && cp {tiny} {MODELS_DIR}/tiny/tiny.gguf && "
                f"cp {tiny} {MODELS_DIR}/tiny/tiny2.gguf && head -c 2000000 {tiny} > {MODELS_DIR}/tiny/{CORRUPT}",
            )

    def argv(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status", "list", "import"):
            argv.append(str(self.docs))
        return [*argv, "--inventory", str(self.inventory)]

    def cli(self, *args: str, timeout: float = 600) -> Run:
        return self.cli_batch([args], timeout)[0]

    def cli_batch(self, commands: list[tuple[str, ...]], timeout: float = 600) -> list[Run]:
        """Each command line at once, each in its own process of the real CLI (tests/cliforks.py: forked from an
        interpreter that has imported it, so that a check's three commands do not pay three imports)."""
        if self.forks is None:
            self.forks = CliForks()
        done = self.forks.run([(self.argv(*args)[3:], self.docs) for args in commands], timeout)
        return [Run(d.rc, d.out, d.err + (f"timed out after {timeout} s" if d.rc == 124 else ""), d.seconds)
                for d in done]  # fmt: skip

    def close(self) -> None:
        if self.forks is not None:
            self.forks.close()
            self.forks = None
        self.fleet.close()

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())  # type: ignore[no-any-return]

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.hosts if h.name == name)

    def scaler_said(self, name: str, last: int = 4) -> str:
        """What the scaler on the gateway host last decided for deployment `name` (its state file), for a report."""
        out = self.fleet.ssh(self.gateway, f"cat {SCALER_STATE} 2>/dev/null || echo '{{}}'", check=False).stdout
        try:
            decisions = json.loads(out).get("deployments", {}).get(name, {}).get("decisions", [])
        except ValueError:
            return "the scaler's state is unreadable"
        return "; ".join(f"{d.get('at')} {d.get('action')}: {d.get('reason')}" for d in decisions[-last:]) or (
            "no decision"
        )

    def journal_since(self, name: str, since: float) -> str:
        """For a report: what the scaler, the gateway and deployment `name`'s units logged since `since` (epoch s),
        from every host, so that a late or failed wake shows where its time went."""
        at = f"@{int(since) - 1}"
        lines = []
        units = "-u engine-ctl-scaler.service -u engine-ctl-gateway.service"
        gw = self.fleet.ssh(self.gateway, f"journalctl --no-pager -o short-precise --since {at} {units} | tail -n 40",
                            check=False)  # fmt: skip
        lines.append(f"[{self.gateway.name}] {gw.stdout.strip()}")
        for host in self.hosts:
            out = self.fleet.ssh(host, f"journalctl --no-pager -o short-precise --since {at} "
                                 f"-u 'engine-ctl-{name}-*' | grep -v 'slot \\|srv_\\|update_slots' | tail -n 15",
                                 check=False)  # fmt: skip
            if out.stdout.strip():
                lines.append(f"[{host.name}] {out.stdout.strip()}")
        return "\n".join(lines)

    def ask(self, model: str, timeout: float = HOLD_S + 40) -> tuple[int | None, str]:
        """One chat request through the gateway: its HTTP status and the start of its body."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        req = urllib.request.Request(
            f"http://{self.gateway.address}:8800/v1/chat/completions", data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return int(r.status), r.read(8192).decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read(300).decode(errors="replace")
        except OSError as e:
            return None, f"{type(e).__name__}: {e}"


def answered_by(body: str) -> str | None:
    """The `model` an engine's chat completion names: llama-server's --alias, which engine-ctl sets to the
    deployment's name (None: not such an answer)."""
    try:
        said = json.loads(body)
    except ValueError:
        return None
    return said.get("model") if isinstance(said, dict) else None


def short(text: str, n: int = 600) -> str:
    text = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text if len(text) <= n else text[: n // 2] + " … " + text[-n // 2 :]


def differences(model: Model, truth: Truth, good_sha: str, recorded_hosts: dict[str, set[str]]) -> list[str]:
    """How the hosts differ from the documents (and the operator's verbs), as the test itself reads them."""
    found: list[str] = []
    gateways = {h: s for h, s in truth.gateway.items() if s is not None}
    if not gateways:
        found.append("no gateway is installed")
    found += [f"the gateway on {h} is {s}" for h, s in gateways.items() if s != "active"]
    # a deleted or stopped deployment needs no scaler: the gateway answers for it (404, 409), and apply leaves its
    # replicas as they are until `start` (engine-ctl removes the scaler with the last deployment that scales)
    scaling = any(d.zero and d.verb in (None, "parked") for d in model.deps.values())
    if scaling and not {"active", "restarting"} & set(truth.scaler.values()):
        found.append(f"the scaler is not running ({truth.scaler})")
    for dep in model.deps.values():
        units = truth.of(dep.name)
        if model.cut and model.cut in recorded_hosts.get(dep.name, set()) and dep.verb is None:
            found.append(f"{dep.name} has a replica on {model.cut}, which is cut off: it cannot be known to serve")
        if dep.verb in ("stopped", "parked"):
            found += [f"{u.name} on {u.host} is {u.active} though {dep.name} is {dep.verb}" for u in units
                      if u.active in ("active", "activating", "reloading")]  # fmt: skip
            continue
        if dep.verb == "deleted":
            found += [f"{u.name} on {u.host} is still there though {dep.name} was deleted" for u in units]
            continue
        found += _served_as_written(model, dep, units, truth, good_sha)
    return found


def _served_as_written(model: Model, dep: Dep, units: list[Any], truth: Truth, good_sha: str) -> list[str]:
    found: list[str] = []
    want_model = f"{MODELS_DIR}/tiny/{model.model_file}"
    if model.model_file == CORRUPT:
        found.append(f"{dep.name}'s model file {want_model} is not usable weights (truncated GGUF)")
    for u in units:
        for what, argv in (("unit file", u.argv), ("process", u.running)):
            # a unit file that runs, or the on-demand slot the scaler would start; never an old slot's leftover
            if not argv or (u.active != "active" and (what == "process" or not dep.zero)):
                continue
            problems = _argv_problems(dep, argv, want_model)
            found += [f"{u.name} on {u.host}: its {what} {p}" for p in problems]
        for path in {_flag(u.argv, "--model"), _flag(u.running, "--model")} - {None}:
            digest = truth.sha256.get((u.host, str(path)))
            if path == want_model and digest is not None and digest != good_sha:
                found.append(f"{path} on {u.host} is not the weights it should be (sha256 {digest[:12]}…)")
    if dep.zero:
        slots = {u.index for u in units}
        if not slots:
            found.append(f"{dep.name}: no on-demand slot installed")
        found += [f"{u.name} on {u.host} runs but does not answer /health ({u.health})" for u in units
                  if u.active == "active" and u.health != 200 and u.host != model.cut]  # fmt: skip
        return found
    serving = {u.index for u in units if u.serving}
    wanted = set(range(dep.replicas))
    reachable_missing = {
        i for i in wanted - serving if not any(u.index == i and u.host in truth.unreachable for u in units)
    }
    if reachable_missing and not truth.unreachable:
        found.append(f"{dep.name}: replicas {sorted(reachable_missing)} do not serve (serving: {sorted(serving)})")
    extra = sorted({u.index for u in units if u.active == "active" and u.index not in wanted})
    if extra:
        found.append(f"{dep.name}: replicas {extra} still run, beyond the {dep.replicas} the document asks for")
    return found


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _argv_problems(dep: Dep, argv: list[str], want_model: str) -> list[str]:
    problems = []
    if _flag(argv, "--model") != want_model:
        problems.append(f"runs --model {_flag(argv, '--model')}, the document says {want_model}")
    ctx, parallel = _flag(argv, "--ctx-size"), _flag(argv, "--parallel")
    if ctx is None or parallel is None or int(ctx) != dep.context * int(parallel):
        problems.append(f"has --ctx-size {ctx} --parallel {parallel}, the document's context_length is {dep.context}")
    has_args = any(argv[i : i + len(dep.args)] == list(dep.args) for i in range(len(argv))) if dep.args else True
    if not has_args or (not dep.args and "--temp" in argv):
        problems.append(f"engine args differ from the document's {list(dep.args)}")
    return problems


Rule = Callable[["Machine", random.Random], str]


class Machine:
    """The rules and invariants. Each rule changes the world and returns its name with the values it drew."""

    def __init__(self, project: Project, seed: int, log: Callable[[str], None] = print) -> None:
        self.p, self.seed, self.log = project, seed, log
        self.model = Model()
        self.sequence: list[str] = []
        self.since_converged: list[str] = []
        self.violations: list[Violation] = []
        self.kinds: Counter[str] = Counter()
        self.timings: list[tuple[str, float, float]] = []
        """Each step's rule, the seconds the rule took and the seconds its check took."""
        self.last_apply_rc: int | None = None
        self.poller_spans: list[str] = []
        self.good_sha = ""
        self.step_no = 0
        self.plan_rc: int | None = None
        self.current = ""
        self.converged = False
        """The last check found the plan empty and true."""
        self.imported_converged = False
        self.killed_request: str | None = None
        """The identity an apply killed with SIGKILL printed: the next apply continues it with --request-id."""
        self.killed_without_identity = False
        self.hand_edited: set[str] = set()
        """Units the test edited by hand since the last apply that exited 0."""
        self.truth: Truth | None = None
        """What the hosts ran at the last check (after the last step): a rule's "before", read once per step."""

    # ----- set-up and recovery -------------------------------------------------------------------------------
    def setup(self) -> None:
        self.good_sha = hashlib.sha256(tiny_model().read_bytes()).hexdigest()
        self.p.put_weights()
        self.reset()

    def reset(self) -> None:
        """A clean fleet: every host back, everything destroyed, the starting documents applied."""
        if self.model.cut:
            self._link(self.model.cut, "up")
            self._reaches(self.p.host(self.model.cut))
            self.p.fleet.back(self.p.host(self.model.cut))
        if self.p.state_file.exists():
            self.p.state_file.with_name(self.p.state_file.name + ".lock").unlink(missing_ok=True)
            self.p.cli("destroy", "--auto-approve")
        for h in self.p.hosts:
            self.p.fleet.ssh(
                h,
                "systemctl stop 'engine-ctl-*' 2>/dev/null; rm -f /etc/systemd/system/engine-ctl-*.service; "
                "systemctl daemon-reload; systemctl reset-failed 'engine-ctl-*' 2>/dev/null; true",
                check=False,
            )
        for f in self.p.state_files():
            f.unlink()
        self.model = Model()
        self.hand_edited = set()
        self._write()
        applied = self.p.cli("apply", "--auto-approve")
        assert applied.rc == 0, f"the starting documents do not apply: {applied.out}{applied.err}"
        self.since_converged = []
        self.last_apply_rc = 0
        self.truth = None

    def teardown(self) -> None:
        """Every host back, everything of the project destroyed, the gateway and scaler gone."""
        if self.model.cut:
            self._link(self.model.cut, "up")
            self.model.cut = None
        if self.p.state_file.exists():
            self.p.state_file.with_name(self.p.state_file.name + ".lock").unlink(missing_ok=True)
            self.p.cli("destroy", "--auto-approve")
        self.p.fleet.ssh(
            self.p.gateway, "systemctl disable --now engine-ctl-gateway.service engine-ctl-scaler.service", check=False
        )
        self.p.close()

    def _write(self) -> None:
        (self.p.docs / "docs.yaml").write_text(self.model.documents())

    def _link(self, host: str, updown: str) -> None:
        subprocess.run(["ip", "link", "set", f"{host}-v", updown], check=True)

    # ----- rules ----------------------------------------------------------------------------------------------
    def rules(self) -> list[tuple[str, int, Callable[[], bool], Rule]]:
        m = self.model
        live = [d for d in m.deps.values() if d.verb is None]
        held = [d for d in m.deps.values() if d.verb is not None]
        free = not self.killed_request and not self.killed_without_identity  # an operator recovers a kill first
        return [
            ("edit_context", 3, lambda: True, Machine.edit_context),
            ("edit_engine_args", 3, lambda: True, Machine.edit_engine_args),
            ("edit_replicas", 3, lambda: not m.deps["sa"].zero, Machine.edit_replicas),
            ("edit_min_zero", 2, lambda: True, Machine.edit_min_zero),
            ("edit_model_path", 2, lambda: True, Machine.edit_model_path),
            ("corrupt_weights", 1, lambda: m.model_file != CORRUPT, Machine.corrupt_weights),
            ("apply", 8, lambda: True, Machine.apply),
            ("apply_killed", 2, lambda: free, Machine.apply_killed),
            ("stop", 1, lambda: bool(live) and m.cut is None and free, Machine.stop),
            ("park", 1, lambda: bool(live) and m.cut is None and free, Machine.park),
            ("delete", 1, lambda: bool(live) and m.cut is None and free, Machine.delete),
            ("start", 3, lambda: bool(held) and m.cut is None and free, Machine.start),
            ("cut_host", 1, lambda: m.cut is None, Machine.cut_host),
            ("host_back", 4, lambda: m.cut is not None, Machine.host_back),
            ("unit_stopped_by_hand", 1, lambda: m.cut is None, Machine.unit_stopped_by_hand),
            ("unit_edited_by_hand", 1, lambda: m.cut is None, Machine.unit_edited_by_hand),
            ("kill_gateway", 1, lambda: True, Machine.kill_gateway),
            ("kill_scaler", 1, lambda: any(d.zero for d in m.deps.values()), Machine.kill_scaler),
            ("lose_state_then_import", 1, lambda: m.cut is None and not held and free, Machine.lose_state_then_import),
        ]

    def _set(self, name: str, **changes: Any) -> None:
        self.model.deps[name] = replace(self.model.deps[name], **changes)
        self._write()

    def edit_context(self, rng: random.Random) -> str:
        name = rng.choice(NAMES)
        context = rng.choice([c for c in CONTEXTS if c != self.model.deps[name].context])
        self._set(name, context=context)
        return f"edit_context({name}, {context})"

    def edit_engine_args(self, rng: random.Random) -> str:
        name = rng.choice(NAMES)
        args = next(a for a in ARGS if a != self.model.deps[name].args)
        self._set(name, args=args)
        return f"edit_engine_args({name}, {list(args)})"

    def edit_replicas(self, rng: random.Random) -> str:
        n = 3 - self.model.deps["sa"].replicas
        self._set("sa", replicas=n)
        return f"edit_replicas(sa, {n})"

    def edit_min_zero(self, rng: random.Random) -> str:
        name = rng.choice(NAMES)
        zero = not self.model.deps[name].zero
        self._set(name, zero=zero, replicas=1)
        return f"edit_min_zero({name}, {zero})"

    def edit_model_path(self, rng: random.Random) -> str:
        self.model.model_file = next(f for f in GOOD_FILES if f != self.model.model_file)
        self._write()
        return f"edit_model_path({self.model.model_file})"

    def corrupt_weights(self, rng: random.Random) -> str:
        self.model.model_file = CORRUPT
        self._write()
        return f"corrupt_weights({CORRUPT})"

    def apply(self, rng: random.Random) -> str:
        """apply, as an operator runs it: after an apply killed mid-way, with the request identity it printed
        (`--request-id`, which continues it); where it printed none, a lock it left is cleared as the error says
        (force-unlock ID), then apply again."""
        poller = Poller(self.p.fleet, self._reachable()) if self._may_roll() else None
        watch = self._rolls_to_watch(poller) if poller is not None else {}
        recover = ("--request-id", self.killed_request) if self.killed_request else ()
        run = self.p.cli("apply", "--auto-approve", *recover)
        unlocked = ""
        if run.rc != 0 and not recover and (lock := FORCE_UNLOCK.search(run.err)) and self.killed_without_identity:
            self.p.cli("force-unlock", lock[1], "--state", str(self.p.state_file))
            unlocked = f"force-unlock {lock[1][:8]}…, "
            run = self.p.cli("apply", "--auto-approve")
        if poller is not None:
            poller.stop()
        self.killed_request, self.killed_without_identity = None, False
        self.last_apply_rc = run.rc
        if run.rc == 0:
            self.hand_edited = set()
        if poller is not None:
            self._check_rolls(watch, poller)
        self.log(f"    apply: exit {run.rc} in {run.seconds:.0f} s: {short(run.out + run.err, 300)}")
        return f"apply({unlocked}{' '.join(recover)}) -> {run.rc}"

    def apply_killed(self, rng: random.Random) -> str:
        after = round(rng.uniform(0.5, 12.0), 1)
        err = self.p.path / "killed-apply.err"
        with err.open("w") as stderr:
            proc = subprocess.Popen(self.p.argv("apply", "--auto-approve"), cwd=self.p.docs,
                                    stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
            try:
                proc.wait(timeout=after)
                killed = False
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                killed = True
        self.last_apply_rc = None if killed else proc.returncode
        if killed:
            found = IDENTITY.search(err.read_text())
            self.killed_request = found[1] if found else None
            self.killed_without_identity = found is None
        return f"apply_killed(after={after}s{'' if killed else ', finished first: exit ' + str(proc.returncode)})"

    def _verb(self, verb: str, name: str, *extra: str) -> Run:
        run = self.p.cli(verb, "deployment", name, *extra)
        self.log(f"    {verb} {name}: exit {run.rc}: {short(run.out + run.err, 200)}")
        return run

    def stop(self, rng: random.Random) -> str:
        name = rng.choice([d.name for d in self.model.deps.values() if d.verb is None])
        run = self._verb("stop", name)
        if run.rc == 0:
            self._set(name, verb="stopped")
            self._settle(name)
        return f"stop({name}) -> {run.rc}"

    def park(self, rng: random.Random) -> str:
        name = rng.choice([d.name for d in self.model.deps.values() if d.verb is None])
        run = self._verb("park", name)
        if run.rc == 0:
            self._set(name, verb="parked")
            self._settle(name)
        return f"park({name}) -> {run.rc}"

    def delete(self, rng: random.Random) -> str:
        name = rng.choice([d.name for d in self.model.deps.values() if d.verb is None])
        run = self._verb("delete", name, "--stop")
        if run.rc == 0:
            self._set(name, verb="deleted")
        return f"delete({name}, --stop) -> {run.rc}"

    def start(self, rng: random.Random) -> str:
        name = rng.choice([d.name for d in self.model.deps.values() if d.verb is not None])
        run = self._verb("start", name, "--wait")
        if run.rc == 0:
            self._set(name, verb=None)
        return f"start({name}, --wait) -> {run.rc}"

    def _settle(self, name: str, within: float = 50) -> None:
        """A stop or park returns while the engine still goes away: wait for its units to stop (each host polls
        systemd every 0.25 s over one SSH session)."""
        rounds = int(within / 0.25)
        wait = (
            f"for i in $(seq {rounds}); do systemctl list-units --plain --no-legend "
            f"--state=active,activating,deactivating,reloading 'engine-ctl-{name}-[0-9]*.service' | grep -q . "
            "|| exit 0; sleep 0.25; done; exit 1"
        )
        threads = [threading.Thread(target=self.p.fleet.ssh, args=(h, wait), kwargs={"check": False})
                   for h in self._reachable()]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def cut_host(self, rng: random.Random) -> str:
        host = rng.choice([h.name for h in self.p.hosts[1:]])  # never the gateway's: every request goes there
        self.p.fleet.drop(self.p.host(host))
        self._link(host, "down")
        self.model.cut = host
        return f"cut_host({host})"

    def host_back(self, rng: random.Random) -> str:
        host = self.model.cut
        assert host is not None
        self._link(host, "up")
        self.model.cut = None
        self._reaches(self.p.host(host))
        self.p.fleet.back(self.p.host(host))
        return f"host_back({host})"

    @staticmethod
    def _reaches(host: FleetHost, within: float = 10) -> None:
        """Wait (polling every 0.1 s) until the host's sshd accepts a connection again."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host.address, 22), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)

    def _active_units(self) -> list[Any]:
        return [u for u in self._before().units if u.active == "active"]

    def unit_stopped_by_hand(self, rng: random.Random) -> str:
        units = self._active_units()
        if not units:
            return "unit_stopped_by_hand(none active)"
        u = rng.choice(units)
        self.p.fleet.ssh(self.p.host(u.host), f"systemctl stop {u.name}", check=False)
        return f"unit_stopped_by_hand({u.host}, {u.name})"

    def unit_edited_by_hand(self, rng: random.Random) -> str:
        units = self._active_units()
        if not units:
            return "unit_edited_by_hand(none active)"
        u = rng.choice(units)
        restart = rng.random() < 0.5
        ctx = int(_flag(u.argv, "--ctx-size") or 1024) * 2
        command = (
            f'sed -i \'s/"--ctx-size" "[0-9]*"/"--ctx-size" "{ctx}"/\' /etc/systemd/system/{u.name} && '
            "systemctl daemon-reload" + (f" && systemctl restart {u.name}" if restart else "")
        )
        self.p.fleet.ssh(self.p.host(u.host), command, check=False)
        self.hand_edited.add(u.name)
        return f"unit_edited_by_hand({u.host}, {u.name}, --ctx-size {ctx}{', restarted' if restart else ''})"

    def kill_gateway(self, rng: random.Random) -> str:
        self.p.fleet.ssh(self.p.gateway, "systemctl kill -s KILL engine-ctl-gateway.service", check=False)
        return "kill_gateway()"

    def kill_scaler(self, rng: random.Random) -> str:
        self.p.fleet.ssh(self.p.gateway, "systemctl kill -s KILL engine-ctl-scaler.service", check=False)
        return "kill_scaler()"

    def lose_state_then_import(self, rng: random.Random) -> str:
        before = self._records(on_hosts=True)
        self.imported_converged = self.converged
        for f in self.p.state_files():
            f.unlink()
        run = self.p.cli("import")
        self.log(f"    import: exit {run.rc}: {short(run.out + run.err, 300)}")
        if run.rc != 0:
            self.violate("import rebuilds a lost state", f"import exit {run.rc}: {short(run.out + run.err)}",
                         "exit 0, the deployments adopted")  # fmt: skip
            return "lose_state_then_import() -> failed"
        after = self._records()
        if after != before:
            self.violate("import keeps IDs and revisions", f"after import {after}", f"as before the loss {before}")
        return f"lose_state_then_import() -> {run.rc}"

    def _records(self, on_hosts: bool = False) -> dict[str, tuple[str, int]]:
        """Each deployment's ID and revision in the state. `on_hosts`: the revision the hosts can tell an import,
        the highest any recorded replica's unit carries (a revision whose roll failed before any unit of it was
        written, or was removed again, is in the lost state alone: seed 31, step 37); the ID always."""
        if not self.p.state_file.exists():
            return {}
        deps = self.p.state().get("deployments", {})

        def revision(d: dict[str, Any]) -> int:
            units = [int(r["revision"]) for r in d.get("replicas", []) if r.get("revision")]
            return max(units) if on_hosts and units else int(d.get("revision") or 0)

        return {n: (d.get("id"), revision(d)) for n, d in deps.items() if n in self.model.deps}

    def _reachable(self) -> list[FleetHost]:
        return [h for h in self.p.hosts if h.name != self.model.cut]

    # ----- invariants -----------------------------------------------------------------------------------------
    def violate(self, invariant: str, observed: str, expected: str) -> None:
        v = Violation(self.step_no, invariant, observed, expected, list(self.sequence), list(self.since_converged),
                      self.seed)  # fmt: skip
        self.violations.append(v)
        self.log(str(v) + (f" (then {self.current}, the step that found it)" if self.current else ""))

    def _before(self) -> Truth:
        """The hosts as the last check read them (nothing but the clock has run since), else read now."""
        return self.truth if self.truth is not None else probe(self.p.fleet, self.p.hosts)

    def _may_roll(self) -> bool:
        """Whether an apply could roll a deployment of two or more replicas (none while a host is cut off): the
        only case where two replicas could be down at once, so the only one worth watching."""
        return self.model.cut is None and any(
            not d.zero and d.verb is None and d.replicas >= 2 for d in self.model.deps.values()
        )

    def _rolls_to_watch(self, poller: Poller) -> dict[str, set[int]]:
        """Each deployment with two or more replicas serving when the apply began (the poller's first round),
        with those replicas' indexes."""
        if len(poller.first) < len(self._reachable()):
            return {}  # a host did not answer: it may be cut off
        watch = {}
        for dep in self.model.deps.values():
            if dep.zero or dep.verb is not None:
                continue
            indexes = poller.serving_first(dep.name) & set(range(dep.replicas))
            if len(indexes) >= 2:
                watch[dep.name] = indexes
        return watch

    def _check_rolls(self, watch: dict[str, set[int]], poller: Poller) -> None:
        """Never two replicas of one deployment down at once during an apply."""
        hosts = {h.name for h in self.p.hosts}
        for name, indexes in watch.items():
            spans = poller.down_together(name, indexes, hosts)
            self.log(f"    rolls watched: {name}'s replicas {sorted(indexes)}, {len(poller.samples)} samples, "
                     f"{len(spans)} span(s) with two down")  # fmt: skip
            for start, end, down in spans:
                self.violate(
                    "one replica of a deployment rolls at a time",
                    f"replicas {sorted(down)} of {name} were all down for {end - start:.1f} s during apply",
                    "at most one replica of a deployment down at any moment of a roll",
                )

    def check(self) -> None:
        """Every invariant, against the world as it is after the step."""
        found_before = len(self.violations)
        if self.p.state_file.exists():
            try:
                self.p.state()
            except ValueError as e:
                self.violate("the state is readable", f"{self.p.state_file}: {e}", "valid JSON")
        commands = {"plan": ("plan", "--detailed-exitcode", "--json"), "status": ("status", "--json"),
                    "list": ("list", "--json")}  # fmt: skip
        results: dict[str, Run] = {}

        def cli() -> None:
            results.update(zip(commands, self.p.cli_batch(list(commands.values())), strict=True))

        batch = threading.Thread(target=cli)
        batch.start()
        read = time.monotonic()
        truth = probe(self.p.fleet, self.p.hosts)  # at the same time as plan, status and list read the hosts
        read = time.monotonic() - read
        batch.join()
        self.truth = truth
        took = ", ".join(f"{k} {r.seconds:.1f} s" for k, r in results.items())
        self.log(f"    check: the hosts read in {read:.1f} s; {took}")
        plan = results["plan"]
        for name, run in results.items():
            if "Traceback" in run.err:
                self.violate("no traceback", f"{name}: {short(run.err)}", "a located error")
        self.plan_rc = plan.rc
        doc = _json(plan.out)
        recorded = self._recorded_hosts()
        diffs = differences(self.model, truth, self.good_sha, recorded)
        if plan.rc == 0 and diffs:
            self.violate("\"No changes\" only when live facts match the documents",
                         f"plan exit 0 (No changes) while: {'; '.join(diffs)}",
                         "plan names each difference, exit 1 or 2")  # fmt: skip
        if self.model.model_file == CORRUPT and plan.rc != 1:
            self.violate("exit 1 when no apply can reach the documents",
                         f"plan exit {plan.rc} with the model at {CORRUPT} (a truncated GGUF): "
                         f"{_plan_summary(doc, plan)}",
                         "exit 1, naming the file, the host and why it is unusable")  # fmt: skip
        self._check_blame(doc)
        if plan.rc == 0 and doc is not None and doc.get("has_changes"):
            self.violate("exit 0 means no changes", "plan --detailed-exitcode exit 0 with has_changes true", "exit 2")
        if self.sequence and self.sequence[-1].startswith("apply()") and self.last_apply_rc == 0 and plan.rc != 0:
            self.violate("after an apply that exits 0 the next plan is empty",
                         f"plan exit {plan.rc}: {_plan_summary(doc, plan)}", "No changes, exit 0")  # fmt: skip
        imported = self.sequence[-1:] and self.sequence[-1].startswith("lose_state") and self.imported_converged
        if imported and plan.rc != 0:
            self.violate("after import, plan is empty", f"plan exit {plan.rc}: {_plan_summary(doc, plan)}",
                             "No changes, exit 0: the fleet was converged before the state was lost")  # fmt: skip
        if plan.rc == 0:
            asked = time.monotonic()
            self._check_gateway()
            self.log(f"    check: the gateway answered in {time.monotonic() - asked:.1f} s")
        self._check_status(doc, _json(results["status"].out), _json(results["list"].out))
        self.converged = plan.rc == 0 and not diffs and len(self.violations) == found_before
        if self.converged:
            self.since_converged = []  # converged and true: the next violation's sequence starts here

    def _check_blame(self, doc: dict[str, Any] | None) -> None:
        """The plan blames a person ("edited by hand") only for what the test edited by hand."""
        if doc is None:
            return
        said = [json.dumps(d) for d in doc.get("drift", [])]
        said += [r for g in doc.get("gateways", []) for r in g.get("reasons", [])]
        for text in said:
            if "edited by hand" in text and not any(name in text for name in self.hand_edited):
                self.violate("drift blames a person only for a person's change",
                             f"plan says: {short(text, 250)}",
                             f"no hand edit there (hand edits: {sorted(self.hand_edited) or 'none'})")  # fmt: skip

    def _recorded_hosts(self) -> dict[str, set[str]]:
        try:
            deps = self.p.state().get("deployments", {})
        except (OSError, ValueError):
            return {}
        return {n: {r.get("host") for r in d.get("replicas", [])} for n, d in deps.items()}

    def _check_gateway(self) -> None:
        """Every deployment the plan says serves answers 200 through the gateway within the hold; a stopped one
        409 deployment_stopped at once; a deleted one 404 model_not_found."""
        answers: dict[str, tuple[int | None, str, float]] = {}

        asked_at = time.time()

        def ask(name: str) -> None:
            started = time.monotonic()
            code, body = self.p.ask(name)
            answers[name] = (code, body, time.monotonic() - started)

        asked = [d for d in self.model.deps.values() if d.verb != "parked"]
        threads = [threading.Thread(target=ask, args=(d.name,)) for d in asked]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for dep in asked:
            code, body, took = answers[dep.name]
            want = {None: 200, "stopped": 409, "deleted": 404}[dep.verb]
            if code == want == 200 and answered_by(body) != dep.name:
                # llama-server names itself by its --alias (the deployment's name), whatever the request said
                self.violate(
                    "each deployment's requests reach its own engine",
                    f"{dep.name}: answered by the engine of {answered_by(body)!r}: {short(body, 200)}",
                    f"{dep.name}'s own engine (its --alias)",
                )
            if code != want:
                said = ""
                if code == 503:
                    said = (
                        f" (asked at {time.strftime('%H:%M:%S', time.gmtime(asked_at))}Z; the scaler's last "
                        f"decisions: {self.p.scaler_said(dep.name)})\n{self.p.journal_since(dep.name, asked_at)}"
                    )
                self.violate(
                    "every deployment the plan says serves answers through the gateway",
                    f"{dep.name} ({dep.verb or 'serving'}): {code} after {took:.1f} s: {short(body, 200)}{said}",
                    f"{want} within the hold ({HOLD_S} s)",
                )

    def _check_status(self, plan: dict[str, Any] | None, status: dict[str, Any] | None,
                      listed: dict[str, Any] | None) -> None:  # fmt: skip
        if plan is None or status is None or listed is None:
            self.violate("plan, status and list answer", f"plan {plan is not None}, status {status is not None}, "
                         f"list {listed is not None} gave JSON", "all three")  # fmt: skip
            return
        rows = {d["name"]: d for d in status.get("deployments", [])}
        listed_rows = {d["name"]: d for d in listed.get("deployments", [])}
        changes = {c["name"]: c for c in plan.get("changes", [])}
        for name, dep in self.model.deps.items():
            row, lrow, change = rows.get(name), listed_rows.get(name), changes.get(name)
            if row is None or lrow is None:
                if dep.verb != "deleted":
                    self.violate("status and list show every deployment", f"{name}: status {row is not None}, "
                                 f"list {lrow is not None}", "both show it")  # fmt: skip
                continue
            said = {k: row.get(k) for k in VERDICT_KEYS}
            lsaid = {k: lrow.get(k) for k in VERDICT_KEYS}
            if said != lsaid and not self._agree_when_read_again(name):
                self.violate("list agrees with status", f"{name}: list {lsaid}, status {said}", "the same verdict")
            if (row.get("ready") or 0) > (row.get("replicas") or 0):
                self.violate("READY never exceeds the replicas", f"{name}: READY {row['ready']}/{row['replicas']}",
                             "ready <= replicas")  # fmt: skip
            self._status_vs_plan(name, dep, said, change)

    def _agree_when_read_again(self, name: str, tries: int = 3) -> bool:
        """status and list read the hosts each in its own process, a moment apart, and the scaler on the gateway
        host changes what they read meanwhile (its state.json: the replicas it wants now, which status and list
        report as `replicas` of a deployment that scales; seed 24 once read 1 in one and 0 in the other after a
        slot the scaler ran was stopped by hand). Both use one code path (status_cmd._statuses), so a disagreement
        that is a defect shows every time: both are read again, at once, up to `tries` times, and it counts only
        if they never agree."""
        for attempt in range(1, tries + 1):
            time.sleep(1)
            status, listed = (_json(r.out) for r in self.p.cli_batch([("status", "--json"), ("list", "--json")]))
            rows = {d["name"]: d for d in (status or {}).get("deployments", [])}
            lrows = {d["name"]: d for d in (listed or {}).get("deployments", [])}
            if name in rows and name in lrows and all(rows[name].get(k) == lrows[name].get(k) for k in VERDICT_KEYS):
                self.log(f"    {name}: list and status agree when read again ({attempt}): the scaler moved between")
                return True
        return False

    def _status_vs_plan(self, name: str, dep: Dep, said: dict[str, Any], change: dict[str, Any] | None) -> None:
        if change is None:
            return
        state = said["state"]
        if change.get("failed_reason") and state != "Failed":
            self.violate("status agrees with plan", f"{name}: plan Failed ({short(change['failed_reason'], 150)}), "
                         f"status {state}", "status Failed")  # fmt: skip
        if dep.verb in ("stopped", "parked", "deleted") and state != dep.verb:
            self.violate("status agrees with plan", f"{name}: status {state} after {dep.verb}", f"status {dep.verb}")
        serving = self.plan_rc == 0 and dep.verb is None and not self.model.cut
        if serving and not dep.zero and (state != "Ready" or said["ready"] != dep.replicas):
            self.violate("status agrees with plan", f"{name}: plan No changes, status {state} "
                         f"{said['ready']}/{said['replicas']}", f"Ready {dep.replicas}/{dep.replicas}")  # fmt: skip
        if self.plan_rc == 0 and change.get("old_revision") not in (None, said["revision"]):
            self.violate("status agrees with plan", f"{name}: status revision {said['revision']}, plan revision "
                         f"{change.get('old_revision')}", "the same revision")  # fmt: skip

    def timing_report(self) -> str:
        """Seconds a step took, by rule: the rule itself and the check after it (bench.soak and the CI test print
        it, to see where a run's time goes)."""
        by: dict[str, list[tuple[float, float]]] = {}
        for name, rule, check in self.timings:
            by.setdefault(name, []).append((rule, check))
        lines = ["seconds a step, by rule (mean rule + mean check):"]
        for name, runs in sorted(by.items()):
            rule, check = (sum(r[i] for r in runs) / len(runs) for i in (0, 1))
            lines.append(f"  {name:24s} x{len(runs):<3d} {rule:5.1f} + {check:4.1f}")
        return "\n".join(lines)

    # ----- the driver -----------------------------------------------------------------------------------------
    def run(self, steps: int, restrict: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        rng = random.Random(self.seed)
        for self.step_no in range(1, steps + 1):
            enabled = [(n, w, f) for n, w, pre, f in self.rules() if pre() and n not in restrict]
            names, weights = [n for n, _, _ in enabled], [w for _, w, _ in enabled]
            pick = rng.choices(range(len(enabled)), weights=weights)[0]
            started = time.monotonic()
            before = len(self.violations)
            self.current = names[pick]
            said = enabled[pick][2](self, rng)
            self.current = ""
            ruled = time.monotonic()
            self.kinds[names[pick]] += 1
            self.sequence.append(said)
            self.since_converged.append(said)
            for v in self.violations[before:]:  # found inside the rule: the step belongs to its sequence
                v.sequence.append(said)
                v.since_converged.append(said)
            self.check()
            now = time.monotonic()
            self.timings.append((names[pick], ruled - started, now - ruled))
            self.log(f"step {self.step_no:3d} {now - started:5.1f} s (rule {ruled - started:.1f}, "
                     f"check {now - ruled:.1f})  plan exit {self.plan_rc}  {said}")  # fmt: skip
            if len(self.violations) > before:
                self.kinds["reset"] += 1
                self.log("  (violation: the fleet is reset to the starting documents, and the run goes on)")
                self.sequence.append("reset()")
                try:
                    self.reset()
                except AssertionError as e:  # destroy then apply did not bring the fleet back: nothing more to run
                    self.violate("destroy then apply of the starting documents succeeds", short(str(e), 900),
                                 "apply exit 0")  # fmt: skip
                    return


VERDICT_KEYS = ("state", "ready", "replicas", "revision")
"""What status and list must say alike of a deployment."""


def _json(text: str) -> dict[str, Any] | None:
    try:
        return json.loads(text)  # type: ignore[no-any-return]
    except ValueError:
        return None


def _plan_summary(doc: dict[str, Any] | None, run: Run) -> str:
    if doc is None:
        return short(run.out + run.err)
    parts = []
    for c in doc.get("changes", []):
        if c.get("action") != ["no-op"] or c.get("pending_reason") or c.get("failed_reason"):
            parts.append(f"{c['name']} {c.get('action')} {c.get('pending_reason') or c.get('failed_reason') or ''}"
                         f" {'; '.join(c.get('reasons', []))}"[:200])  # fmt: skip
    parts += [f"drift: {short(json.dumps(d), 200)}" for d in doc.get("drift", [])]
    parts += [f"gateway {g['host']} {g['action']} {'; '.join(g.get('reasons', []))}"[:200]
              for g in doc.get("gateways", []) if g.get("action") != ["no-op"]]  # fmt: skip
    parts += [f"the scaler to start on {h}" for h in ((doc.get("scaler") or {}).get("stopped") or [])]
    return "; ".join(parts) or short(run.err, 300) or f"summary {doc.get('summary')}"
