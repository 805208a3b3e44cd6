"""A hand-edited unit shown as a diff of its text: the file on the host against the unit engine-ctl rendered
(the one its state records by hash). Pure.

A reviewer then sees what was edited, not two hashes. Values that look secret (an `Environment=` or `SetCredential=`
whose name says key, token, secret or password) are hidden, so a token someone pasted into a unit by hand never
reaches a plan file or a pull-request comment.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from engine_ctl.core.fit.hostfacts import HostFacts

if TYPE_CHECKING:
    from engine_ctl.core.plan.changes import Plan

UNIT_DIR = "/etc/systemd/system"
MAX_DIFF_LINES = 200
"""Past this the diff is cut with a line that says how many lines were left out."""
HIDDEN = "(sensitive)"
_SECRET_NAME = re.compile(r"key|token|secret|passw", re.IGNORECASE)
ENV_ASSIGNMENT = re.compile(r'"(?P<quoted>[A-Za-z_][A-Za-z0-9_]*)=[^"]*"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)=[^\s"]*')
_SECRET_FLAG = re.compile(  # --api-key X, --api-key=X, and systemd's quoted words: "--api-key" "X"
    r'(?P<flag>--[\w-]*(?:key|token|secret|passw)[\w-]*)(?P<sep>"?[= ]"?)(?:[^\s"]|\\")+', re.IGNORECASE
)


def hide_secrets(line: str) -> str:
    """`Environment=HF_TOKEN=hf_abc` -> `Environment=HF_TOKEN=(sensitive)`; a credential whose name says secret
    loses its data; `--api-key X` in an ExecStart becomes `--api-key (sensitive)`."""
    head, eq, rest = line.partition("=")
    if eq and head.strip() == "Environment":

        def hide(m: re.Match[str]) -> str:
            name = m.group("quoted") or m.group("name")
            if not _SECRET_NAME.search(name):
                return m.group(0)
            return f'"{name}={HIDDEN}"' if m.group("quoted") else f"{name}={HIDDEN}"

        return f"{head}={ENV_ASSIGNMENT.sub(hide, rest)}"
    if eq and head.strip() in ("SetCredential", "SetCredentialEncrypted", "LoadCredential"):
        name, colon, _ = rest.partition(":")
        return f"{head}={name}:{HIDDEN}" if colon and _SECRET_NAME.search(name) else line
    return _SECRET_FLAG.sub(lambda m: f"{m.group('flag')}{m.group('sep')}{HIDDEN}", line)


def hide_argv(words: Sequence[str]) -> tuple[str, ...]:
    """An argv with the value of each flag whose name says secret hidden (`--api-key X` -> `--api-key
    (sensitive)`, `--api-key=X` -> `--api-key=(sensitive)`): what the facts keep of a process's command line."""
    out: list[str] = []
    for i, word in enumerate(words):
        flag, eq, _ = word.partition("=")
        if eq and flag.startswith("--") and _SECRET_NAME.search(flag):
            out.append(f"{flag}={HIDDEN}")
        elif i > 0 and words[i - 1].startswith("--") and "=" not in words[i - 1] and _SECRET_NAME.search(words[i - 1]):
            out.append(HIDDEN)
        else:
            out.append(word)
    return tuple(out)


def hide_secrets_in(text: str) -> str:
    """A unit file's text with hide_secrets on every line (what the facts keep of a unit's text)."""
    return "".join(
        hide_secrets(line.rstrip("\n")) + ("\n" if line.endswith("\n") else "") for line in text.splitlines(True)
    )


UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Control characters (a terminal's escape sequences: a line erased, text hidden) and the bidirectional overrides
that reorder what a reviewer reads: shown as escapes wherever a host's text is printed."""


def printable(line: str) -> str:
    """A line of a host's text as the plan shows it: each UNPRINTABLE character as its escape (\\x1b, \\u202e)."""
    return UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else
                           f"\\u{ord(m.group()):04x}", line)  # fmt: skip


def unit_diff(host: str, unit: str, on_host: str, rendered: str) -> list[str]:
    """The unified diff from the file on the host to engine-ctl's unit: `-` lines are what the hand edit wrote
    (printable: no escape sequence of the host's reaches the reader's terminal or the pull request), `+` lines
    what apply writes back."""
    before = [printable(hide_secrets(line)) for line in on_host.splitlines()]
    after = [hide_secrets(line) for line in rendered.splitlines()]
    lines = list(
        difflib.unified_diff(
            before, after, fromfile=f"{host}:{UNIT_DIR}/{unit} (edited by hand)",
            tofile=f"{unit} as engine-ctl rendered it (apply writes it back)", lineterm="", n=2,
        )
    )  # fmt: skip
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"… {len(lines) - MAX_DIFF_LINES} more line(s) of the diff not shown"]
    return lines


def attach_unit_diffs(plan: Plan, facts: Mapping[str, HostFacts]) -> None:
    """Each `edited` drift gets the diff of its unit, when the host sent the file's text and the plan has the
    unit engine-ctl rendered for it (the replica it repairs)."""
    rendered = {(r.host, r.unit): r.unit_text for c in plan.changes for r in c.replicas if r.unit_text}
    for d in plan.drift:
        if d.kind != "edited" or (d.host, d.unit) not in rendered:
            continue
        fact = next((u for u in facts[d.host].units if u.name == d.unit), None) if d.host in facts else None
        if fact is not None and fact.text is not None:
            d.diff = unit_diff(d.host, d.unit, fact.text, rendered[(d.host, d.unit)] or "")
