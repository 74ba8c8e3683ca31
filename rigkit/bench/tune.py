"""`make tune`: apply a bench report's decision to the host's variables (controller only).

The decision itself is rigkit/bench/report.decide (best workload score, moved to only when the gain beats
the run's noise band). This writes it into inventory/host_vars/<host>.yml with ruamel.yaml's round trip
(comments and order survive), with a comment naming the report, atomically.

A report is data from a rig, not from the kit: nothing of it is written as it is. Its speculative decoding type
must be one the kit knows (the kit's own spelling is written, tagged ``!unsafe`` so Ansible never templates it),
its draft lengths integers in the range the role accepts, and the comment is printable ASCII, wrapped into
comment lines of at most 160 characters (yamllint's line-length) under the key it explains.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

from ansible.module_utils.atomic_file import write_atomic

from rigkit.bench.report import Decision, ReportError, decide

SPEC_TYPE = "llama_server_spec_type"
DRAFT_N_MAX = "llama_server_spec_draft_n_max"
# The drafting types of roles/llama_server/meta/argument_specs.yml (llama_server_spec_type, "none" aside) and the
# draft lengths playbooks/validate.yml accepts.
SPEC_TYPES = ("draft-simple", "draft-mtp")
DRAFT_N_RANGE = range(1, 17)
UNSAFE_TAG = "!unsafe"
_NOT_PRINTABLE = re.compile(r"[^ -~]")
LINE_LENGTH = 160  # .yamllint's line-length max: a tuned host_vars passes `yamllint --strict`


def report_spec_type(report: dict[str, Any], path: Path) -> str:
    """The kit's own spelling of the report's drafting type; a ReportError for anything else."""
    value = (report.get("settings") or {}).get("spec_type") if isinstance(report.get("settings"), dict) else None
    for known in SPEC_TYPES:
        if value == known:
            return known
    raise ReportError(
        f"{path}: settings.spec_type is {ascii(value)[:80]}, not one of {', '.join(SPEC_TYPES)}: the report was not "
        "written by `make bench` (or was edited); bench the rig again"
    )


def draft_length(value: Any, what: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in DRAFT_N_RANGE:
        raise ReportError(
            f"{path}: {what} is {ascii(value)[:80]}, not a draft length "
            f"{DRAFT_N_RANGE.start}..{DRAFT_N_RANGE.stop - 1}:"
            " the report was not written by `make bench` (or was edited); bench the rig again"
        )
    return value


def one_line(text: str) -> str:
    """A comment's text: printable ASCII on one line (a line break would end the comment)."""
    return _NOT_PRINTABLE.sub("?", " ".join(text.split()))


def comment_lines(note: str, column: int, width: int = LINE_LENGTH) -> str:
    """``note`` as ``# ...`` comment text whose first line starts at ``column`` and no line passes ``width``
    characters (yamllint's line-length); later lines are indented to ``column``. One very long word is cut."""
    room = max(width - column - 2, 20)
    parts = textwrap.wrap(note, room, break_long_words=True, break_on_hyphens=False) or [""]
    return "\n".join(f"{' ' * column if index else ''}# {part}" for index, part in enumerate(parts))


def latest_report(reports_dir: Path, host: str) -> Path:
    runs = sorted((reports_dir / host).glob(f"{host}-*.json"))
    if not runs:
        raise ReportError(f"no bench report for {host} under {reports_dir / host}: run `make bench host={host}` first")
    return runs[-1]


def load_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: cannot read the report: {exc}") from exc
    if report.get("schema") != "rigkit.bench-report/v1":
        raise ReportError(f"{path}: not a rigkit bench report (schema {report.get('schema')!r})")
    return report


def current_setting(report: dict[str, Any], path: Path | None = None) -> int:
    """The draft length the host was configured with when benched (0 = drafter off)."""
    server = report["rig"]["server"]
    if server["spec_type"] == "none":
        return 0
    return draft_length(server["draft_n_max"], "rig.server.draft_n_max", path or Path("the report"))


def tune(report_path: Path, host_vars_path: Path) -> tuple[Decision, bool]:
    """Decide from the report and, when the decision changes the setting, rewrite the host's variables.
    Returns (decision, whether the file changed)."""
    report = load_report(report_path)
    decision = decide(report, current_setting(report, report_path))
    if not decision.changes:
        return decision, False
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import TaggedScalar

    yaml = YAML()  # round trip: comments, order and quoting survive
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.explicit_start = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    if not host_vars_path.exists():
        raise ReportError(f"{host_vars_path} does not exist: the host's variables file must be there to tune it")
    data = yaml.load(host_vars_path.read_text(encoding="utf-8")) or {}
    note = one_line(f"tuned by `make tune` from {report_path.name}: {decision.reason}")
    if decision.chosen == 0:
        data[SPEC_TYPE] = "none"
        key, shown = SPEC_TYPE, "none"
    else:
        spec_type = report_spec_type(report, report_path)
        data[SPEC_TYPE] = TaggedScalar(spec_type, style='"', tag=UNSAFE_TAG)
        data[DRAFT_N_MAX] = draft_length(decision.chosen, "the chosen draft length", report_path)
        key, shown = DRAFT_N_MAX, str(data[DRAFT_N_MAX])
    # two spaces before the comment (yamllint's rule), on the line of the key the decision set; a note longer than
    # the line allows goes on in comment lines under it, at the same column (a re-tune replaces them all)
    column = len(f"{key}: {shown}") + 2
    data.yaml_add_eol_comment(comment_lines(note, column), key, column=column)
    mode = os.stat(host_vars_path).st_mode & 0o7777
    write_atomic(str(host_vars_path), lambda handle: yaml.dump(data, handle), mode)
    return decision, True
