"""engine_args / extra_args: the seed's rules, checked against a provider's allow-list. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_ctl.core.documents.yamlsource import bad_character
from engine_ctl.providers.base import Provider, flag_name, is_flag

MAX_ARGS = 64
MAX_ARG_CHARS = 4096
SHELL_CHARS = "`$|&<>\\"


@dataclass(frozen=True)
class ArgProblem:
    index: int | None
    """Which argument (None: the list as a whole)."""
    message: str
    hint: str | None = None
    code: str = field(kw_only=True)
    """One of engine_ctl.core.diagnostics.CODES."""


def check_engine_args(args: Sequence[str], provider: Provider, field: str) -> list[ArgProblem]:
    """All problems with `args` for `provider`; `field` is how the list is named in messages."""
    problems: list[ArgProblem] = []
    if len(args) > MAX_ARGS:
        problems.append(
            ArgProblem(None, f"{field}: at most {MAX_ARGS} arguments (found {len(args)})", code="too_many_args")
        )
    expecting_value_for: str | None = None
    for i, token in enumerate(args):
        where = f"{field}[{i}]"
        unsafe = _unsafe_token(i, where, token)
        if unsafe:
            problems.append(unsafe)
            continue
        if not is_flag(token):
            if i == 0:
                problems.append(
                    ArgProblem(
                        i,
                        f"{where} {token!r}: the first argument is a flag",
                        hint="write --flag value",
                        code="value_without_flag",
                    )
                )
            elif expecting_value_for is None:
                problems.append(
                    ArgProblem(
                        i,
                        f"{where} {token!r}: a value with no flag before it",
                        hint="each flag takes at most one value: --flag value or --flag=value",
                        code="value_without_flag",
                    )
                )
            expecting_value_for = None
            continue
        name = flag_name(token)
        if " " in name:
            problems.append(
                ArgProblem(
                    i,
                    f"{where} {token!r}: one argument per item",
                    hint=f"write {name.split()[0]!r} and its value as two items, or --flag=value",
                    code="one_argument_per_item",
                )
            )
            continue
        if not name.startswith("--"):
            long = provider.short_flags.get(name)
            form = f"{long}, not {name}" if long else "--name, not -n"
            problems.append(ArgProblem(i, f"{where} {name}: flags in their long form ({form})", code="short_flag"))
            expecting_value_for = None if "=" in token else name
            continue
        problems.extend(_check_flag(i, where, name, provider))
        expecting_value_for = None if "=" in token else name
    return problems


def _unsafe_token(i: int, where: str, token: str) -> ArgProblem | None:
    """A token too long, or with a control or shell character: refused whatever the flag."""
    if len(token) > MAX_ARG_CHARS:
        return ArgProblem(i, f"{where}: at most {MAX_ARG_CHARS} characters (found {len(token)})", code="arg_too_long")
    bad = bad_character(token)
    if bad:
        return ArgProblem(i, f"{where}: no control characters (found {bad})", code="control_character")
    shell = sorted({c for c in token if c in SHELL_CHARS})
    if shell:
        return ArgProblem(
            i,
            f"{where} {token!r}: no shell characters (` $ | & < > \\); found {' '.join(shell)}",
            hint="arguments are passed to the engine as they are, never to a shell",
            code="shell_character",
        )
    return None


def _check_flag(i: int, where: str, name: str, provider: Provider) -> list[ArgProblem]:
    if name in provider.deployment_flags:
        return [
            ArgProblem(
                i,
                f"{where} {name}: set by the deployment; set it with {provider.deployment_flags[name]}",
                code="flag_set_by_deployment",
            )
        ]
    off_list = f"not on {provider.name}'s allow-list: {', '.join(provider.allowed_flags)}"
    if name in provider.refused_flags:
        return [ArgProblem(i, f"{where} {name}: {provider.refused_flags[name]}; {off_list}", code="flag_refused")]
    if name not in provider.allowed_flags:
        return [ArgProblem(i, f"{where} {name}: {off_list}", code="flag_not_allowed")]
    return []
