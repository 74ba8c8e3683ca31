"""The bench's arithmetic and outputs: run order, medians, workload scores, the tuner's decision, the report's
schema, the plot, and the CLI that writes, lists and applies reports. Measurements come from
tests/integration/test_bench.py against real servers; here the figures are chosen so every answer is known."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rigkit.bench.report import ReportError, build_report, decide, schedule, scores
from rigkit.bench.tune import current_setting, latest_report, tune
from tests.support import templated_var

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "roles/llama_bench/files/bench-report.schema.json").read_text())
RIGKIT = [sys.executable, str(REPO / "bin/rigkit")]
KINDS = ["code", "prose", "chat", "structured"]
SHA = "a" * 64


def request(tps: float, drafted: int = 0, accepted: int = 0) -> dict[str, Any]:
    return {
        "ttft_ms": 20.0,
        "decode_tps_client": tps,
        "predicted_n": 32,
        "server_predicted_per_second": tps * 1.01,
        "server_prompt_ms": 5.0,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "wall_s": 32 / tps,
    }


def raw_run(speeds: dict[int, list[float]], *, current: int = 2, kinds: list[str] = KINDS, mix=None) -> dict:
    """Raw steps as the bench role collects them. speeds[draft] = the decode speed of each pass; every kind
    gets it scaled by its position (code x1.0, prose x0.9, ...), concurrency 2 runs at 0.8x per request."""
    drafts = sorted(speeds)
    passes = len(next(iter(speeds.values())))
    steps = []
    for step in schedule(drafts, passes):
        base = speeds[step["draft_n_max"]][step["pass"] - 1]
        cells = []
        for position, kind in enumerate(kinds):
            for level in (1, 2):
                tps = base * (1 - 0.1 * position) * (1.0 if level == 1 else 0.8)
                drafted = 24 * step["draft_n_max"]
                accepted = 18 * step["draft_n_max"]
                cells.append(
                    {
                        "kind": kind,
                        "concurrency": level,
                        "requests": [request(tps, drafted, accepted) for _ in range(level)],
                        "aggregate_tps": tps * level,
                        "metric_drafts": 24.0 * level if drafted else 0.0,
                        "metric_draft_tokens": float(drafted * level),
                        "metric_accepted_tokens": float(accepted * level),
                    }
                )
        steps.append({**step, "apply_s": 3.5, "cells": cells})
    return {
        "host": "sandbox",
        "run_id": "sandbox-20261129T120000Z",
        "started_at": "2026-11-29T12:00:00+00:00",
        "finished_at": "2026-11-29T12:05:00+00:00",
        "wall_s": 300.0,
        "rig": {
            "kind": "sandbox",
            "gpu": None,
            "cpu": "test CPU",
            "cpu_count": 2,
            "image": {
                "tag": "rigkit/llama-server:x",
                "id": "sha256:" + SHA,
                "llamacpp_commit": "0c1e570" + "0" * 33,
                "build_info": "b11312-0c1e570",
            },
            "models": {
                "target": {"name": "t", "sha256": SHA, "file": "t.gguf"},
                "drafter": {"name": "d", "sha256": SHA, "file": "d.gguf"},
            },
            "server": {
                "spec_type": "draft-simple" if current else "none",
                "draft_n_max": max(current, 1),
                "ctx_size": 2048,
                "parallel": 1,
            },
        },
        "settings": {
            "spec_type": "draft-simple",
            "draft_lengths": drafts,
            "kinds": kinds,
            "concurrency": [1, 2],
            "passes": passes,
            "repeats": 1,
            "n_predict": 32,
            "warmup": 1,
            "workload": {"mix": mix or dict.fromkeys(kinds, 1), "concurrency": 1},
            "order": schedule(drafts, passes),
        },
        "steps": steps,
    }


def report_of(raw: dict) -> dict:
    return build_report(**{key: raw[key] for key in raw if key != "steps"}, steps=raw["steps"])


# ---------------------------------------------------------------------------------------------- order
def test_schedule_visits_every_setting_once_per_pass_and_cancels_linear_drift():
    order = schedule([0, 1, 2, 3], 4)
    for pass_index in range(1, 5):
        assert sorted(step["draft_n_max"] for step in order if step["pass"] == pass_index) == [0, 1, 2, 3]
    positions: dict[int, int] = {}
    for index, step in enumerate(order):
        positions[step["draft_n_max"]] = positions.get(step["draft_n_max"], 0) + index
    # linear drift adds slot * slope: every setting collects the same sum of slots over each pair of passes
    assert len(set(positions.values())) == 1, positions
    assert [step["draft_n_max"] for step in order[:8]] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [step["draft_n_max"] for step in order[8:12]] == [1, 2, 3, 0]


@pytest.mark.parametrize(("lengths", "passes"), [([], 1), ([0, 1], 0), ([0, 0, 1], 1), ([-1, 1], 1)])
def test_schedule_refuses_nonsense(lengths, passes):
    with pytest.raises(ReportError):
        schedule(lengths, passes)


# ---------------------------------------------------------------------------------------------- report
def test_report_medians_acceptance_and_mean_accepted_length():
    report = report_of(raw_run({0: [100, 104, 96], 1: [130, 120, 125], 2: [150, 160, 140]}))
    cell = next(c for c in report["cells"] if (c["draft_n_max"], c["kind"], c["concurrency"]) == (2, "code", 1))
    assert [sample["pass"] for sample in cell["samples"]] == [1, 2, 3]
    assert cell["median"]["decode_tps_client"] == pytest.approx(150)
    assert cell["median"]["acceptance"] == pytest.approx(36 / 48)
    assert cell["median"]["mean_accepted_length"] == pytest.approx(36 / 24)
    off = next(c for c in report["cells"] if (c["draft_n_max"], c["kind"], c["concurrency"]) == (0, "code", 1))
    assert off["median"]["acceptance"] is None
    assert len(report["cells"]) == 3 * 4 * 2


def test_scores_weigh_the_workload_mix():
    raw = raw_run({0: [100, 100], 1: [200, 200]}, mix={"code": 3, "prose": 1, "chat": 0, "structured": 0})
    ranked = {row["draft_n_max"]: row for row in scores(report_of(raw))}
    assert ranked[0]["score"] == pytest.approx((3 * 100 + 1 * 90) / 4)
    assert ranked[1]["per_pass"] == pytest.approx([(3 * 200 + 180) / 4] * 2)
    assert ranked[1]["spread"] == pytest.approx(0)


def test_report_matches_its_published_schema_and_the_schema_catches_a_bad_one():
    report = report_of(raw_run({0: [100, 104], 1: [130, 120]}))
    jsonschema.validate(report, SCHEMA)
    broken = json.loads(json.dumps(report))
    broken["cells"][3]["median"]["acceptance"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)


# ---------------------------------------------------------------------------------------------- decision
def argmax_of_medians(report: dict) -> int:
    """Recomputed from the raw samples, independently of bench_report.scores."""
    mix = report["settings"]["workload"]["mix"]
    level = report["settings"]["workload"]["concurrency"]
    totals = {}
    for draft in report["settings"]["draft_lengths"]:
        total = 0.0
        for kind, weight in mix.items():
            (cell,) = [
                c for c in report["cells"] if (c["draft_n_max"], c["kind"], c["concurrency"]) == (draft, kind, level)
            ]
            total += weight * statistics.median(s["decode_tps_client"] for s in cell["samples"])
        totals[draft] = total
    return max(totals, key=totals.get)


def test_decision_takes_a_gain_beyond_the_noise_band():
    report = report_of(
        raw_run({0: [100, 102, 98], 1: [120, 122, 118], 2: [150, 148, 152], 4: [140, 141, 139]}, current=4)
    )
    decision = decide(report, current_setting(report))
    assert decision.best == argmax_of_medians(report) == 2
    assert decision.chosen == 2 and decision.changes
    assert decision.gain > decision.noise
    assert "beats the noise band" in decision.reason


def test_decision_keeps_the_current_setting_inside_the_noise_band():
    report = report_of(raw_run({0: [100, 130, 112], 2: [110, 95, 125]}, current=2))
    decision = decide(report, 2)
    assert decision.best == argmax_of_medians(report) == 0
    assert decision.chosen == 2 and not decision.changes
    assert "inside the run's noise band" in decision.reason


def test_decision_turns_the_drafter_off_when_it_costs():
    report = report_of(raw_run({0: [200, 201], 1: [120, 121], 2: [90, 91]}, current=2))
    decision = decide(report, 2)
    assert decision.chosen == 0 and "drafter off" in decision.reason


def test_decision_without_a_measured_current_setting_takes_the_best():
    report = report_of(raw_run({0: [100, 101], 1: [150, 151]}, current=3))
    decision = decide(report, 3)
    assert decision.chosen == 1 and "was not benchmarked" in decision.reason


def test_decision_needs_two_passes_to_know_the_noise():
    report = report_of(raw_run({0: [100.0], 2: [300.0]}, current=2))
    decision = decide(report, 0)
    assert decision.best == 2 and decision.chosen == 0
    assert "one pass gives no noise band" in decision.reason


def test_scores_refuse_a_workload_the_bench_did_not_measure():
    raw = raw_run({0: [100], 1: [120]}, kinds=["code", "prose"], mix={"code": 1, "prose": 1})
    report = report_of(raw)
    report["settings"]["workload"]["mix"]["chat"] = 2
    with pytest.raises(ReportError, match="chat"):
        scores(report)


# ---------------------------------------------------------------------------------------------- tune
HOST_VARS = """---
# The embedded default rig (comment kept by the tuner).
ansible_host: rigkit-sandbox
llama_server_port: 18080

