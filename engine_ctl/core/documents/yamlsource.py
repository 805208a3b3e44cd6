"""Read YAML/JSON files into plain values, keeping the line and column of every key and value.

Pure where it can be: `parse_text` takes text; only `read_path` touches the filesystem.
"""

from __future__ import annotations

import datetime
import re
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, ReusedAnchorWarning, StreamMark, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.tag import Tag

from engine_ctl.core.diagnostics import Diagnostic, Location, format_path

try:  # ruamel's binding of libyaml (ruamel.yaml.clib): the same events as its pure parser, about 30x faster
    from _ruamel_yaml import CParser
except ImportError:  # pragma: no cover - without it, the pure parser reads every file
    CParser = None

DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")

# Bounds on what one file may make engine-ctl do: documents come from pull requests, so they are untrusted.
MAX_FILE_BYTES = 1024 * 1024
"""Bytes per file (1 MiB)."""
MAX_DEPTH = 64
"""Nesting levels of mappings and lists."""
MAX_ALIASES = 1_000
"""Alias references (*name) per file."""
MAX_NODES = 50_000
"""Keys, values and list items per file, each alias counted as all the nodes it stands for."""
MAX_TEXT_CHARS = 4096
"""Characters per string (PATH_MAX; engine arguments have the same bound)."""
MAX_MULTILINE_CHARS = 65_536
"""Characters of a multi-line text field (a Jinja chat_template)."""
MULTILINE_FIELDS = frozenset({"chat_template"})
"""Fields whose text may hold line breaks and tabs; it never reaches a unit or an argv as it is."""
MAX_REPORTED = 20
"""Values reported one by one per document; the rest are counted."""
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode control, format (invisible, bidi), surrogate and line/paragraph separator characters."""
ALIAS_HINT = (
    "write the values out instead of nesting aliases, or split the documents into several files "
    "(each file: at most 1,000 aliases and 50,000 nodes, aliases expanded)"
)
CHARACTER_NAMES = {
    "\t": "tab",
    "\n": "line feed",
    "\r": "carriage return",
    "\x0b": "vertical tab",
    "\x0c": "form feed",
    "\x1b": "escape",
    "\x7f": "delete",
    "\x85": "next line",
}

Path_ = tuple[str | int, ...]


@dataclass
class SourceDocument:
    """One YAML document of a file, as plain Python values plus where each part was written."""

    file: str
    index: int
    data: Any
    line: int
    column: int
    value_positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: Path_, *, key: bool = False) -> Location:
        """The location of the deepest known part of `path` (key position if asked for and known)."""
        probe = tuple(path)
        while probe:
            if key and probe in self.key_positions:
                line, col = self.key_positions[probe]
                return Location(self.file, line, col)
            if probe in self.value_positions:
                line, col = self.value_positions[probe]
                return Location(self.file, line, col)
            if probe in self.key_positions:
                line, col = self.key_positions[probe]
                return Location(self.file, line, col)
            probe = probe[:-1]
        return Location(self.file, self.line, self.column)


def _join_surrogates(text: str) -> str:
    """JSON writes U+1F600 as the pair \\ud83d\\ude00, which YAML reads as two surrogates: join such pairs
    into the one character they stand for. A lone surrogate stays, and is refused (see text_problems)."""
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _plain(node: Any, path: Path_, doc: SourceDocument) -> Any:
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            skey = _join_surrogates(key) if isinstance(key, str) else str(key)
            kpath = (*path, skey)
            try:
                kline, kcol = node.lc.key(key)
                doc.key_positions[kpath] = (kline + 1, kcol + 1)
                vline, vcol = node.lc.value(key)
                doc.value_positions[kpath] = (vline + 1, vcol + 1)
            except (KeyError, TypeError, AttributeError):
                pass
            out[skey] = _plain(node[key], kpath, doc)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, item in enumerate(node):
            ipath = (*path, i)
            try:
                iline, icol = node.lc.item(i)
                doc.value_positions[ipath] = (iline + 1, icol + 1)
            except (KeyError, TypeError, AttributeError):
                pass
            items.append(_plain(item, ipath, doc))
        return items
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return _join_surrogates(str(node))
    if isinstance(node, datetime.date | bytes):
        return node
    if hasattr(node, "value"):  # TaggedScalar and friends
        return _plain(node.value, path, doc)
    return str(node)


def character_name(ch: str) -> str:
    """'U+000A (line feed)', 'U+2028 (LINE SEPARATOR)'."""
    name = CHARACTER_NAMES.get(ch) or unicodedata.name(ch, "") or "control character"
    return f"U+{ord(ch):04X} ({name})"


NONCHARACTERS = "\ufdd0-\ufdef" + "".join(
    chr(plane + 0xFFFE) + chr(plane + 0xFFFF) for plane in range(0, 0x110000, 1 << 16)
)
"""Unicode's noncharacters, as a regular expression's character class: systemd refuses a line holding one as not
UTF-8 clean and ignores the directive (utf8.c, unichar_is_valid), so a unit with one in its ExecStart= has none."""
NONCHARACTER = re.compile(f"[{NONCHARACTERS}]")
"""Unicode's noncharacters (U+FDD0..U+FDEF, the last two code points of every plane): systemd refuses a unit line
holding one as not UTF-8 clean and drops the directive, so none may reach a unit."""


def bad_character(text: str, allowed: str = "") -> str | None:
    """The first character of `text` that may not reach a unit or an argv, named; None when there is none."""
    for ch in text:
        if unicodedata.category(ch) in FORBIDDEN_CATEGORIES and ch not in allowed:
            return character_name(ch)
    found = NONCHARACTER.search(text)
    return f"U+{ord(found.group()):04X} (a noncharacter)" if found else None


def _text_problem(doc: SourceDocument, path: Path_, text: str, *, key: bool) -> Diagnostic | None:
    where = format_path(path)
    multiline = not key and bool(path) and path[-1] in MULTILINE_FIELDS
    limit = MAX_MULTILINE_CHARS if multiline else MAX_TEXT_CHARS
    what = "key" if key else "value"
    if len(text) > limit:
        return Diagnostic(
            doc.locate(path, key=key),
            where,
            f"{what} is {len(text)} characters; at most {limit}",
            hint="names, paths and arguments are short, one-line text",
            code="text_too_long",
        )
    bad = bad_character(text, "\n\t" if multiline else "")
    if bad is None:
        return None
    return Diagnostic(
        doc.locate(path, key=key),
        where,
        f"{what} {text[:60]!r}: no control or invisible characters; found {bad}",
        hint="names, paths, labels and engine arguments are one line of visible text: remove the character "
        "(in double quotes, escapes such as \\n, \\t and \\u2028 write one)",
        code="control_character",
    )


def text_problems(doc: SourceDocument) -> list[Diagnostic]:
    """Every key and string of a document that is too long or holds a character no unit or argv may carry."""
    out: list[Diagnostic] = []
    stack: list[tuple[Path_, Any]] = [((), doc.data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                problem = _text_problem(doc, (*path, k), str(k), key=True)
                if problem is not None:
                    out.append(problem)
                stack.append(((*path, k), v))
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))
        elif isinstance(value, str):
            problem = _text_problem(doc, path, value, key=False)
            if problem is not None:
                out.append(problem)
    out.sort(key=lambda d: (d.location.line or 0, d.location.column or 0))
    if len(out) > MAX_REPORTED:
        more = len(out) - MAX_REPORTED
        out[MAX_REPORTED:] = [
            Diagnostic(
                out[MAX_REPORTED].location, "", f"and {more} more such values from here on", code="more_problems"
            )
        ]
    return out


class LimitExceeded(MarkedYAMLError):
    """A file passes one of the bounds on aliases and nodes, or holds a recursive alias."""

    def __init__(self, problem: str, mark: StreamMark, hint: str = ALIAS_HINT) -> None:
        super().__init__(None, None, problem, mark)
        self.hint = hint


class BoundedComposer(Composer):
    """ruamel's composer, counting as it goes: alias references, and nodes with each alias counted as the nodes
    it stands for (so a billion-laughs document is refused after MAX_NODES, not expanded). An alias inside the
    node it names (a recursive structure) is refused too."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self.alias_count = 0
        self.node_count = 0
        self.sizes: dict[int, tuple[Any, int]] = {}

    def compose_document(self) -> Any:
        self.sizes = {}
        return super().compose_document()

    def _count(self, n: int, mark: StreamMark) -> None:
        self.node_count += n
        if self.node_count > MAX_NODES:
            raise LimitExceeded(f"more than {MAX_NODES:,} nodes in one file, aliases expanded", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                self.alias_count += 1
                if self.alias_count > MAX_ALIASES:
                    raise LimitExceeded(f"more than {MAX_ALIASES:,} aliases in one file", event.start_mark)
                size = self.sizes.get(id(target))
                if size is None:
                    raise LimitExceeded(
                        f"alias *{event.anchor} inside the node it names (a recursive structure)",
                        event.start_mark,
                        hint="an alias names a node written completely before it",
                    )
                self._count(size[1], event.start_mark)
            return super().compose_node(parent, index)
        before = self.node_count
        self._count(1, self.parser.peek_event().start_mark)
        node = super().compose_node(parent, index)
        if getattr(node, "anchor", None) is not None:
            self.sizes[id(node)] = (node, self.node_count - before)
        return node


def _limit_diagnostic(file: str, exc: LimitExceeded | MaxDepthExceededError) -> Diagnostic:
    if isinstance(exc, LimitExceeded):
        return Diagnostic(_mark_location(file, exc), "", str(exc.problem), hint=exc.hint, code="yaml_limit")
    return Diagnostic(
        _mark_location(file, exc),
        "",
        f"nested more than {MAX_DEPTH} levels deep",
        hint=f"documents nest a few levels; engine-ctl reads at most {MAX_DEPTH}",
        code="nesting_too_deep",
    )


def _size_diagnostic(file: str, text: str | bytes, size: int) -> Diagnostic:
    """At the place where the file passes MAX_FILE_BYTES."""
    head = text[:MAX_FILE_BYTES]
    newline = "\n" if isinstance(head, str) else b"\n"
    line = head.count(newline) + 1  # type: ignore[arg-type]
    column = len(head) - (head.rfind(newline) + 1) + 1  # type: ignore[arg-type]
    shown = f"{size:,} bytes" if size > MAX_FILE_BYTES else "larger than 1 MiB"
    return Diagnostic(
        Location(file, line, column),
        "",
        f"file is {shown}; engine-ctl reads at most 1 MiB ({MAX_FILE_BYTES:,} bytes) per file",
        hint="split the documents into several files",
        code="file_too_large",
    )


def _mark_location(file: str, err: MarkedYAMLError) -> Location:
    mark = err.problem_mark or err.context_mark
    if mark is None:
        return Location(file, 1, 1)
    return Location(file, mark.line + 1, mark.column + 1)


def _yaml_message(err: MarkedYAMLError) -> str:
    parts = [p for p in (err.context, err.problem) if p]
    text = "; ".join(str(p).strip() for p in parts) or "invalid YAML"
    return text


def decode(raw: bytes, file: str) -> tuple[str | None, list[Diagnostic]]:
    """Decode bytes as UTF-8 text, refusing binary input with a located message."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        return None, [
            Diagnostic(
                Location(file, line, column),
                "",
                f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                hint="documents are UTF-8 YAML or JSON; is this a binary file?",
                code="not_utf8",
            )
        ]
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        return None, [
            Diagnostic(
                Location(file, line, column),
                "",
                "binary data (a NUL byte) in a document",
                hint="documents are UTF-8 YAML or JSON text",
                code="binary_data",
            )
        ]
    return text, []


def parse_text(text: str, file: str) -> tuple[list[SourceDocument], list[Diagnostic]]:
    """Parse every document of a YAML stream. Empty documents are dropped; an empty file is an error."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        return [], [_size_diagnostic(file, text, size)]
    docs = _fast_documents(text, file)
    if docs is None:
        docs, problems = _pure_documents(text, file)
        if problems:
            return [], problems
    if not docs:
        return [], [
            Diagnostic(
                Location(file, 1, 1),
                "",
                "empty file: no document in it",
                hint="write a deployment document",
                code="empty_file",
            )
        ]
    return docs, []


def _pure_documents(text: str, file: str) -> tuple[list[SourceDocument], list[Diagnostic]]:
    """ruamel's round-trip loader, parser included, in Python: the reference, and every error's message."""
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.max_depth = MAX_DEPTH
    yaml.Composer = BoundedComposer
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReusedAnchorWarning)
            return _documents(yaml.load_all(text), file), []
    except (LimitExceeded, MaxDepthExceededError) as exc:
        return [], [_limit_diagnostic(file, exc)]
    except MarkedYAMLError as exc:
        message = _yaml_message(exc)
        hint, code = "fix the YAML syntax", "yaml_syntax"
        dup = re.search(r'found duplicate key "(.*?)" with value', message)
        if dup:
            message = f"duplicate key {dup.group(1)!r}"
            hint, code = "each key may appear once in a mapping", "duplicate_key"
        return [], [Diagnostic(_mark_location(file, exc), "", message, hint=hint, code=code)]
    except YAMLError as exc:
        return [], [
            Diagnostic(Location(file, 1, 1), "", f"invalid YAML: {exc}", hint="fix the YAML syntax", code="yaml_syntax")
        ]
    except (ValueError, TypeError, IndexError, RecursionError) as exc:  # ruamel's constructors: `+_` reads as an int
        return [], [
            Diagnostic(
                Location(file, 1, 1),
                "",
                f"cannot read a value of the document ({type(exc).__name__}: {exc})",
                hint="quote any value that looks like a number but is not one (for example '+_')",
                code="yaml_syntax",
            )
        ]


