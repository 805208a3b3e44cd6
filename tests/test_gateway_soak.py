"""bench/gateway_soak.py --local (issue 24, point 12), shortened: two real llama-server replicas of the tiny model
behind the real HAProxy with the configuration engine-ctl renders, on loopback, 4 clients (half streaming,
max_retries=0) while a replica is rolled as apply rolls it (drain, stop, start, ready) through the admin socket.
No request may fail, during the rolls too; the figures of the full 30-minute run are in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.llama import ROOT, llama_server_dir, tiny_model


def test_a_local_soak_with_rolls_fails_no_request() -> None:
    llama_server_dir(), tiny_model()  # built once per machine, before the clock of the soak
    argv = [sys.executable, "-m", "bench.gateway_soak", "--local", "--clients", "4", "--seconds", "6",
            "--roll-every", "2", "--json"]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert run.stdout.strip(), run.stderr
    (level,) = json.loads(run.stdout)["levels"]
    print("soak:", level)
    assert level["rolls"] >= 1 and level["roll_failures"] == [], level  # a replica was rolled, the whole way
    assert level["roll_times"][0].startswith("r0a at "), level
    assert level["requests"] >= 20, level  # (2 shared cores: still hundreds of requests in 6 s when idle)
    assert level["failures"] == 0 and run.returncode == 0, (level, run.stderr[-2000:])
