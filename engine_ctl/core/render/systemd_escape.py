"""Escaping values for systemd unit files, so that no value can add a word, a line or a directive.

References: systemd.service(5) "Command lines" (quoting, `\\;`, `$$`), systemd.unit(5) "Specifiers" (`%%`),
systemd.exec(5) Environment= (quoted assignments). Pure functions.
"""

from __future__ import annotations

import re

from engine_ctl.core.documents.yamlsource import NONCHARACTERS

CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{NONCHARACTERS}]")
"""Unicode's control characters (category Cc), the line and paragraph separators (Zl, Zp) and the
noncharacters."""
SAFE_WORD = re.compile(r"^[A-Za-z0-9/._+:=,@-]+$")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UnsafeValue(ValueError):
    """A value that cannot be written into a unit file at all (control characters)."""


def _refuse_control(value: str, what: str) -> None:
    found = CONTROL.search(value)
    if found:
        code = ord(found.group())
        kind = "noncharacter" if code >= 0xFDD0 else "control character"
        raise UnsafeValue(f"{what} {value[:40]!r}: {kind} U+{code:04X} cannot go in a unit file")


NEEDS_ESCAPE = re.compile(r'[\\"%$]')
"""A character _escaped changes."""


def _escaped(value: str, dollar: bool = False) -> str:
    """Inside double quotes: backslash and quote escaped (C-style), specifiers `%%`, and with `dollar` `$$` for `$`
    (no variable is ever expanded in an argument). Each character once: the backslash goes first, so the ones the
    quotes gain are not doubled. (str.replace, not str.translate: a table that maps one character to two makes
    translate copy character by character, some seven times slower on a unit's values.)"""
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return out.replace("$", "$$") if dollar else out


def _quoted(value: str) -> str:
    return '"' + _escaped(value) + '"'


def exec_word(arg: str, checked: bool = False) -> str:
    """One argv word for ExecStart=: always exactly one word, never a separator or a variable. `checked`: the
    caller already found no control character in it."""
    if not checked:
        _refuse_control(arg, "argument")
    if arg == ";":
        return "\\;"
    return '"' + _escaped(arg, dollar=True) + '"'


def exec_line(argv: list[str]) -> str:
    """ExecStart= value: the executable (an absolute path) and its arguments, each one word."""
    if not argv or not argv[0].startswith("/"):
        raise UnsafeValue(f"executable {argv[0] if argv else ''!r}: an absolute path is required")
    exe = argv[0]
    _refuse_control(exe, "executable")
    head = exe.replace("%", "%%") if SAFE_WORD.match(exe) and exe[0] == "/" else exec_word(exe)
    joined = "\x20".join(argv)
    clean = not CONTROL.search(joined)  # one search for the common case; else each word says which
    if clean and not NEEDS_ESCAPE.search(joined):  # the common case: each word only quoted (bench.scale)
        return " ".join([head, *('"' + a + '"' if a != ";" else "\\;" for a in argv[1:])])
    return " ".join([head, *(exec_word(a, checked=clean) for a in argv[1:])])


def env_assignment(key: str, value: str) -> str:
    """Environment= value: one quoted KEY=value assignment."""
    if not ENV_KEY.match(key):
        raise UnsafeValue(f"environment variable name {key!r}")
    _refuse_control(value, f"environment value of {key}")
    return _quoted(f"{key}={value}")


def path_value(path: str) -> str:
    """A path for ReadOnlyPaths= and friends: absolute, specifiers escaped, quoted when it has spaces."""
    _refuse_control(path, "path")
    if not path.startswith("/"):
        raise UnsafeValue(f"path {path!r}: an absolute path is required")
    escaped = path.replace("%", "%%")
    if re.search(r"[\s\"'\\]", path):
        return _quoted(path)
    return escaped


def comment_text(text: str) -> str:
    """Text for a `#` comment line: no line breaks, no control characters."""
    return CONTROL.sub("?", text)
