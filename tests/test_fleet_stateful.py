"""Issue 24's promise, held by a model-based test on the real fleet (tests/statefulfleet.py): random sequences of
edits, applies, applies killed with SIGKILL, operator verbs, a host cut off and back, units stopped or edited by
hand, the gateway and the scaler killed, and the state lost then imported, against three real hosts, the real
llama-server and the real HAProxy gateway, through the real CLI; after every step the test reads what the hosts run
(over SSH, never through engine-ctl) and checks that plan, apply, status and list tell the truth.

CI runs a fixed seed and STEPS steps; `python -m bench.soak --steps 300` runs a longer soak. A violation prints the
seed, the whole sequence, and the steps since the fleet was last converged and true (Hypothesis's shrinking would
replay a real fleet dozens of times, each step taking seconds to a minute)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet
from tests.statefulfleet import Machine, Project

pytestmark = pytest.mark.fleet
SEED = int(os.environ.get("ENGINE_CTL_STATEFUL_SEED", "24"))
STEPS = int(os.environ.get("ENGINE_CTL_STATEFUL_STEPS", "40"))
"""40, as issue 24 asks: about 8 minutes on the loaded 2-core CI machine (about 12 s a step: the check after each step
is about 4.5 s, an apply 25-35 s), on one xdist worker while the other runs the rest of the fleet tier. A check
reads each host once over a kept SSH connection while `plan`, `status` and `list` run at once, forked from one
interpreter that has imported the CLI (tests/cliforks.py); applies are watched for two replicas down only where
two could be. `bench.soak` runs any number, every rule included."""

RESTRICTED: dict[str, str] = {}
"""Rules left out of the CI run while the bug they show is open (the soak runs them all): rule -> the violation."""


@pytest.fixture
def machine(fleet: Fleet, tmp_path: Path) -> Iterator[Machine]:
    m = Machine(Project(tmp_path, fleet), SEED)
    m.setup()
    yield m
    m.teardown()


def test_plan_apply_status_and_list_tell_the_truth_through_random_sequences(machine: Machine) -> None:
    started = time.monotonic()
    machine.run(STEPS, restrict=set(RESTRICTED))
    took = time.monotonic() - started
    print(f"{STEPS} steps in {took / 60:.1f} min; operations: {dict(sorted(machine.kinds.items()))}")
    print(machine.timing_report())
    assert sum(n for k, n in machine.kinds.items() if k != "reset") == STEPS
    assert machine.kinds["apply"] > 0 and len([k for k in machine.kinds if k != "reset"]) >= 8, machine.kinds
    assert not machine.violations, "\n\n".join(str(v) for v in machine.violations)
