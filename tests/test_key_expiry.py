"""`engine-ctl key new NAME --expires DATE` (issue 31 point 7): a key born expired is refused, with the date it
names and what to do; a later date is written as before."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from engine_ctl.core.documents.apikey import new_expiry_problem, parse_expiry
from tests.helpers import run


def test_a_past_date_is_refused_and_no_key_is_made() -> None:
    for past in ("2020-01-01", "2020-01-01T12:00:00Z", (datetime.now(UTC) - timedelta(minutes=5)).isoformat()):
        result = run("key", "new", "ci-bot", "--expires", past)
        assert result.exit_code != 0, result.output
        assert "already past" in result.output and repr(past) in result.output, result.output
        assert "ak-" not in result.output, "no key is made"
        assert "Traceback" not in result.output


def test_a_later_date_makes_a_key_that_expires_then() -> None:
    later = (datetime.now(UTC) + timedelta(days=30)).date().isoformat()
    result = run("key", "new", "ci-bot", "--expires", later)
    assert result.exit_code == 0, result.output
    assert f'expires: "{later}"' in result.stdout
    # a date is its first moment: said so, since the key is refused all that day (a probe, session 16)
    assert f"It works until {later} 00:00:00 UTC, and is refused from then on." in result.output, result.output


def test_a_malformed_date_says_the_forms() -> None:
    result = run("key", "new", "ci-bot", "--expires", "next tuesday")
    assert result.exit_code != 0 and "a date (YYYY-MM-DD) or an ISO 8601 time" in result.output


@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_new_expiry_problem_is_refused_exactly_when_not_after_now(offset: int) -> None:
    now = time.time()
    text = datetime.fromtimestamp(int(now) + offset, UTC).isoformat()
    problem = new_expiry_problem(text, now)
    assert (problem is None) == ((parse_expiry(text) or 0) > now)


def test_key_new_json_gives_the_key_and_its_document_with_stable_names() -> None:
    """Issue 26: `--json` on `key new` (stable field names); issue 31: the key's requests a minute."""
    import json

    from engine_ctl.core.documents.apikey import api_key_from, key_sha256
    from engine_ctl.core.documents.yamlsource import parse_text

    result = run("key", "new", "batch", "--deployment", "chat", "--requests-per-minute", "60", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"name", "key", "sha256", "deployments", "expires", "requests_per_minute", "document"}
    assert out["name"] == "batch" and out["key"].startswith("ak-") and out["sha256"] == key_sha256(out["key"])
    assert out["deployments"] == ["chat"] and out["expires"] is None and out["requests_per_minute"] == 60
    (doc,), _ = parse_text(out["document"], "batch.yaml")
    key, problems = api_key_from(doc)
    assert not problems and key is not None
    assert (key.name, key.sha256, key.deployments, key.requests_per_minute) == ("batch", out["sha256"], ("chat",), 60)
    refused = run("key", "new", "batch", "--requests-per-minute", "0")
    assert refused.exit_code != 0 and "ak-" not in refused.output and "Traceback" not in refused.output
