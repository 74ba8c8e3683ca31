"""Drafter benchmark reports: the run order, the report built from raw cells, and the tuner's decision.

Pure functions over plain data (stdlib only), shared by the bench playbook's renderer (`rigkit bench-render`),
`rigkit bench-report`, `rigkit tune` and the GPU-machine script, so every reader computes the same medians.

Draft length 0 means the drafter is off (`--spec-type none`, no draft model loaded).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.printable import printable

SCHEMA_ID = "rigkit.bench-report/v1"
FIGURES = ("decode_tps_client", "aggregate_tps", "ttft_ms", "server_decode_tps", "acceptance", "mean_accepted_length")


class ReportError(Exception):
    """A report cannot be built or read."""


def schedule(draft_lengths: list[int], passes: int) -> list[dict[str, int]]:
    """Interleaved run order: every pass visits every setting once; passes come in pairs, a sequence then its
    reverse (ABC, CBA), so linear drift (thermals, background load) adds the same to every setting over each
    pair; each pair starts one setting further on (BCA, ACB, ...)."""
    if passes < 1 or not draft_lengths:
        raise ReportError("a bench needs at least one pass and one draft length")
    if len(set(draft_lengths)) != len(draft_lengths) or min(draft_lengths) < 0:
        raise ReportError(f"draft lengths must be distinct and >= 0 (0 = drafter off), got {draft_lengths}")
    order = []
    for pass_index in range(passes):
        shift = (pass_index // 2) % len(draft_lengths)
        sequence = draft_lengths[shift:] + draft_lengths[:shift]
        if pass_index % 2:
            sequence = sequence[::-1]
        order.extend({"pass": pass_index + 1, "draft_n_max": draft} for draft in sequence)
    return order


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _round_sample(pass_index: int, cell: dict[str, Any]) -> dict[str, Any]:
    """One measured round of a cell: medians over its simultaneous requests, sums for acceptance."""
    requests = cell["requests"]
    drafted = sum(request["draft_n"] for request in requests)
    accepted = sum(request["draft_n_accepted"] for request in requests)
    drafts = cell.get("metric_drafts")
    metric_accepted = cell.get("metric_accepted_tokens")
    return {
        "pass": pass_index,
        "decode_tps_client": _median([request["decode_tps_client"] for request in requests]),
        "aggregate_tps": cell["aggregate_tps"],
        "ttft_ms": _median([request["ttft_ms"] for request in requests]),
        "server_decode_tps": _median([request["server_predicted_per_second"] for request in requests]),
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "mean_accepted_length": (metric_accepted / drafts) if drafts and metric_accepted is not None else None,
        "requests": requests,
    }


def build_report(
    *,
    host: str,
    run_id: str,
    started_at: str,
    finished_at: str,
    wall_s: float,
    rig: dict[str, Any],
    settings: dict[str, Any],
    steps: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report from raw steps: [{pass, draft_n_max, apply_s, cells: [CellSample.as_dict()]}]."""
    grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for step in steps:
        for cell in step["cells"]:
            key = (int(step["draft_n_max"]), cell["kind"], int(cell["concurrency"]))
            grouped.setdefault(key, []).append(_round_sample(int(step["pass"]), cell))
    if not grouped:
        raise ReportError(f"{host}: the bench measured no cells")
    cells = []
    for (draft, kind, concurrency), samples in sorted(grouped.items()):
        medians = {figure: _median([sample[figure] for sample in samples]) for figure in FIGURES}
        cells.append(
            {"draft_n_max": draft, "kind": kind, "concurrency": concurrency, "samples": samples, "median": medians}
        )
    report = {
        "schema": SCHEMA_ID,
        "run_id": run_id,
        "host": host,
        "started_at": started_at,
        "finished_at": finished_at,
        "wall_s": round(wall_s, 2),
        "rig": rig,
        "settings": settings,
        "restarts": [
            {"pass": int(step["pass"]), "draft_n_max": int(step["draft_n_max"]), "apply_s": step.get("apply_s")}
            for step in steps
        ],
        "cells": cells,
    }
    report["summary"] = summarise(report)
    return report


def _workload(report: dict[str, Any]) -> tuple[dict[str, float], int]:
    workload = report["settings"]["workload"]
    mix = {kind: float(weight) for kind, weight in workload["mix"].items() if float(weight) > 0}
    if not mix:
        raise ReportError("the workload mix gives no prompt kind a positive weight")
    return mix, int(workload["concurrency"])


