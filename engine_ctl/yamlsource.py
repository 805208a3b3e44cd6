"""Read YAML/JSON files into plain values, keeping the line and column of every key and value.

Pure where it can be: `parse_text` takes text; only `read_path` touches the filesystem.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from engine_ctl.diagnostics import Diagnostic, Location

DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 8 * 1024 * 1024

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


def _plain(node: Any, path: Path_, doc: SourceDocument) -> Any:
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            skey = key if isinstance(key, str) else str(key)
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
        return str(node)
    if isinstance(node, datetime.date | bytes):
        return node
    if hasattr(node, "value"):  # TaggedScalar and friends
        return _plain(node.value, path, doc)
    return str(node)


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
            )
        ]
    return text, []


def parse_text(text: str, file: str) -> tuple[list[SourceDocument], list[Diagnostic]]:
    """Parse every document of a YAML stream. Empty documents are dropped; an empty file is an error."""
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    docs: list[SourceDocument] = []
    try:
        for index, node in enumerate(yaml.load_all(text)):
            if node is None:
                continue
            line, column = 1, 1
            lc = getattr(node, "lc", None)
            if lc is not None and lc.line is not None:
                line, column = lc.line + 1, lc.col + 1
            doc = SourceDocument(file=file, index=index, data=None, line=line, column=column)
            doc.data = _plain(node, (), doc)
            docs.append(doc)
    except MarkedYAMLError as exc:
        message = _yaml_message(exc)
        hint = "fix the YAML syntax"
        dup = re.search(r'found duplicate key "(.*?)" with value', message)
        if dup:
            message = f"duplicate key {dup.group(1)!r}"
            hint = "each key may appear once in a mapping"
        return [], [Diagnostic(_mark_location(file, exc), "", message, hint=hint)]
    except YAMLError as exc:
        return [], [Diagnostic(Location(file, 1, 1), "", f"invalid YAML: {exc}", hint="fix the YAML syntax")]
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return [], [Diagnostic(Location(file, 1, 1), "", f"cannot read document: {exc}")]
    if not docs:
        return [], [
            Diagnostic(Location(file, 1, 1), "", "empty file: no document in it", hint="write a deployment document")
        ]
    return docs, []


def read_path(path: Path) -> tuple[list[SourceDocument], list[Diagnostic]]:
    """Read one file (imperative shell)."""
    name = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return [], [Diagnostic(Location(name), "", f"file is {size} bytes; documents are at most 8 MiB")]
        raw = path.read_bytes()
    except OSError as exc:
        return [], [Diagnostic(Location(name), "", f"cannot read: {exc.strerror or exc}")]
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
                    Diagnostic(Location(str(path)), "", "no *.yaml, *.yml or *.json file in this directory")
                )
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            problems.append(Diagnostic(Location(str(path)), "", "no such file or directory"))
    return out, problems
