"""Diagnostics: what is wrong, where (file:line:column and field path), and what to do."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]

CODES: dict[str, str] = {
    # reading files (YAML and JSON)
    "path_not_found": "a path given does not exist",
    "no_document_files": "a directory holds no *.yaml, *.yml or *.json file",
    "unreadable_file": "a file cannot be read (permissions, an I/O error)",
    "file_too_large": "a file is larger than 1 MiB",
    "not_utf8": "a file is not UTF-8 text",
    "binary_data": "a file holds a NUL byte",
    "yaml_syntax": "a file is not valid YAML (or JSON)",
    "duplicate_key": "a key appears twice in one mapping",
    "yaml_limit": "too many aliases or nodes, or a recursive alias",
    "nesting_too_deep": "a document nests deeper than engine-ctl reads",
    "empty_file": "a file holds no document",
    "text_too_long": "a key or value is longer than engine-ctl takes",
    "control_character": "a control or invisible character in a name, path, label or argument",
    "more_problems": "the count of further problems of the same kind, not listed one by one",
    # what a document is, and its shape
    "not_a_mapping": "a document is a list or a scalar, not a mapping",
    "unknown_kind": "kind: names no kind engine-ctl knows",
    "not_a_document": "a mapping that is not an engine-ctl document",
    "unknown_field": "a field the document's form does not have (with a did-you-mean)",
    "missing_field": "a required field is missing",
    "wrong_type": "a field's value has the wrong type or is not one of the allowed values",
    "invalid_size": "a byte size that cannot be read (e.g. 16GiB)",
    "invalid_architecture": "spec.architecture of a Model is not a whole, consistent shape",
    # rules over deployments and models
    "invalid_name": "a deployment, model or host name outside the allowed characters or length",
    "duplicate_name": "two documents define the same deployment, model or host name",
    "unknown_model": "a deployment names a model no Model document defines",
    "out_of_range": "a number outside its allowed range (replicas, parallel, cpu_cores, gpus, priority, …)",
    "nodes_unsupported": "spec.nodes above 1 where a replica cannot span machines (the engine, on-demand replicas, "
    "spec.host, a decisions deployment)",
    "topology_refused": "a flat-form deployment asks to span machines (seed 003: a topology is refused)",
    "conflicting_options": "options that do not go together (logs --json without --gateway, status --watch --json)",
    "missing_argument": "a command run without an argument it needs (logs without a deployment or --gateway)",
    "no_gateway": "the inventory has no gateway host, so no request log to read (logs --gateway, usage)",
    "no_metrics": "the inventory has no monitoring block (or no gateway host): nothing exports metrics",
    "port_taken": "monitoring.port is a port the gateway hosts already use (gateway_port, SSH, the scaler's wake port)",
    "monitoring_host": "a monitoring host neither an inventory host with an IP address nor an address or network",
    "context_too_long": "context_length above the model's maximum",
    "accelerator_mismatch": "the engine does not run on the accelerator asked for",
    "format_mismatch": "the engine does not serve the model's format (GGUF vs safetensors)",
    "capability_missing": "the engine does not serve what the deployment asks for (decisions, speech to text, video)",
    "profile_not_published": "validate --inventory: the host a deployment names registers no build of its engine "
    "for what it runs on",
    "decisions_conflict": "a setting a decisions deployment cannot have",
    "extra_args_not_accepted": "flat form: extra_args without accept_extra_args: true",
    "model_source_missing": "a model has neither path nor hf",
    "model_source_conflict": "a model has both path and hf",
    "path_escapes": "a model path with '..'",
    "invalid_hf_repo": "an hf: reference that is not org/repo",
    "unpinned_hf": "an hf: reference without a commit",
    "invalid_commit": "a commit that is not 40 hexadecimal digits",
    "ambiguous_commit": "a commit given twice (in hf: and in commit:)",
    "hf_unresolved": "an hf: reference the hub could not resolve to its commit (or resolved to another one)",
    "unknown_host": "spec.host, --target or a host argument names no host of the inventory",
    "ignored_field": "warning: a field that is accepted but has no effect",
    # engine arguments
    "too_many_args": "more engine arguments than engine-ctl takes",
    "arg_too_long": "an engine argument longer than engine-ctl takes",
    "shell_character": "an engine argument with a shell character",
    "value_without_flag": "an engine argument that is a value with no flag before it",
    "one_argument_per_item": "a flag and its value written as one item with a space",
    "short_flag": "a flag in its short form (-c, not --ctx-size)",
    "flag_set_by_deployment": "a flag engine-ctl sets from a deployment field",
    "flag_refused": "a flag refused by design (network, keys, remote code)",
    "flag_not_allowed": "a flag not on the engine's allow-list",
    # the inventory
    "not_absolute_path": "an inventory path (models_dir, cache_dir) that is not absolute",
    "invalid_interface": "an inventory network_interface that is not a network interface's name",
    "invalid_executable": "an engine executable path systemd cannot run as given",
    "invalid_key_hash": "an ApiKey's sha256 that is not 64 lowercase hexadecimal digits",
    "invalid_expiry": "an ApiKey's expires that is not a date or a date and time",
    "invalid_sha256": "an engine build's sha256 that is not 64 lowercase hexadecimal digits",
    "no_engine_build": "an engine given per platform with no build for any platform",
    "duplicate_address": "two inventory hosts with the same address",
    "no_hosts": "an inventory without hosts",
    "one_inventory_document": "an inventory file with more than one document",
    "no_inventory": "no inventory was given or found",
    "scaler_lock_role": "scaling.lock's role and password_file not given together, or a role name PostgreSQL "
    "does not take unquoted",
    "scaler_lock_address": "with PostgreSQL state and several gateway hosts, the scalers' lock would be on a local "
    "socket or localhost (each host's own): scaling.lock.host names the database's address",
    # commands
    "no_documents": "no deployment or model document was loaded from the paths given",
    "unknown_deployment": "a deployment name that is not in the documents or the state (with the names there)",
    "unknown_instance": "logs --instance names no instance of the deployment",
    "nothing_runs": "the deployment has no replicas recorded",
    "invalid_since": "logs --since is not a duration or a time",
    "state_error": "the state cannot be read, written or locked (the message says which and why)",
    "state_move_refused": "state push or pull refused (same state, nothing to move, another lineage)",
    "state_edit_refused": "state rm or state mv refused (an unknown name, a name in use)",
    "import_refused": "import refused (a state that is not empty without --force, nothing on the hosts to adopt)",
    "confirmation_needed": "apply asks for confirmation and stdin is not a terminal",
    "not_a_plan": "a file given as a saved plan is not one (the message says what it is)",
    "plan_tampered": "a saved plan is not what engine-ctl renders from its recorded inputs",
    "plan_stale": "a saved plan no longer matches the state or a host's facts",
    "destroy_refused": "a plan that destroys a deployment with prevent_destroy: true",
    "replace_refused": "--replace (or restart) names a deployment with no replicas recorded: nothing to replace",
    # revisions and request identities (lifecycle records)
    "revision_mismatch": "apply --revision NAME=N, and NAME's recorded revision is not N: someone applied since",
    "invalid_revision_check": "--revision is not NAME=N (a deployment name and a whole number)",
    "invalid_request_id": "--request-id is not a ULID (26 characters of Crockford's base 32)",
    "request_mismatch": "--request-id names a request recorded for another command",
    # operator verbs (stop, start, park, delete): exit status 1 unless EXIT_STATUSES says otherwise
    "still_stopping": "start right after a stop: the stop is still under way; nothing was started (exit 25)",
    "delete_requires_cleanup": "delete of a deployment not stopped, or still stopping; nothing was deleted (exit 25)",
    "park_refused": "park refused: the host's free memory cannot hold what sleep level 1 keeps (exit 1)",
    "deployment_held": "a verb on a deployment another verb holds (deleted, or stopped for park) (exit 1)",
    "deployment_stopped": "the gateway's answer (HTTP 409) to a request for a deployment an operator stopped",
    "engine_error": "the gateway's answer (HTTP 502) when a decision model's engine cannot read the input (longer "
    "than its batch or context) or fails it, with the engine's own message",
    "operator_failed": "an operator verb failed on a host (unreachable, or its job failed there) (exit 1)",
}
"""Every diagnostic's stable `code` (the `code` of each detail in `--json` errors) and what it means; the README
lists them all (tests/test_error_codes.py checks both ways)."""


@dataclass(frozen=True)
class Location:
    """A place in a source file; line and column are 1-based."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.column or 1}"


