"""One or two examples at the end of each command's --help (click's epilog), kept apart from the commands so a
command module stays about what it does. `\b` keeps click from rewrapping the lines."""

from __future__ import annotations

from engine_ctl.providers import PROVIDERS

_CPU_ENGINE = next(p for p in PROVIDERS.values() if p.auto_for_cpu)

EXAMPLES: dict[str, list[str]] = {
    "apply": ["engine-ctl apply deploy/", "engine-ctl apply plan.json            # exactly the saved, reviewed plan"],
    "delete": ["engine-ctl delete chat"],
    "deploy": [
        "engine-ctl deploy model --file deploy/chat.yaml                # saved, not started",
        "engine-ctl deploy model --file deploy/chat.yaml --activate --wait",
        "engine-ctl deploy model --file deploy/chat.yaml --revision 1   # only while it is at revision 1",
    ],
    "destroy": ["engine-ctl destroy deploy/ --target chat"],
    "engine": [
        "engine-ctl engine list --inventory hosts.yaml",
        f"engine-ctl engine add {_CPU_ENGINE.name} /opt{_CPU_ENGINE.default_executable} --build cpu",
    ],
    "facts": ["engine-ctl facts --inventory hosts.yaml", "engine-ctl facts gpu-01 --json"],
    "force-unlock": ["engine-ctl force-unlock 6f1d0c52-8c3e-4a1b-9f27-0d4e5a6b7c8d"],
    "key": [
        "engine-ctl key new ci-bot --deployment chat --expires 2027-01-31 > ci-bot.yaml",
        "engine-ctl key new batch --requests-per-minute 60 --json > batch.json",
    ],
    "logs": ["engine-ctl logs chat --follow", "engine-ctl logs --gateway chat --since 1h --json"],
    "import": ["engine-ctl import deploy/ --inventory deploy/hosts.yaml"],
    "list": ["engine-ctl list", "engine-ctl list --json"],
    "monitoring": ["engine-ctl monitoring scrape-config --inventory hosts.yaml > scrape.yml"],
    "park": ["engine-ctl park chat"],
    "plan": ["engine-ctl plan deploy/", "engine-ctl plan deploy/ --out plan.json --detailed-exitcode"],
    "render": ["engine-ctl render chat deploy/ --inventory deploy/hosts.yaml"],
    "show": ["engine-ctl show plan.json --markdown > comment.md"],
    "restart": ["engine-ctl restart chat deploy/"],
    "schema": ["engine-ctl schema > engine-ctl.schema.json"],
    "start": ["engine-ctl start chat", "engine-ctl start chat --wait"],
    "state": ["engine-ctl state list", "engine-ctl state push --to postgresql://db.example/engine_ctl"],
    "status": ["engine-ctl status", "engine-ctl status chat --json", "engine-ctl status --watch"],
    "stop": ["engine-ctl stop chat"],
    "usage": ["engine-ctl usage --since 24h --by key", "engine-ctl usage --by deployment --json"],
    "validate": ["engine-ctl validate deploy/", "engine-ctl validate deploy/ --inventory deploy/hosts.yaml"],
}


def epilog(name: str) -> str | None:
    """The epilog of command `name`: its examples, one a line."""
    lines = EXAMPLES.get(name)
    if not lines:
        return None
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
