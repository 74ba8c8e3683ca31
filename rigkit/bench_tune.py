"""`make tune`: apply a bench report's decision to the host's variables (controller only).

The decision itself is rigkit/bench_report.decide (best workload score, moved to only when the gain beats
the run's noise band). This writes it into inventory/host_vars/<host>.yml with ruamel.yaml's round trip
(comments and order survive), with a comment naming the report, atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ansible.module_utils.atomic_file import write_atomic

from rigkit.bench_report import Decision, ReportError, decide

SPEC_TYPE = "llama_server_spec_type"
DRAFT_N_MAX = "llama_server_spec_draft_n_max"


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


def current_setting(report: dict[str, Any]) -> int:
    """The draft length the host was configured with when benched (0 = drafter off)."""
    server = report["rig"]["server"]
    return 0 if server["spec_type"] == "none" else int(server["draft_n_max"])


def tune(report_path: Path, host_vars_path: Path) -> tuple[Decision, bool]:
    """Decide from the report and, when the decision changes the setting, rewrite the host's variables.
    Returns (decision, whether the file changed)."""
    report = load_report(report_path)
    decision = decide(report, current_setting(report))
    if not decision.changes:
        return decision, False
    from ruamel.yaml import YAML

    yaml = YAML()  # round trip: comments, order and quoting survive
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.explicit_start = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    if not host_vars_path.exists():
        raise ReportError(f"{host_vars_path} does not exist: the host's variables file must be there to tune it")
    data = yaml.load(host_vars_path.read_text(encoding="utf-8")) or {}
    note = f"tuned by `make tune` from {report_path.name}: {decision.reason}"
    if decision.chosen == 0:
        data[SPEC_TYPE] = "none"
        key = SPEC_TYPE
    else:
        data[SPEC_TYPE] = report["settings"]["spec_type"]
        data[DRAFT_N_MAX] = decision.chosen
        key = DRAFT_N_MAX
    # two spaces before the comment (yamllint's rule), on the line of the key the decision set
    data.yaml_add_eol_comment(f"# {note}", key, column=len(f"{key}: {data[key]}") + 2)
    mode = os.stat(host_vars_path).st_mode & 0o7777
    write_atomic(str(host_vars_path), lambda handle: yaml.dump(data, handle), mode)
    return decision, True