@dataclass(frozen=True)
class Diagnostic:
    """One finding about an input document."""

    location: Location
    field: str
    message: str
    hint: str | None = None
    severity: Severity = "error"
    code: str = dataclasses.field(kw_only=True)
    """One of CODES: stable, for scripts (the message's wording may change; the code does not)."""

    def render(self) -> str:
        where = str(self.location)
        head = f"{where}: {self.severity}: "
        if self.field and not self.message.startswith(self.field):
            head += f"{self.field}: "
        text = head + self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def as_json(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            "field": self.field,
            "message": self.message,
            "hint": self.hint,
            "code": self.code,
        }


REFUSALS = frozenset(
    {
        "state_error",
        "state_move_refused",
        "state_edit_refused",
        "import_refused",
        "confirmation_needed",
        "plan_tampered",
        "plan_stale",
        "destroy_refused",
        "revision_mismatch",
        "request_mismatch",
    }
)
"""Codes of a command refused for what the state, a lock or a saved plan says (409 REFUSED); every other code is
bad input (400 INVALID_DEPLOYMENT)."""


EXIT_STATUSES: dict[str, int] = {
    "revision_mismatch": 26,
    # operator verbs (seed 003: still_stopping exits 25; a delete right after a stop is refused "the same way")
    "still_stopping": 25,
    "delete_requires_cleanup": 25,
}
"""The exit status of a command refused with one of these codes; every other code exits 1 (README, Exit codes)."""


