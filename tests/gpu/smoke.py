"""Smoke test of a llama-server binary with the tiny Gemma 4 pair and the MTP drafter (tests/gpu/run.sh step).

    python3 tests/gpu/smoke.py --binary BIN --models .device/models --log server.log --out smoke.json [--gpu]

Starts the server (-ngl all -ngld all --spec-type draft-mtp --spec-draft-n-max 3 -fa on --metrics, loopback,
log level 4 so the buffer sizes are logged), then checks through module_utils/llama_server/api: /health, a canary
completion that drafts (timings.draft_n > 0), /slots speculative, the /metrics spec_decode counters, /props
build_info. With --gpu it also checks that the log shows target and drafter offloaded to CUDA, reads the process's
GPU memory from nvidia-smi, and puts module_utils/preflight/server's memory estimate for the same files and
settings next to the buffer sizes llama-server logged. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.local_server import LocalLlamaServer, ServerStartError, api, free_port, kit_module_utils

MIB = 1024 * 1024
TARGET = "tiny-gemma4.gguf"
DRAFTER = "tiny-gemma4-assistant.gguf"
CTX = 1024
DRAFT_N_MAX = 3
PROMPT = "def fibonacci(n):"
BUFFER_RE = re.compile(
    r"(?P<dev>[A-Za-z0-9_]+)\s+(?P<kind>model|KV|compute|output|RS)\s+buffer size =\s+(?P<mib>[0-9.]+) MiB"
)
OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
DRAFT_START = "loading draft model"
INTERESTING = re.compile(
    r"ggml_cuda_init|Device \d+:|offload|CUDA\d|buffer size|memory_breakdown|using device|failed|error|"
    r"draft acceptance|build \d+|system_info|graph: nodes|flash_attn",
    re.IGNORECASE,
)


class Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool | None, detail: Any = "") -> bool:
        """ok None = skipped (not counted as a failure)."""
        status = "skip" if ok is None else "pass" if ok else "fail"
        self.items.append({"name": name, "status": status, "detail": detail})
        print(f"[{status}] {name}: {detail}", flush=True)
        return bool(ok)

    @property
    def ok(self) -> bool:
        return all(item["status"] != "fail" for item in self.items)


def server_args(models: Path, gpu_layers: str) -> list[str]:
    return [
        "-m",
        str(models / TARGET),
        "-md",
        str(models / DRAFTER),
        "--spec-type",
        "draft-mtp",
        "--spec-draft-n-max",
        str(DRAFT_N_MAX),
        "-c",
        str(CTX),
        "-np",
        "1",
        "-ngl",
        gpu_layers,
        "-ngld",
        gpu_layers,
        "-fa",
        "on",
        "--metrics",
        "-lv",
        "4",
    ]


def preflight_estimate(models: Path, *, gpu: bool, budget_mib: float) -> dict[str, Any]:
    """module_utils/preflight/server for the same files and settings (headroom: the llama_server role's default)."""
    server_preflight = kit_module_utils("preflight.server")
    settings = {
        "spec_type": "draft-mtp",
        "ctx_size": CTX,
        "parallel": 1,
        "flash_attn": "on",
        "gpu_layers": "all" if gpu else "0",
        "gpu_layers_draft": "all" if gpu else "0",
        "headroom_mib": kit_module_utils("preflight.memory").memory_headroom_mib("auto", on_gpu=gpu),
    }
    result = server_preflight.preflight(models / TARGET, models / DRAFTER, settings, budget_mib)
    return {
        "settings": settings,
        "budget_mib": budget_mib,
        "problems": result.problems,
        "warnings": result.warnings,
        "estimate": result.estimate.as_dict() if result.estimate else None,
    }


def parse_log(text: str) -> dict[str, Any]:
    """Buffer sizes (MiB) per model and device, offload lines, the exit memory breakdown, notable lines."""
    lines = text.splitlines()
    draft_at = next((i for i, line in enumerate(lines) if DRAFT_START in line), len(lines))
    # the target's real load is the last "loading model tensors" before the drafter (the fit phase may dry-run)
    target_at = max(
        (i for i, line in enumerate(lines[:draft_at]) if "load_tensors: loading model tensors" in line), default=0
    )
    sections = {"target": lines[target_at:draft_at], "drafter": lines[draft_at:]}
    buffers: dict[str, dict[str, float]] = {}
    for section, body in sections.items():
        found: dict[str, float] = {}
        for line in body:
            match = BUFFER_RE.search(line)
            if not match:
                continue
            key = f"{match['kind']}@{match['dev']}"
            mib = float(match["mib"])
            # model and KV buffers add up (e.g. the SWA and full-attention caches); a compute/output buffer is
            # reserved again when the context is re-scheduled, so the last one counts
            found[key] = round(found.get(key, 0.0) + mib if match["kind"] in ("model", "KV") else mib, 2)
        buffers[section] = found
    offloads = {
        section: [f"{m[1]}/{m[2]}" for m in (OFFLOAD_RE.search(line) for line in body) if m]
        for section, body in sections.items()
    }
    # llama-server prints a memory breakdown per device when it exits (and one while fitting, at the start)
    exit_at = max((i for i, line in enumerate(lines) if "cleaning up before exit" in line), default=0)
    breakdown = [line.split("breakdown_print:", 1)[1].strip() for line in lines[exit_at:] if "breakdown_print:" in line]
    acceptance = [line.split("|")[-1].strip() for line in lines if "draft acceptance" in line]
    notable = [line for line in lines if INTERESTING.search(line) and "print_info" not in line][:120]
    return {
        "buffers_mib": buffers,
        "offloaded": offloads,
        "memory_breakdown_at_exit": breakdown[:8],
        "draft_acceptance_lines": acceptance[-5:],
        "notable_lines": notable,
    }


def gpu_process_memory() -> list[dict[str, Any]]:
    proc = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in proc.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[2].isdigit():
            rows.append({"pid": fields[0], "name": fields[1], "used_mib": int(fields[2])})
    return rows


def compare(
    estimate: dict[str, Any] | None,
    buffers: dict[str, dict[str, float]],
    gpu: bool,
    process_mib: int | None = None,
) -> list[dict[str, Any]]:
    """Estimate vs what llama-server allocated, MiB, per part."""
    if not estimate:
        return []
    dev = "CUDA0" if gpu else "CPU"  # "CPU" also matches CPU_Mapped (mmap-ed weights)

    def logged(section: str, kind: str) -> float:
        return round(sum(v for k, v in buffers.get(section, {}).items() if k.startswith(f"{kind}@{dev}")), 2)

    def logged_any(section: str, kind: str) -> float:
        return round(sum(v for k, v in buffers.get(section, {}).items() if k.startswith(f"{kind}@")), 2)

    rows = [
        ("target weights", estimate["target_weights"], logged("target", "model")),
        ("drafter weights", estimate["drafter_weights"], logged("drafter", "model")),
        ("target KV cache", estimate["target_kv_cache"], logged("target", "KV")),
        ("drafter KV cache", estimate["drafter_kv_cache"], logged("drafter", "KV")),
        (
            "attention scratch vs compute buffers (target + drafter)",
            estimate["attention_scratch"],
            round(logged("target", "compute") + logged("drafter", "compute"), 2),
        ),
    ]
    out = [
        {"part": part, "estimate_mib": round(est / MIB, 3), f"logged_{dev}_mib": real, "device": dev}
        for part, est, real in rows
    ]
    out.append(
        {
            "part": "all buffers on any device (model + KV + compute + output, both models)",
            "estimate_mib": round(estimate["total"] / MIB, 3),
            "estimate_without_headroom_mib": round((estimate["total"] - estimate["headroom"]) / MIB, 3),
            "logged_all_devices_mib": round(
                sum(logged_any(s, k) for s in ("target", "drafter") for k in ("model", "KV", "compute", "output")), 2
            ),
        }
    )
    if process_mib is not None:
        out.append(
            {
                "part": "GPU memory of the llama-server process (nvidia-smi, CUDA context included) vs the estimate",
                "estimate_mib": round(estimate["total"] / MIB, 3),
                "nvidia_smi_used_mib": process_mib,
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True, type=Path)
    parser.add_argument("--models", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--gpu", action="store_true", help="expect CUDA offload (a GPU build on a GPU machine)")
    parser.add_argument("--budget-mib", type=float, default=0, help="memory budget for the estimate (0: RAM)")
    parser.add_argument("--expect-build", default="", help="/props build_info, e.g. b11312-0c1e570")
    parser.add_argument("--ready-timeout", type=float, default=120)
    args = parser.parse_args()

    checks = Checks()
    report: dict[str, Any] = {"gpu_mode": args.gpu, "binary": str(args.binary)}
    budget = args.budget_mib or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MIB
    try:
        report["preflight"] = preflight_estimate(args.models, gpu=args.gpu, budget_mib=budget)
        checks.add("preflight passes", not report["preflight"]["problems"], report["preflight"]["problems"] or "ok")
    except Exception as exc:  # reported; the server checks still run
        report["preflight"] = {"error": f"{type(exc).__name__}: {exc}"}
        checks.add("preflight passes", False, report["preflight"]["error"])

    gpu_layers = "all"
    port = args.port or free_port()
    server = LocalLlamaServer(
        args.binary,
        server_args(args.models, gpu_layers),
        port=port,
        log_path=args.log,
        ready_timeout=args.ready_timeout,
        request_timeout=60,
    )
    report["argv"] = []
    try:
        with server:
            t0 = time.monotonic()
            try:
                endpoint = server.restart()
            except ServerStartError as exc:
                checks.add("server starts, /health 200", False, str(exc)[-3000:])
                raise
            report["argv"] = server.argv
            report["pid"] = server.pid
            report["ready_seconds"] = round(time.monotonic() - t0, 2)
            checks.add("server starts, /health 200", True, f"{report['ready_seconds']} s")

            completion = api.complete(endpoint, PROMPT, n_predict=32)
            report["canary"] = {"content": completion.content, "timings": completion.timings}
            checks.add(
                "canary drafts (timings.draft_n > 0)",
                completion.draft_n > 0,
                f"draft_n={completion.draft_n} accepted={completion.draft_n_accepted} "
                f"predicted/s={completion.timings.get('predicted_per_second')}",
            )
            slots = api.speculative_slots(endpoint)
            checks.add("/slots speculative", bool(slots) and all(slots), slots)
            metrics = api.metrics(endpoint)
            spec = {k: v for k, v in metrics.items() if "spec_decode" in k}
            report["metrics_spec_decode"] = spec
            checks.add(
                "/metrics spec_decode counters > 0",
                metrics.get("llamacpp:spec_decode_num_draft_tokens_total", 0) > 0
                and metrics.get("llamacpp:spec_decode_num_drafts_total", 0) > 0,
                {k: v for k, v in spec.items() if "per_pos" not in k},
            )
            build = api.build_info(endpoint)
            report["build_info"] = build
            checks.add("/props build_info", build == args.expect_build if args.expect_build else None, build)
            if args.gpu:
                report["nvidia_smi_processes"] = gpu_process_memory()
        report["exit_status"] = server.returncode
    except ServerStartError:
        pass
    except api.ServerApiError as exc:
        checks.add("server API answers", False, str(exc))

    parsed = parse_log(server.log_text())
    report["log"] = parsed
    if args.gpu:
        offloaded = parsed["offloaded"]
        for section in ("target", "drafter"):
            done = offloaded.get(section, [])
            full = bool(done) and all(a == b for a, b in (o.split("/") for o in done))
            checks.add(f"{section} offloaded to CUDA (log)", full, done)
            has_cuda = any(k.endswith("CUDA0") for k in parsed["buffers_mib"].get(section, {}))
            checks.add(f"{section} buffers on CUDA0 (log)", has_cuda, parsed["buffers_mib"].get(section))
    else:
        checks.add("offload to CUDA", None, "skipped: no GPU (CPU run)")
    estimate = report.get("preflight", {}).get("estimate")
    processes = report.get("nvidia_smi_processes") or []
    mine = [p["used_mib"] for p in processes if p["pid"] == str(report.get("pid"))] or [
        p["used_mib"] for p in processes
    ]
    report["estimate_vs_log"] = compare(estimate, parsed["buffers_mib"], args.gpu, sum(mine) if mine else None)
    report["checks"] = checks.items
    report["ok"] = checks.ok
    counts = {status: sum(1 for c in checks.items if c["status"] == status) for status in ("pass", "fail", "skip")}
    failed = [c["name"] for c in checks.items if c["status"] == "fail"]
    failed_text = f" ({', '.join(failed)})" if failed else ""
    print(f"smoke: {counts['pass']} passed, {counts['fail']} failed{failed_text}, {counts['skip']} skipped")
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
