"""A rig's GPU facts for the node exporter's textfile collector (stdlib only; also the script a rig's timer runs).

``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` gives one CSV row per GPU; each field becomes a
gauge labelled with the GPU's ``index``, ``uuid`` and ``name``. A field the GPU does not have (``[N/A]``,
``[Not Supported]``: ECC and fan on most GeForce cards) is left out, never written as 0. The clock event
("throttle") reasons become one gauge per reason. Drivers before the rename call them ``clocks_throttle_reasons.*``:
when nvidia-smi rejects the ``clocks_event_reasons`` names, the query is asked again with the old ones.

Beside the GPU, what the NVIDIA driver role's boot guard last decided (its state file: is there a kernel, newer
than the running one, that would boot without the NVIDIA module) and the loaded module's version, so that an alert
sees a pending reboot that would lose the GPU. ``rigkit_gpu_collector_success`` says whether nvidia-smi answered.

    python3 gpu_metrics.py --output /var/lib/prometheus/node-exporter/rigkit_gpu.prom \\
        [--guard-state /var/lib/rigkit/nvidia-kernel-guard] [--nvidia-smi nvidia-smi]

The file is replaced atomically (the collector never reads half of it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

MIB = 1 << 20
MHZ = 1_000_000
IDENTITY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version")
EVENT_REASONS_PREFIX = "clocks_event_reasons"
THROTTLE_REASONS_PREFIX = "clocks_throttle_reasons"
DEFAULT_OUTPUT = "/var/lib/prometheus/node-exporter/rigkit_gpu.prom"
DEFAULT_GUARD_STATE = "/var/lib/rigkit/nvidia-kernel-guard"
MODULE_VERSION_FILE = "/sys/module/nvidia/version"
QUERY_TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class Gauge:
    """One nvidia-smi field as a Prometheus gauge: its name, help text and the factor from nvidia-smi's unit."""

    query: str
    metric: str
    help: str
    scale: float = 1.0


GAUGES: tuple[Gauge, ...] = (
    Gauge("temperature.gpu", "rigkit_gpu_temperature_celsius", "GPU core temperature."),
    Gauge("temperature.memory", "rigkit_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature."),
    Gauge("power.draw", "rigkit_gpu_power_draw_watts", "Power the board draws."),
    Gauge("power.limit", "rigkit_gpu_power_limit_watts", "The board's enforced power limit."),
    Gauge("clocks.sm", "rigkit_gpu_sm_clock_hertz", "Current SM clock.", MHZ),
    Gauge("clocks.max.sm", "rigkit_gpu_sm_clock_max_hertz", "Highest SM clock the GPU can run at.", MHZ),
    Gauge("clocks.mem", "rigkit_gpu_memory_clock_hertz", "Current memory clock.", MHZ),
    Gauge("memory.used", "rigkit_gpu_memory_used_bytes", "GPU memory in use (all processes).", MIB),
    Gauge("memory.total", "rigkit_gpu_memory_total_bytes", "GPU memory in all.", MIB),
    Gauge("utilization.gpu", "rigkit_gpu_utilization_ratio", "Time the GPU was busy over the last sample.", 0.01),
    Gauge("fan.speed", "rigkit_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum.", 0.01),
    Gauge("ecc.errors.uncorrected.volatile.total", "rigkit_gpu_ecc_uncorrected_errors",
          "Uncorrected ECC errors since the driver loaded."),
    Gauge("ecc.errors.corrected.volatile.total", "rigkit_gpu_ecc_corrected_errors",
          "Corrected ECC errors since the driver loaded."),
)  # fmt: skip

# The clock event reasons that mean the GPU runs slower than asked; the names after nvidia-smi's prefix.
SLOWDOWN_REASONS: tuple[str, ...] = (
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)


def query_fields(reasons_prefix: str = EVENT_REASONS_PREFIX) -> list[str]:
    return [
        *IDENTITY_FIELDS,
        "pstate",
        *(gauge.query for gauge in GAUGES),
        *(f"{reasons_prefix}.{reason}" for reason in SLOWDOWN_REASONS),
    ]


def query_command(nvidia_smi: str, reasons_prefix: str = EVENT_REASONS_PREFIX) -> list[str]:
    return [nvidia_smi, f"--query-gpu={','.join(query_fields(reasons_prefix))}", "--format=csv,noheader,nounits"]


def rejects_field(output: str) -> bool:
    """nvidia-smi's answer to a field it does not know (an older driver asked for the newer reason names)."""
    return "is not a valid field to query" in output


@dataclass
class GpuSample:
    """One GPU's row: identity, performance state, the numeric fields present, the slowdown reasons reported."""

    index: str
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str
    pstate: int | None
    values: dict[str, float] = field(default_factory=dict)
    slowdowns: dict[str, bool] = field(default_factory=dict)


class QueryError(Exception):
    """nvidia-smi did not answer with rows: the message says what it said."""


# ASCII digits only: float() and str.isdigit() also take other scripts' digits.
NUMBER_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
PSTATE_RE = re.compile(r"P([0-9]{1,2})")


def _number(text: str) -> float | None:
    """A field's value, or None for what nvidia-smi says the GPU cannot give ("[N/A]"...) or any other text."""
    return float(text) if NUMBER_RE.fullmatch(text) else None


def _pstate(text: str) -> int | None:
    match = PSTATE_RE.fullmatch(text)
    return int(match.group(1)) if match else None


