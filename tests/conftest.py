"""Fixtures: the real test fleet (tests/fleet.py), booted once per session and torn down by PID."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Inventory, load_inventory
from tests import fleet as fleet_mod
from tests.fleetproject import project, weights  # noqa: F401 (fixtures of the fleet tests)
from tests.llama import llama_engine

FLEET_SIZE = int(os.environ.get("ENGINE_CTL_FLEET_SIZE", "4"))


@pytest.fixture(scope="session")
def fleet() -> Iterator[fleet_mod.Fleet]:
    """N real hosts: systemd as PID 1, sshd, own network namespace. No skip: if it cannot boot, tests fail."""
    booted = fleet_mod.up(FLEET_SIZE, engines={"llama.cpp": llama_engine()})
    try:
        yield booted
    finally:
        fleet_mod.down(booted)


@pytest.fixture(scope="session")
def fleet_inventory(fleet: fleet_mod.Fleet) -> Inventory:
    return load_inventory(Path(fleet.inventory))


FLEET_FIXTURES = frozenset({"fleet", "fleet_inventory", "project", "weights"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for the fleet (directly or through another fixture) must say so with the `fleet` marker,
    so that `pytest -m 'not fleet'` never boots one."""
    unmarked = [
        item.nodeid
        for item in items
        if FLEET_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("fleet") is None
    ]
    if unmarked:
        listing = "\n  ".join(unmarked)
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) use the fleet without the `fleet` marker; add `pytestmark = pytest.mark.fleet`"
            f" (or @pytest.mark.fleet):\n  {listing}"
        )
