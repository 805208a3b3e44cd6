"""The programs engine-ctl ships to hosts (engine_ctl/shell/remote/): each runs there alone, with the host's
python3 and nothing of engine_ctl installed, so a script's one import of the shared admin-socket client
(remote/haproxy_admin.py) is replaced by that module's text when the script is shipped. In the tree (tests) the
import is a plain import."""

from __future__ import annotations

from functools import cache
from importlib import resources

SHARED_IMPORT = "from engine_ctl.shell.remote.haproxy_admin import haproxy_ask"
"""The line (up to its comment) that the shipped text replaces with haproxy_admin.py's."""


def _source(name: str) -> str:
    return resources.files("engine_ctl.shell.remote").joinpath(name).read_text()


@cache
def script(name: str) -> str:
    """The text of remote/`name` as a host runs it: self-contained."""
    lines = _source(name).split("\n")
    shared = _source("haproxy_admin.py")
    out = [shared if line.startswith(SHARED_IMPORT) else line for line in lines]
    return "\n".join(out)