def scores(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per draft length: the workload-weighted median client decode speed, and the same per pass."""
    mix, concurrency = _workload(report)
    total = sum(mix.values())
    by_key = {(cell["draft_n_max"], cell["kind"], cell["concurrency"]): cell for cell in report["cells"]}
    result = []
    for draft in report["settings"]["draft_lengths"]:
        cells = [by_key.get((draft, kind, concurrency)) for kind in mix]
        if any(cell is None or cell["median"]["decode_tps_client"] is None for cell in cells):
            missing = [kind for kind, cell in zip(mix, cells, strict=True) if cell is None]
            raise ReportError(
                f"draft length {draft}: no decode speed for kind(s) {', '.join(missing) or '(unmeasured)'} "
                f"at concurrency {concurrency}; bench the workload's kinds and concurrency"
            )
        median = sum(mix[kind] * cell["median"]["decode_tps_client"] for kind, cell in zip(mix, cells, strict=True))
        passes: dict[int, float] = {}
        for kind, cell in zip(mix, cells, strict=True):
            per_pass: dict[int, list[float]] = {}
            for sample in cell["samples"]:
                if sample["decode_tps_client"] is not None:
                    per_pass.setdefault(sample["pass"], []).append(sample["decode_tps_client"])
            for pass_index, values in per_pass.items():
                passes[pass_index] = passes.get(pass_index, 0.0) + mix[kind] * statistics.median(values)
        per_pass_scores = [passes[index] / total for index in sorted(passes)]
        result.append(
            {
                "draft_n_max": draft,
                "score": median / total,
                "per_pass": per_pass_scores,
                "spread": (max(per_pass_scores) - min(per_pass_scores)) if per_pass_scores else 0.0,
            }
        )
    return result


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    ranked = scores(report)
    best = max(ranked, key=lambda row: row["score"])
    off = next((row for row in ranked if row["draft_n_max"] == 0), None)
    mix, concurrency = _workload(report)
    return {
        "metric": "decode_tps_client",
        "workload": {"mix": mix, "concurrency": concurrency},
        "scores": ranked,
        "best_draft_n_max": best["draft_n_max"],
        "speedup_best_vs_off": (best["score"] / off["score"]) if off and off["score"] else None,
        "drafter_pays_up_to": max(
            (row["draft_n_max"] for row in ranked if off and row["draft_n_max"] > 0 and row["score"] > off["score"]),
            default=None,
        ),
    }


@dataclass(frozen=True)
class Decision:
    best: int
    current: int
    chosen: int
    gain: float
    noise: float
    reason: str

    @property
    def changes(self) -> bool:
        return self.chosen != self.current


def decide(report: dict[str, Any], current: int) -> Decision:
    """Pick the draft length (0 = off) with the best score; move off `current` only when the gain beats the
    run's own noise band: the larger max-min spread of the per-pass scores of the two settings compared."""
    ranked = {row["draft_n_max"]: row for row in scores(report)}
    best = max(ranked.values(), key=lambda row: row["score"])
    label = _label
    if current not in ranked:
        return Decision(
            best["draft_n_max"],
            current,
            best["draft_n_max"],
            float("nan"),
            best["spread"],
            f"current setting {label(current)} was not benchmarked; taking the best measured, "
            f"{label(best['draft_n_max'])} at {best['score']:.2f} tokens/s",
        )
    baseline = ranked[current]
    gain = best["score"] - baseline["score"]
    noise = max(best["spread"], baseline["spread"])
    if best["draft_n_max"] != current and min(len(best["per_pass"]), len(baseline["per_pass"])) < 2:
        return Decision(
            best["draft_n_max"],
            current,
            current,
            gain,
            float("nan"),
            f"keeping {label(current)}: one pass gives no noise band to beat (bench with passes >= 2); "
            f"the single pass measured {label(best['draft_n_max'])} at +{gain:.2f} t/s",
        )
    if best["draft_n_max"] == current:
        return Decision(
            current, current, current, 0.0, noise, f"{label(current)} is already the fastest ({best['score']:.2f} t/s)"
        )
    if gain > noise:
        reason = (
            f"{label(best['draft_n_max'])} decodes {best['score']:.2f} t/s vs {baseline['score']:.2f} t/s "
            f"for {label(current)}: +{gain:.2f} t/s beats the noise band of {noise:.2f} t/s"
        )
        return Decision(best["draft_n_max"], current, best["draft_n_max"], gain, noise, reason)
    reason = (
        f"keeping {label(current)}: the best, {label(best['draft_n_max'])}, is only +{gain:.2f} t/s faster, "
        f"inside the run's noise band of {noise:.2f} t/s (bench more passes to tell them apart)"
    )
    return Decision(best["draft_n_max"], current, current, gain, noise, reason)


def _label(draft: int) -> str:
    return "drafter off" if draft == 0 else f"draft length {draft}"


def table_row(report: dict[str, Any]) -> dict[str, str]:
    """One line of `rigkit bench-report`: the workload's best setting, and the best drafting one."""
    summary = report["summary"]
    gpu = printable((report["rig"].get("gpu") or {}).get("name") or "CPU", 96)  # the rig's text, escaped
    ranked = {row["draft_n_max"]: row["score"] for row in summary["scores"]}
    best = summary["best_draft_n_max"]
    drafting = max((draft for draft in ranked if draft > 0), key=lambda draft: ranked[draft], default=None)
    cells = [cell for cell in report["cells"] if cell["draft_n_max"] == drafting and cell["concurrency"] == 1]
    acceptance = _median([cell["median"]["acceptance"] for cell in cells])
    off = ranked.get(0)
    return {
        "run": report["run_id"],
        "host": report["host"],
        "gpu": gpu,
        "spec": report["settings"]["spec_type"],
        "best": "off" if best == 0 else f"n_max {best}",
        "t/s": f"{ranked[best]:.1f}",
        "off t/s": f"{off:.1f}" if off is not None else "-",
        "best drafting": f"n_max {drafting}: {ranked[drafting]:.1f}" if drafting is not None else "-",
        "accept": f"{acceptance:.2f}" if acceptance is not None else "-",
        "passes": str(report["settings"]["passes"]),
        "wall": f"{report['wall_s']:.0f}s",
    }
