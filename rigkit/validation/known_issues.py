"""Known-bad llama.cpp builds and settings (rigkit/validation/llamacpp-known-issues.yml), refused on the controller:
a rig whose pinned build and settings meet an upstream issue that breaks Gemma 4 drafting. ``make bump`` checks a
candidate build against the same data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).with_name("llamacpp-known-issues.yml")
ACCEPT_VARIABLE = "rig_accepted_llamacpp_issues"


@dataclass(frozen=True)
class KnownIssue:
    issue: int
    title: str
    first_build: int | None
    fixed_build: int | None
    when: Mapping[str, Any]
    overridable: bool

    def has(self, build: int) -> bool:
        """The build carries the issue (an unknown first build: every build up to the fix)."""
        return (self.first_build is None or build >= self.first_build) and (
            self.fixed_build is None or build < self.fixed_build
        )

    def bites(self, spec_type: str, slots: int, on_gpu: bool) -> bool:
        """The rig's settings are those the issue needs."""
        when = self.when
        return (
            ("spec_type" not in when or spec_type == when["spec_type"])
            and ("slots_above" not in when or slots > int(when["slots_above"]))
            and ("gpu" not in when or on_gpu == bool(when["gpu"]))
        )

    @property
    def builds(self) -> str:
        if self.fixed_build is None:
            return "open upstream, no fixed build yet"
        first = f"b{self.first_build}" if self.first_build is not None else "every build"
        return f"{first} up to b{self.fixed_build}, the first fixed one"


@cache
def known_issues(path: Path = DATA) -> tuple[KnownIssue, ...]:
    return tuple(KnownIssue(**entry) for entry in yaml.safe_load(path.read_text(encoding="utf-8")))


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def known_issue_problems(
    values: Mapping[str, Any], issues: Sequence[KnownIssue] | None = None
) -> list[tuple[str, Any, str]]:
    """(variable, value, why and what to do) for each known issue the rig's build and settings meet.
    ``values``: the rig's variables over the defaults of the llamacpp_image and llama_server roles."""
    build = _int(values.get("llamacpp_image_build_number"), -1)
    if build < 0:
        return []
    spec_type = str(values.get("llama_server_spec_type") or "none")
    slots = _int(values.get("llama_server_parallel"), 1)
    on_gpu = values.get("llama_server_gpu_access", "cdi") != "none"
    accepted = {_int(number, -1) for number in values.get(ACCEPT_VARIABLE) or []}
    found = []
    for known in known_issues() if issues is None else issues:
        if not known.has(build) or not known.bites(spec_type, slots, on_gpu):
            continue
        where = f"llama.cpp b{build} has #{known.issue} ({known.builds}): {known.title}"
        if "slots_above" in known.when:
            if known.overridable and known.issue in accepted:
                continue
            found.append(
                (
                    "llama_server_parallel",
                    slots,
                    f"{where}. Set llama_server_parallel: {known.when['slots_above']}, or, if this rig only ever gets "
                    f"prompts shorter than one ubatch, accept it with {ACCEPT_VARIABLE}: [{known.issue}]",
                )
            )
        else:
            found.append(
                (
                    "llamacpp_image_build_number",
                    build,
                    f"{where}. Pin a build outside that range (llamacpp_image_commit and llamacpp_image_build_number)",
                )
            )
    return found