def exit_status(diagnostics: Iterable[Diagnostic]) -> int:
    """The exit status of a command that failed with these diagnostics: its first error's code's (EXIT_STATUSES),
    else 1."""
    found = [d for d in diagnostics if d.severity == "error"]
    return EXIT_STATUSES.get(found[0].code, 1) if found else 1


def error_object(diagnostics: Iterable[Diagnostic]) -> dict[str, object]:
    """The `--json` error: `{"error": {"status": 400, "code": "INVALID_DEPLOYMENT", "message", "details"}}`."""
    found = [d for d in diagnostics if d.severity == "error"] or list(diagnostics)
    refused = bool(found) and all(d.code in REFUSALS for d in found)
    status, code = (409, "REFUSED") if refused else (400, "INVALID_DEPLOYMENT")
    return {
        "format_version": 1,
        "error": {
            "status": status,
            "code": code,
            "message": f"{len(found)} problem(s); nothing was changed",
            "details": [d.as_json() for d in found],
        },
    }


class InputError(Exception):
    """Raised by the shell when input cannot be used; carries diagnostics for the user."""

    def __init__(self, diagnostics: Iterable[Diagnostic], printed: bool = False) -> None:
        self.diagnostics = list(diagnostics)
        self.printed = printed
        """Already printed on stderr (only the --json error object is still to be printed)."""
        super().__init__("\n".join(d.render() for d in self.diagnostics))


def by_place(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """In reading order: by file, then line, then column (a diagnostic without a line first in its file); the
    order found is kept among equals."""
    return sorted(diagnostics, key=lambda d: (d.location.file, d.location.line or 0, d.location.column or 0))


def errors(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


def format_path(path: tuple[object, ...]) -> str:
    """('spec', 'engine_args', 2) -> 'spec.engine_args[2]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