STEP_ASIDE = re.compile(r"^%|\r(?!\n)|[\x85\u2028\u2029]", re.MULTILINE)
"""Where the fast path leaves a file to the pure one: a directive (%YAML 1.1 changes what the pure loader
resolves), and line breaks other than \\n and \\r\\n (libyaml's lines would not be str.split's)."""


def _fast_documents(text: str, file: str) -> list[SourceDocument] | None:
    """The same documents as the pure loader, its parser swapped for libyaml's: the same composer (with the
    bounds) and constructor run on the C parser's events. None where only the pure loader may answer: no C
    parser, STEP_ASIDE, or any error at all (the pure loader's message and place are the ones users see), so the
    two never differ in what a user sees (tests/test_yaml_fast_path.py)."""
    if CParser is None or STEP_ASIDE.search(text):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReusedAnchorWarning)
            return _documents(_CLoader(text).load_all(), file)
    except Exception:
        return None


def _documents(loaded: Iterable[Any], file: str) -> list[SourceDocument]:
    docs: list[SourceDocument] = []
    for index, node in enumerate(loaded):
        if node is None:
            continue
        line, column = 1, 1
        lc = getattr(node, "lc", None)
        if lc is not None and lc.line is not None:
            line, column = lc.line + 1, lc.col + 1
        doc = SourceDocument(file=file, index=index, data=None, line=line, column=column)
        doc.data = _plain(node, (), doc)
        docs.append(doc)
    return docs


