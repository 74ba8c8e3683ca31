"""The drafter bench on a machine without the kit's rig layout (the borrowed GPU machine): the same cells, run
order, report and plot as `make bench` (module_utils/bench_workload.py, bench_report.py, bench_plot.py), but the
server is a local llama-server process restarted per setting instead of the llama_server role's unit.

    python3 tests/gpu/bench_gpu.py --server-bin build/bin/llama-server --target t.gguf --drafter d.gguf \
        --spec-type draft-mtp --draft-max 3 --out $OUT/bench-gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.local_server import LocalLlamaServer, free_port, kit_module_utils

workload = kit_module_utils("bench_workload")
report_lib = kit_module_utils("bench_report")
deployed = kit_module_utils("rig_deployed")
sha256 = kit_module_utils("fetch.model").sha256_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-bin", type=Path, required=True)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--spec-type", default="draft-mtp")
    parser.add_argument("--draft-max", type=int, default=3)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--kinds", default="code,prose,chat,structured")
    parser.add_argument("--concurrency-max", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--ctx-size", type=int, default=1024)
    parser.add_argument("--host-name", default="gpu-machine")
    parser.add_argument("--extra-args", default="-ngl all -fa on", help="server arguments for every setting")
    parser.add_argument("--out", type=Path, required=True, help="report path (.json; the plot goes beside it)")
    parser.add_argument("--log", type=Path, default=Path("/tmp/bench-gpu-server.log"))
    args = parser.parse_args(argv)

    kinds = args.kinds.split(",")
    levels = list(range(1, args.concurrency_max + 1))
    drafts = [0, *range(1, args.draft_max + 1)]
    order = report_lib.schedule(drafts, args.passes)
    base = [
        "--model",
        str(args.target),
        "--ctx-size",
        str(args.ctx_size),
        "--parallel",
        str(args.concurrency_max),
        "--metrics",
        *args.extra_args.split(),
    ]
    started_at = datetime.now(UTC)
    started = time.monotonic()
    steps = []
    build_info = ""
    with LocalLlamaServer(args.server_bin, base, port=free_port(), log_path=args.log) as server:
        for step in order:
            draft = step["draft_n_max"]
            extra = (
                []
                if draft == 0
                else [
                    "--model-draft",
                    str(args.drafter),
                    "--spec-type",
                    args.spec_type,
                    "--spec-draft-n-max",
                    str(draft),
                    "--n-gpu-layers-draft",
                    "all",
                ]
            )
            asked = time.monotonic()
            endpoint = server.restart(extra)
            apply_s = round(time.monotonic() - asked, 2)
            build_info = build_info or str(endpoint.get_json("/props").get("build_info", ""))
            cells = workload.measure_setting(endpoint, kinds, levels, args.n_predict)
            steps.append({**step, "apply_s": apply_s, "cells": [cell.as_dict() for cell in cells]})
            print(f"pass {step['pass']} draft {draft}: ready in {apply_s:.1f} s, {len(cells)} cells", flush=True)
    finished_at = datetime.now(UTC)
    gpu = deployed.gpu()
    rig = {
        "kind": "gpu" if gpu else "sandbox",
        "gpu": {key: gpu[key] for key in ("name", "memory_mib", "compute_capability", "driver")} if gpu else None,
        "cpu": "",
        "cpu_count": 0,
        "image": {"tag": "(local build, no image)", "id": "", "llamacpp_commit": "", "build_info": build_info},
        "models": {
            "target": {"name": args.target.stem, "sha256": sha256(args.target), "file": args.target.name},
            "drafter": {"name": args.drafter.stem, "sha256": sha256(args.drafter), "file": args.drafter.name},
        },
        "server": {
            "spec_type": args.spec_type,
            "draft_n_max": args.draft_max,
            "ctx_size": args.ctx_size,
            "parallel": args.concurrency_max,
        },
    }
    settings = {
        "spec_type": args.spec_type,
        "draft_lengths": drafts,
        "kinds": kinds,
        "concurrency": levels,
        "passes": args.passes,
        "repeats": 1,
        "n_predict": args.n_predict,
        "warmup": 1,
        "workload": {"mix": dict.fromkeys(kinds, 1), "concurrency": 1},
        "order": order,
    }
    report = report_lib.build_report(
        host=args.host_name,
        run_id=f"{args.host_name}-{started_at.strftime('%Y%m%dT%H%M%SZ')}",
        started_at=started_at.isoformat(),
        finished_at=finished_at.isoformat(),
        wall_s=time.monotonic() - started,
        rig=rig,
        settings=settings,
        steps=steps,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    try:
        kit_module_utils("bench_plot").plot_report(report, args.out.with_suffix(".png"))
    except ImportError as exc:  # no matplotlib: the report is still complete
        print(f"no plot: {exc}", file=sys.stderr)
    decision = report_lib.decide(report, args.draft_max)
    for row in report["summary"]["scores"]:
        print(f"  draft {row['draft_n_max']}: {row['score']:.1f} tokens/s (passes {row['per_pass']})")
    print(f"tuner: {decision.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