def parse_rows(text: str, reasons_prefix: str = EVENT_REASONS_PREFIX) -> list[GpuSample]:
    """The CSV nvidia-smi printed for ``query_fields(reasons_prefix)``: one sample per GPU."""
    fields = query_fields(reasons_prefix)
    samples = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(", ")]
        if len(cells) != len(fields):
            raise QueryError(f"nvidia-smi printed {len(cells)} fields where {len(fields)} were asked for: {line!r}")
        row = dict(zip(fields, cells, strict=True))
        values = {g.metric: v * g.scale for g in GAUGES if (v := _number(row[g.query])) is not None}
        slowdowns = {
            reason: row[f"{reasons_prefix}.{reason}"] == "Active"
            for reason in SLOWDOWN_REASONS
            if row[f"{reasons_prefix}.{reason}"] in ("Active", "Not Active")
        }
        samples.append(
            GpuSample(
                index=row["index"],
                uuid=row["uuid"],
                name=row["name"],
                pci_bus_id=row["pci.bus_id"],
                driver_version=row["driver_version"],
                pstate=_pstate(row["pstate"]),
                values=values,
                slowdowns=slowdowns,
            )
        )
    return samples


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_SECONDS, check=False)


def query(nvidia_smi: str = "nvidia-smi", run: Runner = _run) -> list[GpuSample]:
    """Every GPU's sample, asking again with the old reason names when the driver predates the rename."""
    for prefix in (EVENT_REASONS_PREFIX, THROTTLE_REASONS_PREFIX):
        try:
            done = run(query_command(nvidia_smi, prefix))
        except FileNotFoundError as exc:
            raise QueryError(f"{nvidia_smi} is not installed: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise QueryError(f"{nvidia_smi} did not answer within {QUERY_TIMEOUT_SECONDS} s") from exc
        said = (done.stdout + done.stderr).strip()
        if done.returncode == 0:
            return parse_rows(done.stdout, prefix)
        if not rejects_field(said):
            break
    raise QueryError(f"{nvidia_smi} failed (exit {done.returncode}): {said.splitlines()[-1] if said else 'no output'}")


def read_guard_state(path: str) -> dict[str, str] | None:
    """The boot guard's key=value state file (roles/nvidia_driver), or None when the guard has not run."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    return dict(line.split("=", 1) for line in lines if "=" in line)


def read_module_version(path: str = MODULE_VERSION_FILE) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}" if labels else ""


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Exposition:
    """Prometheus text format, each metric's HELP and TYPE once, before its first sample."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, list[str]]] = {}

    def add(self, metric: str, help_text: str, value: float, labels: dict[str, str] | None = None) -> None:
        family = self._families.setdefault(metric, (help_text, []))
        family[1].append(f"{metric}{_labels(labels or {})} {_number_text(value)}")

    def text(self) -> str:
        out = []
        for metric, (help_text, samples) in self._families.items():
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge", *samples]
        return "\n".join(out) + "\n"


def render(
    samples: Iterable[GpuSample] | None,
    *,
    error: str | None = None,
    guard_state: dict[str, str] | None = None,
    module_version: str | None = None,
    now: float | None = None,
) -> str:
    """The textfile: the GPUs' gauges (or the collector's failure), the boot guard's verdict, the loaded module."""
    out = Exposition()
    out.add("rigkit_gpu_collector_success", "1 when nvidia-smi answered this sample.", 0 if error else 1)
    out.add("rigkit_gpu_collector_timestamp_seconds", "When this sample was taken.", round(now or time.time(), 3))
    if error:
        out.add("rigkit_gpu_collector_error", "Why nvidia-smi gave no sample.", 1, {"message": error[:300]})
    for sample in samples or ():
        # not "gpu": the fleet monitor labels every series of a rig with its GPU's name from the lock
        gpu = {"index": sample.index, "uuid": sample.uuid, "name": sample.name}
        out.add("rigkit_gpu_info", "The GPU's identity and driver.", 1,
                {**gpu, "pci_bus_id": sample.pci_bus_id, "driver_version": sample.driver_version})  # fmt: skip
        if sample.pstate is not None:
            out.add("rigkit_gpu_performance_state", "Performance state (0 is the fastest, 15 the slowest).",
                    sample.pstate, gpu)  # fmt: skip
        for gauge in GAUGES:
            if gauge.metric in sample.values:
                out.add(gauge.metric, gauge.help, sample.values[gauge.metric], gpu)
        for reason, active in sample.slowdowns.items():
            out.add("rigkit_gpu_clock_slowdown", "1 while this reason holds the GPU's clocks down.", int(active),
                    {**gpu, "reason": reason})  # fmt: skip
    loaded = module_version is not None
    out.add("rigkit_nvidia_module_loaded", "1 when the NVIDIA kernel module is loaded.", int(loaded),
            {"version": module_version or ""})  # fmt: skip
    if guard_state is not None:
        verdict = guard_state.get("verdict", "")
        out.add("rigkit_nvidia_kernel_guard_ok",
                "1 when the newest installed kernel has the NVIDIA module (a reboot keeps the GPU).",
                int(verdict == "ok"),
                {"verdict": verdict, "newest": guard_state.get("newest", ""),
                 "with_module": guard_state.get("with_module", "")})  # fmt: skip
    return out.text()


def write_textfile(path: str, text: str) -> None:
    """Replace `path` atomically, mode 0644 (the node exporter runs as its own user)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def collect(nvidia_smi: str, guard_state_path: str, module_version_path: str = MODULE_VERSION_FILE) -> str:
    samples: list[GpuSample] = []
    error = None
    try:
        samples = query(nvidia_smi)
    except QueryError as exc:
        error = str(exc)
    return render(
        samples,
        error=error,
        guard_state=read_guard_state(guard_state_path),
        module_version=read_module_version(module_version_path),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="the .prom file (- for stdout)")
    parser.add_argument("--guard-state", default=DEFAULT_GUARD_STATE)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    args = parser.parse_args(argv)
    text = collect(args.nvidia_smi, args.guard_state)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_textfile(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
