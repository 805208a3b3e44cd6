"""The Jinja templates of engine_ctl.templates (units, the gateway's and the guard's HAProxy configurations, the
scaler's unit), loaded once each, in one environment: no value may be missing (StrictUndefined), and the
`comment` filter writes text safe for a `#` line. jinja2 is imported when the first template is asked for, so
commands that render nothing never load it."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from engine_ctl.core.render.systemd_escape import comment_text

if TYPE_CHECKING:
    import jinja2


@cache
def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )
    env.filters["comment"] = comment_text
    return env


@cache
def load_template(name: str) -> jinja2.Template:
    """engine_ctl/templates/`name`, parsed."""
    return _environment().from_string(resources.files("engine_ctl.templates").joinpath(name).read_text())