class _StepAside(Exception):
    """The fast path cannot be sure to read this file as the pure one does: the pure one reads it."""


class _CEvents:
    """The C parser's events as the pure parser gives them: explicit tags as Tag (not str), and empty values
    placed where ruamel places them."""

    def __init__(self, text: str) -> None:
        self._parser = CParser(text)
        self._text = text
        self._lines: list[str] | None = None
        self._flow: list[bool] = []
        self.check_event = self._parser.check_event

    def peek_event(self) -> Any:
        return _tagged(self._parser.peek_event())

    def get_event(self) -> Any:
        event = _tagged(self._parser.get_event())
        kind = type(event)
        if kind is ScalarEvent:
            if event.value == "" and event.style == "":  # an empty value: no text, so placed by rule
                self._place_empty(event)
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            self._flow.append(bool(event.flow_style))
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            self._flow.pop()
        return event

    def _place_empty(self, event: Any) -> None:
        """ruamel places an empty value after `key:` at what follows in a block, and just after the colon in a flow
        mapping; libyaml the other way round."""
        if self._lines is None:
            self._lines = self._text.split("\n")
        line, column = event.start_mark.line, event.start_mark.column
        text = self._lines[line] if line < len(self._lines) else ""
        if self._flow and self._flow[-1]:
            before = text[:column].rstrip(" \t")
            if not before:
                raise _StepAside("an empty flow value at the start of a line")
            if before.endswith(":"):
                event.start_mark = event.end_mark = StreamMark(None, 0, line, len(before))
        elif text[column - 1 : column] == ":":
            if text[column:].lstrip(" \t\r").startswith("#"):  # ruamel's place then hangs on where the comment goes
                raise _StepAside("an empty value with a comment after it")
            mark = self._parser.peek_event().start_mark
            after = self._lines[mark.line][: mark.column] if mark.line < len(self._lines) else ""
            if after.rstrip(" \t").endswith("?"):  # an explicit key next: ruamel places it after the `?`
                raise _StepAside("an empty value before an explicit key")
            event.start_mark = event.end_mark = mark

    def dispose(self) -> None:
        self._parser.dispose()


