"""The fleet marker is checked: a test that reaches the fleet through any fixture and lacks `fleet` fails at
collection, so `pytest -m 'not fleet'` never boots a fleet."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

CONFTEST = "from tests.conftest import *  # noqa: F403 (the real hook and fixtures)\n"
INI = "[pytest]\nmarkers =\n    fleet: the fleet\n    slow: slow\n"


def _suite(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_suite=textwrap.dedent(body))
    return pytester.runpytest("--collect-only", "-q", "-m", "not fleet")


@pytest.mark.parametrize("fixture", ["fleet_inventory", "weights", "mine"])
def test_a_test_that_reaches_the_fleet_without_the_marker_fails_at_collection(
    pytester: pytest.Pytester, fixture: str
) -> None:
    result = _suite(
        pytester,
        f"""
        import pytest

        @pytest.fixture
        def mine(project):
            return project

        def test_quiet():
            pass

        def test_loud({fixture}):
            pass
        """,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*1 test(s) use the fleet without the `fleet` marker*", "*test_suite.py::test_loud"])


def test_marked_fleet_tests_are_deselected_by_not_fleet_and_nothing_boots(pytester: pytest.Pytester) -> None:
    result = _suite(
        pytester,
        """
        import pytest

        pytestmark = pytest.mark.fleet

        def test_loud(fleet):
            pass

        @pytest.mark.fleet
        def test_marked_twice(project):
            pass
        """,
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*2 deselected*"])


def test_the_fleet_tiers_longest_first_order_names_modules_that_exist() -> None:
    from pathlib import Path

    from tests.conftest import FLEET_MODULE_SECONDS

    here = Path(__file__).parent
    assert [m for m in FLEET_MODULE_SECONDS if not (here / f"{m}.py").is_file()] == []
    rest = {m: s for m, s in FLEET_MODULE_SECONDS.items() if m != "test_fleet_trust"}  # after hostile, on purpose
    assert list(rest.values()) == sorted(rest.values(), reverse=True)
    names = list(FLEET_MODULE_SECONDS)
    assert names.index("test_fleet_trust") == names.index("test_fleet_hostile") + 1
