"""The rollout's GPU offload check on a local llama-server (tests/gpu/run.sh steps offload-gpu and offload-cpu).

    python3 tests/gpu/offload.py --binary BIN --models .device/models --log server-offload.log --out data.json \\
        --expect on-gpu [--budget-mib MIB]
    python3 tests/gpu/offload.py ... --hide-gpu --expect refused     # CUDA_VISIBLE_DEVICES= : it serves on the CPU

Starts the server with the tiny Gemma 4 pair as the rigs run it (-ngl all -ngld all, draft-mtp, --verbosity 4 as
the llama_server role sets on GPU rigs), waits for /health, sends a canary, reads nvidia-smi's compute apps, then
asks module_utils/gpu_offload.check - the verdict the rollout's llama_server_offload module gives - with the
preflight's estimate of what the models put on the GPU. The whole server log stays in --log. Exit status 0 when the
verdict is the expected one: on the GPU, or refused with the cause named (no CUDA device / CUDA failed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.local_server import LocalLlamaServer, ServerStartError, api, free_port, kit_module_utils
from tests.gpu.smoke import DRAFTER, MIB, PROMPT, TARGET, preflight_estimate

gpu_offload = kit_module_utils("gpu_offload")
gpu_metrics = kit_module_utils("gpu_metrics")

COMPUTE_APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def server_args(models: Path) -> list[str]:
    return [
        "--model", str(models / TARGET), "--ctx-size", "1024", "--parallel", "1",
        "--n-gpu-layers", "all", "--flash-attn", "on",
        "--model-draft", str(models / DRAFTER), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3",
        "--n-gpu-layers-draft", "all", "--metrics", "--verbosity", "4",
    ]  # fmt: skip


def compute_apps() -> str | None:
    try:
        done = subprocess.run(COMPUTE_APPS, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True, type=Path)
    parser.add_argument("--models", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--expect", required=True, choices=["on-gpu", "refused"])
    parser.add_argument("--hide-gpu", action="store_true", help="start the server with CUDA_VISIBLE_DEVICES= (empty)")
    parser.add_argument("--budget-mib", type=float, default=0, help="the GPU's memory for the estimate (0: RAM)")
    parser.add_argument("--ready-timeout", type=float, default=120)
    parser.add_argument(
        "--gpu-metrics-out", type=Path, help="also write the GPU textfile (module_utils/gpu_metrics) while serving"
    )
    args = parser.parse_args()

    env = dict(os.environ)
    if args.hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    report: dict[str, Any] = {"expect": args.expect, "hide_gpu": args.hide_gpu, "binary": str(args.binary)}
    budget = args.budget_mib or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MIB
    estimate = preflight_estimate(args.models, gpu=True, budget_mib=budget).get("estimate")
    expected_mib = round((estimate["total"] - estimate["headroom"]) / MIB, 3) if estimate else None
    server = LocalLlamaServer(
        args.binary,
        server_args(args.models),
        port=free_port(),
        log_path=args.log,
        env=env,
        ready_timeout=args.ready_timeout,
        request_timeout=60,
    )
    apps = None
    try:
        with server:
            endpoint = server.restart()
            report["argv"] = server.argv
            report["pid"] = server.pid
            canary = api.complete(endpoint, PROMPT, n_predict=16)
            report["canary_draft_n"] = canary.draft_n
            apps = compute_apps()
            report["compute_apps"] = apps
            if args.gpu_metrics_out:
                args.gpu_metrics_out.write_text(gpu_metrics.collect("nvidia-smi", gpu_metrics.DEFAULT_GUARD_STATE))
            log = server.log_text()
    except (ServerStartError, api.ServerApiError) as exc:
        report["error"] = str(exc)[-3000:]
        print(f"offload: the server did not serve: {exc}", file=sys.stderr)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        return 1
    verdict = gpu_offload.check(log, compute_apps=apps, pid=report["pid"], expected_mib=expected_mib)
    report["verdict"] = verdict.as_dict()
    if args.expect == "on-gpu":
        ok = verdict.on_gpu and apps is not None
    else:
        ok = not verdict.on_gpu and verdict.cause in (gpu_offload.NO_DEVICE, gpu_offload.CUDA_INIT)
    report["ok"] = ok
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(verdict.message)
    print(f"offload ({'CUDA_VISIBLE_DEVICES=' if args.hide_gpu else 'as is'}, expect {args.expect}): "
          f"{'pass' if ok else 'FAIL'}: on_gpu={verdict.on_gpu} cause={verdict.cause}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