def _tagged(event: Any) -> Any:
    if isinstance(getattr(event, "ctag", None), str):
        event.ctag = Tag(suffix=event.ctag)
    return event


class _FastComposer(BoundedComposer):
    """BoundedComposer with its parser and resolver as attributes (ruamel looks them up on every event)."""

    parser: Any = None
    resolver: Any = None


class _FastConstructor(RoundTripConstructor):
    composer: Any = None
    resolver: Any = None


class _CLoader:
    """What ruamel's composer, resolver and constructor ask of a loader, as YAML(typ="rt") answers it, with the C
    parser's events under them."""

    max_depth = MAX_DEPTH
    comment_handling = None

    def __init__(self, text: str) -> None:
        self._scanner = SimpleNamespace(yaml_version=None)  # no %YAML directive: YAML 1.2, as the pure loader
        self._parser = _CEvents(text)
        self._resolver = VersionedResolver(loader=self)
        self._composer = _FastComposer(loader=self)
        self._composer.parser, self._composer.resolver = self._parser, self._resolver
        self._constructor = _FastConstructor(loader=self)
        self._constructor.composer, self._constructor.resolver = self._composer, self._resolver
        self._constructor.allow_duplicate_keys = False

    def load_all(self) -> Iterator[Any]:
        try:
            while self._constructor.check_data():
                yield self._constructor.get_data()
        finally:
            self._parser.dispose()


