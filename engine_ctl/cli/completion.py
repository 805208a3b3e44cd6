"""Shell completion of what the commands name: deployment names from the state (the one the command would use:
--state, else the project's root), host names from the inventory. Completion never fails a keystroke: anything
unreadable completes nothing."""

from __future__ import annotations

from pathlib import Path

import click
from click.shell_completion import CompletionItem


def _state_names(ctx: click.Context) -> list[str]:
    from engine_ctl.cli.context import backend_for, state_exists

    root = ctx.find_root()
    params = {**root.params, **ctx.params}
    paths = tuple(Path(p) for p in params.get("paths") or ())
    backend = backend_for(params.get("state_path"), paths)
    if not state_exists(backend):
        return []
    return sorted(backend.read().deployments)


def deployment_names(
    ctx: click.Context, param: click.Parameter | click.Command, incomplete: str
) -> list[CompletionItem]:
    """The deployments the state records whose names start with what is typed."""
    try:
        names = _state_names(ctx)
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def host_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The inventory's hosts whose names start with what is typed."""
    try:
        from engine_ctl.cli.common import find_inventory

        explicit = ctx.params.get("inventory_path")
        inventory = find_inventory(Path(explicit) if explicit else None, None)
    except Exception:  # as above
        return []
    return [CompletionItem(h.name) for h in inventory.hosts if h.name.startswith(incomplete)]
