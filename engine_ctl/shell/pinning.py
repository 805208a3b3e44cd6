"""Pinning at plan: every `hf:` reference of the documents is resolved by the hub to the commit it points at,
and the files of that commit a host will fetch are kept for the plan. Only plan and apply pin (validate stays
offline and refuses a reference without a commit)."""

from __future__ import annotations

from engine_ctl.core.diagnostics import Diagnostic
from engine_ctl.core.documents.rules import where
from engine_ctl.core.model import DesiredState, LoadedModel
from engine_ctl.core.weights import COMMIT, Checkout, HubError, pin, revision_of, select_files
from engine_ctl.shell.hub import Hub


class Pinner:
    """Pins documents through one hub; `checkouts` then holds each pinned model's files by model name."""

    def __init__(self, hub: Hub | None = None) -> None:
        self._hub = hub
        self.checkouts: dict[str, Checkout] = {}

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            self._hub = Hub.from_environment()
        return self._hub

    def __call__(self, desired: DesiredState) -> tuple[DesiredState, list[Diagnostic]]:
        commits: dict[str, str] = {}
        problems: list[Diagnostic] = []
        for loaded in desired.models:
            hf = loaded.model.hf
            if hf is None or (hf.commit and not COMMIT.match(hf.commit)):  # the rules say what is wrong
                continue
            try:
                commit, files = self.hub.revision(hf.repo, revision_of(hf))
                chosen = select_files(loaded.model, files)
            except HubError as exc:
                problems.append(self._problem(loaded, str(exc)))
                continue
            if hf.commit and hf.commit != commit:  # a branch or tag name is refused by the rules; never here
                problems.append(self._problem(loaded, f"the hub resolved {hf} to another commit, {commit}"))
                continue
            commits[str(hf)] = commit
            self.checkouts[loaded.model.name] = Checkout(repo=hf.repo, commit=commit, files=chosen)
        return pin(desired, commits), problems

    @staticmethod
    def _problem(loaded: LoadedModel, message: str) -> Diagnostic:
        location, path = where(loaded.origin, "hf")
        return Diagnostic(
            location, path, message, hint="fix the reference, or pin it yourself (org/repo@<commit>)", code="HF_PIN"
        )


UNRESOLVED = "0" * 40


def unresolved(desired: DesiredState) -> tuple[DesiredState, list[Diagnostic]]:
    """For destroy, which wants nothing of the documents but where the inventory is: their hf: references are
    not asked of the hub (destroy works without it), only marked as pinned so the rules let them load."""
    refs = {str(m.model.hf): UNRESOLVED for m in desired.models if m.model.hf is not None and not m.model.hf.commit}
    return pin(desired, refs), []
