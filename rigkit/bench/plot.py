"""The bench report's plot (controller only: needs matplotlib, never shipped to rigs).

Left: client decode tokens/s against draft length (0 = drafter off) per prompt kind at concurrency 1, with
the drafter-off level dashed — where a line drops below it, the drafter stops paying.
Right: aggregate throughput speedup over drafter-off against concurrency, one line per draft length.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _medians(report: dict[str, Any], figure: str) -> dict[tuple[int, str, int], float]:
    return {
        (cell["draft_n_max"], cell["kind"], cell["concurrency"]): cell["median"][figure]
        for cell in report["cells"]
        if cell["median"][figure] is not None
    }


def plot_report(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    settings = report["settings"]
    drafts = settings["draft_lengths"]
    decode = _medians(report, "decode_tps_client")
    aggregate = _medians(report, "aggregate_tps")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)

    for kind in settings["kinds"]:
        xs = [draft for draft in drafts if (draft, kind, 1) in decode]
        line = left.plot(xs, [decode[(draft, kind, 1)] for draft in xs], marker="o", label=kind)[0]
        if (0, kind, 1) in decode:
            left.axhline(decode[(0, kind, 1)], color=line.get_color(), linestyle=":", linewidth=1)
    best = report["summary"]["best_draft_n_max"]
    left.axvline(best, color="grey", linestyle="--", linewidth=1, label=f"best for the workload: {best}")
    left.set_xticks(drafts, ["off" if draft == 0 else str(draft) for draft in drafts])
    left.set_xlabel("draft length (--spec-draft-n-max; off = no drafter)")
    left.set_ylabel("decode tokens/s (client, median)")
    left.set_title("Decode speed per prompt kind, concurrency 1 (dotted: drafter off)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)

    levels = settings["concurrency"]
    for draft in drafts[1:]:
        ys = []
        for level in levels:
            ratios = [
                aggregate[(draft, kind, level)] / aggregate[(0, kind, level)]
                for kind in settings["kinds"]
                if aggregate.get((0, kind, level)) and (draft, kind, level) in aggregate
            ]
            ys.append(statistics.median(ratios) if ratios else float("nan"))
        right.plot(levels, ys, marker="o", label=f"draft length {draft}")
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="drafter off")
    right.set_xticks(levels)
    right.set_xlabel("concurrent requests")
    right.set_ylabel("throughput vs drafter off (median over kinds)")
    right.set_title("Speedup against concurrency (below 1: the drafter costs)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)

    rig = report["rig"]
    gpu = (rig.get("gpu") or {}).get("name") or f"CPU ({rig.get('cpu_count', '?')} threads)"
    fig.suptitle(
        f"{report['host']}: {rig['models']['target']['name']} + {rig['models']['drafter']['name']} "
        f"({settings['spec_type']}) on {gpu}, {rig['image'].get('build_info', '')} — {report['run_id']}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