def read_path(path: Path) -> tuple[list[SourceDocument], list[Diagnostic]]:
    """Read one file (imperative shell): at most MAX_FILE_BYTES, so a device or a pipe cannot fill memory."""
    name = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
            size = path.stat().st_size
    except OSError as exc:
        return [], [Diagnostic(Location(name), "", f"cannot read: {exc.strerror or exc}", code="unreadable_file")]
    if len(raw) > MAX_FILE_BYTES:
        return [], [_size_diagnostic(name, raw, size)]
    text, problems = decode(raw, name)
    if text is None:
        return [], problems
    return parse_text(text, name)


def expand_paths(paths: list[Path]) -> tuple[list[Path], list[Diagnostic]]:
    """Files as given; directories expand to their *.yaml, *.yml and *.json files, sorted."""
    out: list[Path] = []
    problems: list[Diagnostic] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file()
                and p.suffix in DOCUMENT_SUFFIXES
                and not p.name.startswith(".")
                and not p.name.startswith("engine-ctl.state.json")
            )
            if not found:
                problems.append(
                    Diagnostic(
                        Location(str(path)),
                        "",
                        "no *.yaml, *.yml or *.json file in this directory",
                        code="no_document_files",
                    )
                )
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            problems.append(Diagnostic(Location(str(path)), "", "no such file or directory", code="path_not_found"))
    return out, problems
