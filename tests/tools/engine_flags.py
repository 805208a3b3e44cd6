"""Regenerate the committed lists of vLLM's and SGLang's command-line flags from a release wheel, without running it.

Their parsers need torch and a GPU build, so this reads the release's own source with `ast` and repeats what its
argparse set-up does:

- vLLM (`vllm serve`): every `add_argument` call in vllm/engine/arg_utils.py and
  vllm/entrypoints/launchers/cli_args.py, each `**get_kwargs(Config)["field"]` looked up in vllm/config/*.py; a
  field whose type holds `bool` (and is not `bool | str | None`) gets BooleanOptionalAction, so `--no-<name>` too
  (arg_utils._compute_kwargs); plus one `--<field>` per field of cli_args.FrontendArgs and its bases
  (BaseFrontendArgs.add_cli_args).
- SGLang (`python -m sglang.launch_server`): every `A[T, "help"]` / `A[T, Arg(...)]` field of the namespaces in
  sglang/srt/arg_groups/fields/*.py that sglang/srt/server_args.py lists in `_INPUT_NAMESPACES`, named
  `Arg.cli_name` or `--<field>` plus `Arg.aliases`, skipping `no_cli=True` (arg_utils.add_cli_args_from_dataclass),
  `--no-<name>` where the Arg's action is BooleanOptionalAction; plus the `add_argument` calls in server_args.py.

Usage (the versions the providers target, named in providers/vllm.py and providers/sglang.py):
    pip download vllm==0.30.0 --no-deps -d /tmp/w
    python -m tests.tools.engine_flags vllm /tmp/w/vllm-0.30.0-*.whl
    pip download sglang==0.5.22 --no-deps -d /tmp/w
    python -m tests.tools.engine_flags sglang /tmp/w/sglang-0.5.22-*.whl
Each writes tests/engine_flags/<package>-<version>.txt: a header naming the wheel and each source file with its
sha256, then one flag a line, sorted.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "engine_flags"

VLLM_ARG_UTILS = "vllm/engine/arg_utils.py"
VLLM_CLI_ARGS = "vllm/entrypoints/launchers/cli_args.py"
VLLM_CONFIG_DIR = "vllm/config/"
SGLANG_SERVER_ARGS = "sglang/srt/server_args.py"
SGLANG_FIELDS_DIR = "sglang/srt/arg_groups/fields/"
VLLM_ARGPARSE_UTILS = "vllm/utils/argparse_utils.py"
DEPRECATED = "(deprecated)"


class Sources:
    """The wheel's Python files, read on demand; remembers which were read, for the header."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self.zip = zipfile.ZipFile(wheel)
        self.read: dict[str, str] = {}

    def text(self, name: str) -> str:
        data = self.zip.read(name)
        self.read[name] = hashlib.sha256(data).hexdigest()
        return data.decode()

    def tree(self, name: str) -> ast.Module:
        return ast.parse(self.text(name), filename=name)

    def under(self, folder: str) -> list[str]:
        return sorted(n for n in self.zip.namelist() if n.startswith(folder) and n.endswith(".py"))


def union_members(node: ast.expr | None) -> Iterator[ast.expr]:
    """The top-level members of an annotation, as vLLM's get_type_hints flattens them (Annotated, Union, |)."""
    if node is None:
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from union_members(node.left)
        yield from union_members(node.right)
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if node.value.id in ("Union", "Optional"):
            for member in inner:
                yield from union_members(member)
        elif node.value.id == "Annotated":
            yield from union_members(inner[0])
        else:
            yield node
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        yield from union_members(ast.parse(node.value, mode="eval").body)
    else:
        yield node


def member_names(node: ast.expr | None, aliases: dict[str, ast.expr]) -> set[str]:
    """Names of the annotation's union members ("None" for None), following module-level type aliases."""
    names: set[str] = set()
    for member in union_members(node):
        if isinstance(member, ast.Constant) and member.value is None:
            names.add("None")
        elif isinstance(member, ast.Name) and member.id in aliases:
            names |= member_names(aliases[member.id], aliases)
        elif isinstance(member, ast.Name):
            names.add(member.id)
        else:
            names.add(ast.unparse(member))
    return names