llama_server_spec_type: draft-simple
llama_server_spec_draft_n_max: 4
llama_server_flash_attn: "off"
"""


def write_report(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "reports" / raw["host"] / f"{raw['run_id']}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(report_of(raw)))
    return path


def test_tune_writes_the_winner_with_a_comment_naming_the_report(tmp_path):
    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text(HOST_VARS)
    report = write_report(tmp_path, raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4))
    decision, changed = tune(report, host_vars)
    assert changed and decision.chosen == 2
    text = host_vars.read_text()
    assert "llama_server_spec_draft_n_max: 2  # tuned by `make tune` from sandbox-20261129T120000Z.json" in text
    assert text.startswith("---\n# The embedded default rig (comment kept by the tuner).\n")
    assert 'llama_server_flash_attn: "off"' in text


def _yamllint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(REPO / ".yamllint"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_tuned_host_vars_passes_yamllint_strict(tmp_path):
    """The note naming the report and the reason is longer than yamllint's 160 characters: it
    goes on in comment lines under the key, and a second tune replaces them instead of adding more."""
    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text((REPO / "inventory/host_vars/sandbox.yml").read_text())
    assert _yamllint(host_vars).returncode == 0  # the kit's own file, before
    report = write_report(tmp_path, raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4))
    decision, changed = tune(report, host_vars)
    assert changed and decision.chosen == 2
    assert len(f"llama_server_spec_draft_n_max: 2  # tuned by `make tune` from {report.name}: {decision.reason}") > 160
    linted = _yamllint(host_vars)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    text = host_vars.read_text()
    assert "llama_server_spec_draft_n_max: 2  # tuned by `make tune` from sandbox-20261129T120000Z.json" in text
    assert max(len(line) for line in text.splitlines()) <= 160
    words = " ".join(
        line.split("#", 1)[1].strip() for line in text.splitlines() if "tuned by" in line or line.startswith(" ")
    )
    assert decision.reason.split()[-1] in words  # the whole reason is kept, wrapped

    raw = raw_run({0: [100, 101], 2: [120, 121], 3: [150, 151]}, current=2)
    raw["run_id"] = "sandbox-20261130T120000Z"
    again = tmp_path / "later" / f"{raw['run_id']}.json"
    again.parent.mkdir()
    again.write_text(json.dumps(report_of(raw)))
    decision, changed = tune(again, host_vars)
    assert changed and decision.chosen == 3
    linted = _yamllint(host_vars)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    text = host_vars.read_text()
    assert text.count("tuned by") == 1 and "sandbox-20261129T120000Z" not in text
    assert text.count("beats the noise band") == 1


def test_tune_turns_the_drafter_off(tmp_path):
    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text(HOST_VARS)
    report = write_report(tmp_path, raw_run({0: [200, 201], 4: [100, 101]}, current=4))
    _, changed = tune(report, host_vars)
    assert changed
    assert "llama_server_spec_type: none  # tuned by `make tune`" in host_vars.read_text()


def test_tune_inside_the_noise_leaves_the_file_byte_identical(tmp_path):
    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text(HOST_VARS)
    report = write_report(tmp_path, raw_run({0: [100, 130], 4: [110, 100]}, current=4))
    decision, changed = tune(report, host_vars)
    assert not changed and decision.chosen == 4
    assert host_vars.read_text() == HOST_VARS


def test_a_report_cannot_put_a_template_into_the_host_vars(tmp_path):
    """A report is what a rig measured: a spec_type carrying a template, copied into
    host_vars, would run on the controller at the next `make check`. Refused; the file stays as it was."""
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory)
    host_vars = inventory / "host_vars/sandbox.yml"
    before = host_vars.read_text()
    marker = tmp_path / "PWNED"
    raw = raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4)
    raw["settings"]["spec_type"] = "draft-simple {{ lookup(*'pipe|touch " + str(marker) + "'.split('|')) }}"
    report = write_report(tmp_path, raw)
    refused = None
    try:
        tune(report, host_vars)
    except ReportError as exc:
        refused = str(exc)
    value, printed = templated_var(inventory / "hosts.yml", "sandbox", "llama_server_spec_type")  # make check's view
    assert not marker.exists(), printed
    assert refused is not None and 'settings.spec_type is "draft-simple {{ lookup(' in refused, refused
    assert "not one of draft-simple, draft-mtp" in refused and "bench the rig again" in refused
    assert host_vars.read_text() == before and value == "draft-simple"


def test_tune_writes_the_kits_own_spelling_tagged_unsafe(tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory)
    host_vars = inventory / "host_vars/sandbox.yml"
    report = write_report(tmp_path, raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4))
    _, changed = tune(report, host_vars)
    assert changed and 'llama_server_spec_type: !unsafe "draft-simple"' in host_vars.read_text().splitlines()
    assert templated_var(inventory / "hosts.yml", "sandbox", "llama_server_spec_type")[0] == "draft-simple"
    assert templated_var(inventory / "hosts.yml", "sandbox", "llama_server_spec_draft_n_max")[0] == 2


@pytest.mark.parametrize(
    ("where", "value"),
    [("settings", 3), ("settings", "draft-mtp\nllama_server_api_key: x"), ("server", "2"), ("server", 99)],
)
def test_tune_refuses_report_values_the_kit_cannot_write(tmp_path, where, value):
    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text(HOST_VARS)
    raw = raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4)
    if where == "settings":
        raw["settings"]["spec_type"] = value
    report = write_report(tmp_path, raw)
    if where == "server":
        data = json.loads(report.read_text())
        data["rig"]["server"]["draft_n_max"] = value
        report.write_text(json.dumps(data))
    with pytest.raises(ReportError, match="bench the rig again"):
        tune(report, host_vars)
    assert host_vars.read_text() == HOST_VARS


def test_latest_report_and_a_missing_one(tmp_path):
    with pytest.raises(ReportError, match="make bench host=sandbox"):
        latest_report(tmp_path, "sandbox")
    first = write_report(tmp_path, raw_run({0: [1.0], 1: [2.0]}))
    later = first.with_name("sandbox-20261130T000000Z.json")
    shutil.copy(first, later)
    assert latest_report(tmp_path / "reports", "sandbox") == later


# ---------------------------------------------------------------------------------------------- CLI + plot
def test_cli_renders_lists_and_tunes(tmp_path):
    raw = raw_run({0: [100, 101], 2: [150, 151], 4: [120, 121]}, current=4)
    out = tmp_path / "reports"
    rendered = subprocess.run(
        [*RIGKIT, "bench-render", "--out-dir", str(out)],
        input=json.dumps(raw),
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    report_path = out / "sandbox" / "sandbox-20261129T120000Z.json"
    png = report_path.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    jsonschema.validate(json.loads(report_path.read_text()), SCHEMA)
    assert "best for the workload: 2" in rendered.stdout

    table = subprocess.run(
        [*RIGKIT, "bench-report", "--reports-dir", str(out)], capture_output=True, text=True, check=True
    )
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["run", "host", "gpu"]
    assert row.split()[:5] == ["sandbox-20261129T120000Z", "sandbox", "CPU", "draft-simple", "n_max"]

    host_vars = tmp_path / "sandbox.yml"
    host_vars.write_text(HOST_VARS)
    tuned = subprocess.run(
        [*RIGKIT, "tune", "sandbox", "--reports-dir", str(out), "--host-vars", str(host_vars)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tuned.returncode == 0, tuned.stderr
    assert "draft length 2 decodes" in tuned.stdout and "llama_server_spec_draft_n_max: 2" in host_vars.read_text()


def test_cli_render_refuses_a_report_that_breaks_the_schema(tmp_path):
    raw = raw_run({0: [100], 1: [120]})
    raw["run_id"] = "no timestamp"
    rendered = subprocess.run(
        [*RIGKIT, "bench-render", "--out-dir", str(tmp_path)],
        input=json.dumps(raw),
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 1
    assert "breaks bench-report.schema.json at run_id" in rendered.stderr
    assert not any(tmp_path.rglob("*.json"))
