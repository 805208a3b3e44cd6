"""--fanout bounds apply as it bounds facts (issue 10): at most that many hosts are worked on at once, one replica
at a time per host as before. The executor's own gate, with real threads; the whole apply on the real fleet is in
tests/test_fleet_apply_fanout.py."""

from __future__ import annotations

import threading
import time

from engine_ctl.shell.apply import FanOut


def _work(gate: FanOut, hosts: int, inside: list[int], lock: threading.Lock) -> None:
    with gate.hosts(hosts):
        with lock:
            inside[0] += hosts
            inside[1] = max(inside[1], inside[0])
        time.sleep(0.02)
        with lock:
            inside[0] -= hosts


def _run(limit: int, steps: list[int]) -> tuple[FanOut, int]:
    gate, inside, lock = FanOut(limit), [0, 0], threading.Lock()
    threads = [threading.Thread(target=_work, args=(gate, n, inside, lock)) for n in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    return gate, inside[1]


def test_no_more_hosts_than_the_fanout_are_worked_on_at_once() -> None:
    gate, most = _run(3, [1] * 12)
    assert most == gate.busiest == 3 and gate.free == 3


def test_a_move_takes_both_its_hosts_and_a_fanout_of_one_still_moves() -> None:
    gate, most = _run(3, [2, 2, 2, 1, 1])
    assert most <= 3 and gate.busiest <= 3
    gate, most = _run(1, [2, 1, 2])  # a step on two hosts under --fanout 1: it takes the one slot, no deadlock
    assert most == 2 and gate.busiest == 1 and gate.free == 1