def vllm_is_boolean(annotation: ast.expr | None, aliases: dict[str, ast.expr]) -> bool:
    """arg_utils._compute_kwargs: BooleanOptionalAction when bool is a member, unless the hint is bool | str | None."""
    names = member_names(annotation, aliases)
    return "bool" in names and names != {"bool", "str", "None"}


def module_aliases(tree: ast.Module) -> dict[str, ast.expr]:
    aliases: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            aliases[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            aliases[node.target.id] = node.value
    return aliases


class ClassFields:
    """Annotated fields of the classes of some modules (with their bases' fields), each with its module's aliases."""

    def __init__(self) -> None:
        self.classes: dict[str, tuple[ast.ClassDef, dict[str, ast.expr]]] = {}

    def add(self, tree: ast.Module) -> None:
        aliases = module_aliases(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, (node, aliases))

    def fields(self, name: str) -> dict[str, tuple[ast.expr, dict[str, ast.expr]]]:
        node, aliases = self.classes[name]
        found: dict[str, tuple[ast.expr, dict[str, ast.expr]]] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in self.classes:
                found |= self.fields(base.id)
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            if "ClassVar" not in ast.unparse(item.annotation):
                found[item.target.id] = (item.annotation, aliases)
        return found


def calls_to(tree: ast.AST, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            yield node


def literal_flags(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]


def explicit_boolean_optional(call: ast.Call) -> bool:
    return any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction") for k in call.keywords)


def spread_kwargs(call: ast.Call) -> Iterator[ast.Subscript]:
    """`**model_kwargs["field"]` and `**{**model_kwargs["field"], "default": None}` in a call."""
    for k in call.keywords:
        if k.arg is not None:
            continue
        spreads = (
            [v for key, v in zip(k.value.keys, k.value.values, strict=True) if key is None]
            if isinstance(k.value, ast.Dict)
            else [k.value]
        )
        yield from (s for s in spreads if isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name))


def negated(flags: Iterable[str]) -> list[str]:
    return [f"--no-{f[2:]}" for f in flags if f.startswith("--")]


def rewrites_dash_o(tree: ast.Module) -> bool:
    """FlexibleArgumentParser.parse_args turns `-O <n>` (and `-O3`) into `--optimization-level <n>` before argparse
    sees it: a comparison with "-O" next to the string "--optimization-level"."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and "'-O'" in ast.unparse(node.test)
            and "'--optimization-level'" in ast.unparse(node)
        ):
            return True
    return False


def vllm_flags(src: Sources) -> set[str]:
    configs = ClassFields()
    for name in src.under(VLLM_CONFIG_DIR):
        configs.add(src.tree(name))
    arg_utils = src.tree(VLLM_ARG_UTILS)
    kwargs_of: dict[str, str] = {}  # model_kwargs -> ModelConfig, from `model_kwargs = get_kwargs(ModelConfig)`
    for node in ast.walk(arg_utils):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if ast.unparse(call.func) == "get_kwargs" and isinstance(call.args[0], ast.Name):
                kwargs_of[ast.unparse(node.targets[0])] = call.args[0].id
    flags: set[str] = {"-h", "--help"}  # argparse's own
    for call in calls_to(arg_utils, "add_argument"):
        names = literal_flags(call)
        flags |= set(names)
        boolean = explicit_boolean_optional(call)
        for spread in spread_kwargs(call):
            cls, field = kwargs_of[ast.unparse(spread.value)], ast.literal_eval(spread.slice)
            annotation, aliases = configs.fields(cls)[field]
            boolean = boolean or vllm_is_boolean(annotation, aliases)
        if boolean:
            flags |= set(negated(names))
    cli_args = src.tree(VLLM_CLI_ARGS)
    frontend = ClassFields()
    frontend.add(cli_args)
    for call in calls_to(cli_args, "add_argument"):
        flags |= set(literal_flags(call))
    if rewrites_dash_o(src.tree(VLLM_ARGPARSE_UTILS)):
        flags.add("-O")
    for field, (annotation, aliases) in frontend.fields("FrontendArgs").items():
        flag = "--" + field.replace("_", "-")
        flags |= {flag, *(negated([flag]) if vllm_is_boolean(annotation, aliases) else [])}
    return flags


def sglang_arg(annotation: ast.expr) -> ast.expr | None:
    """The metadata of `A[T, meta]` (A is Annotated): a help string or an Arg(...) call; None when absent."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    for meta in parts[1:]:
        if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
            return meta
        if isinstance(meta, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            return meta
    return None


def sglang_field_flags(field: str, meta: ast.expr) -> list[str]:
    """arg_utils.add_cli_args_from_dataclass for one field."""
    keywords = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
    if "no_cli" in keywords and ast.literal_eval(keywords["no_cli"]) is True:
        return []
    name = ast.literal_eval(keywords["cli_name"]) if "cli_name" in keywords else "--" + field.replace("_", "-")
    names = [name, *(ast.literal_eval(keywords["aliases"]) if "aliases" in keywords else [])]
    if "action" in keywords and ast.unparse(keywords["action"]).endswith("BooleanOptionalAction"):
        names += negated(names)
    return names


def sglang_flags(src: Sources) -> set[str]:
    server_args = src.tree(SGLANG_SERVER_ARGS)
    (namespaces,) = [
        n.value
        for n in server_args.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_INPUT_NAMESPACES"
    ]
    assert isinstance(namespaces, ast.List)
    wanted = {ast.unparse(e) for e in namespaces.elts}
    classes = ClassFields()
    for name in src.under(SGLANG_FIELDS_DIR):
        classes.add(src.tree(name))
    missing = wanted - set(classes.classes)
    if missing:
        raise SystemExit(f"namespaces not found under {SGLANG_FIELDS_DIR}: {sorted(missing)}")
    flags: set[str] = {"-h", "--help"}  # argparse.ArgumentParser's own
    for ns in sorted(wanted):
        for field, (annotation, _aliases) in classes.fields(ns).items():
            meta = sglang_arg(annotation)
            if meta is not None:
                flags |= set(sglang_field_flags(field, meta))
    for call in calls_to(server_args, "add_argument"):
        names = literal_flags(call)
        flags |= set(names) | (set(negated(names)) if explicit_boolean_optional(call) else set())
        if any(k.arg == "action" and ast.unparse(k.value).startswith("Deprecated") for k in call.keywords):
            flags |= {f"{name} {DEPRECATED}" for name in names}
    return flags


def version_of(wheel: Path) -> tuple[str, str]:
    match = re.match(r"([A-Za-z0-9_]+)-([^-]+)-", wheel.name)
    if not match:
        raise SystemExit(f"{wheel}: not a wheel's file name")
    return match.group(1), match.group(2)


def listed(flags: set[str]) -> list[str]:
    """One line a flag, sorted; a flag the source registers with a Deprecated* action is marked so."""
    deprecated = {f.split()[0] for f in flags if f.endswith(DEPRECATED)}
    names = sorted({f.split()[0] for f in flags})
    return [f"{name} {DEPRECATED}" if name in deprecated else name for name in names]


def render(src: Sources, flags: set[str]) -> str:
    package, version = version_of(src.wheel)
    wheel_sha = hashlib.sha256(src.wheel.read_bytes()).hexdigest()
    header = [
        f"# {package} {version}: its command-line flags, read from the release's source by tests/tools/engine_flags.py",
        f"# wheel: {src.wheel.name} sha256 {wheel_sha}",
        *(f"# file: {name} sha256 {digest}" for name, digest in sorted(src.read.items())),
    ]
    return "\n".join(header + listed(flags)) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("vllm", "sglang"):
        print(__doc__, file=sys.stderr)
        return 2
    src = Sources(Path(argv[1]))
    flags = vllm_flags(src) if argv[0] == "vllm" else sglang_flags(src)
    package, version = version_of(src.wheel)
    out = OUT_DIR / f"{package}-{version}.txt"
    out.write_text(render(src, flags))
    print(f"{out}: {len(listed(flags))} flags")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
