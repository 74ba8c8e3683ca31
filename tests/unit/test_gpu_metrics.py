"""module_utils/gpu_metrics.py: the GPU textfile a rig's timer writes for the node exporter. Fed with what nvidia-smi
580.159.04 printed on the H200 run of 2026-12-04 (tests/fixtures/gpu_metrics/, from tests/gpu/run.sh's gpu-metrics
step: the rows for both reason prefixes and its answer to an unknown field), and checked by the pinned Prometheus's
own `promtool check metrics`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.gpu_metrics import (
    EVENT_REASONS_PREFIX,
    SLOWDOWN_REASONS,
    THROTTLE_REASONS_PREFIX,
    QueryError,
    collect,
    parse_rows,
    query,
    query_command,
    query_fields,
    read_guard_state,
    rejects_field,
    render,
)

from rigkit.fleet.promtool import promtool
from tests.support import CACHE_DIR

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_metrics"
RECORDED = (DATA / "h200-nvidia-smi-query.txt").read_text()


def answer_to(fields: str) -> str:
    """What nvidia-smi printed on the H200 for `--query-gpu=FIELDS` (the lines after that command's comment)."""
    blocks = RECORDED.split("# nvidia-smi --query-gpu=")
    block = next(b for b in blocks if b.startswith(fields + " "))
    lines = block.splitlines()[1:]
    end = next((i for i, line in enumerate(lines) if line.startswith("# ")), len(lines))  # "# rc N", the next command
    return "".join(line + "\n" for line in lines[:end])


NEW_ROWS = answer_to(",".join(query_fields(EVENT_REASONS_PREFIX)))
OLD_ROWS = answer_to(",".join(query_fields(THROTTLE_REASONS_PREFIX)))
UNKNOWN_FIELD = answer_to("index,no.such.field")


def samples(text: str) -> dict[str, float]:
    """Prometheus text -> {series: value}."""
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {series: float(value) for series, value in pairs}


def value(text: str, metric: str) -> float:
    return next(v for series, v in samples(text).items() if series.split("{")[0] == metric)


@pytest.fixture(scope="module")
def tool() -> Path:
    return promtool(CACHE_DIR)


def test_the_recorded_h200_row_parses_to_its_figures():
    (gpu,) = parse_rows(NEW_ROWS)
    assert (gpu.index, gpu.name, gpu.driver_version, gpu.pstate) == ("0", "NVIDIA H200", "580.159.04", 0)
    assert gpu.uuid.startswith("GPU-") and gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.values["rigkit_gpu_memory_total_bytes"] == 143771 * 2**20
    assert gpu.values["rigkit_gpu_power_limit_watts"] == 700.0
    assert gpu.values["rigkit_gpu_sm_clock_max_hertz"] == 1980 * 10**6
    assert 20 <= gpu.values["rigkit_gpu_temperature_celsius"] <= 90
    assert gpu.slowdowns == dict.fromkeys(SLOWDOWN_REASONS, False)


def test_a_field_the_gpu_lacks_is_left_out_not_written_as_zero():
    (gpu,) = parse_rows(NEW_ROWS)
    assert "[N/A]" in NEW_ROWS  # the H200 has no fan
    assert "rigkit_gpu_fan_speed_ratio" not in gpu.values
    assert "rigkit_gpu_fan_speed_ratio" not in render([gpu])


def test_the_old_reason_names_give_the_same_sample():
    (new,) = parse_rows(NEW_ROWS)
    (old,) = parse_rows(OLD_ROWS, THROTTLE_REASONS_PREFIX)
    assert old.slowdowns == new.slowdowns and old.name == new.name


def test_nvidia_smis_answer_to_an_unknown_field_is_recognised():
    assert UNKNOWN_FIELD.strip() == 'Field "no.such.field" is not a valid field to query.'
    assert rejects_field(UNKNOWN_FIELD)
    assert not rejects_field("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_an_older_driver_is_asked_again_with_the_throttle_names():
    """A driver that predates the rename rejects the event names (its answer: the one recorded for an unknown field)
    and answers the throttle names."""
    asked: list[list[str]] = []

    def older_driver(argv):
        asked.append(list(argv))
        if any(EVENT_REASONS_PREFIX in arg for arg in argv):
            return subprocess.CompletedProcess(argv, 2, stdout=UNKNOWN_FIELD, stderr="")
        return subprocess.CompletedProcess(argv, 0, stdout=OLD_ROWS, stderr="")

    (gpu,) = query(run=older_driver)
    assert [argv[1] for argv in asked] == [
        query_command("nvidia-smi", p)[1] for p in (EVENT_REASONS_PREFIX, THROTTLE_REASONS_PREFIX)
    ]
    assert gpu.name == "NVIDIA H200"


def test_a_row_with_the_wrong_number_of_fields_is_refused():
    with pytest.raises(QueryError, match="23 fields where 24 were asked for"):
        parse_rows(NEW_ROWS.rsplit(", ", 1)[0])


def test_no_nvidia_smi_is_a_failed_sample_not_an_error(tmp_path: Path):
    text = collect(str(tmp_path / "nvidia-smi"), str(tmp_path / "no-state"), str(tmp_path / "no-module"))
    assert value(text, "rigkit_gpu_collector_success") == 0
    assert "is not installed" in text and "rigkit_gpu_temperature_celsius" not in text
    assert value(text, "rigkit_nvidia_module_loaded") == 0
    with pytest.raises(QueryError, match="is not installed"):
        query(str(tmp_path / "nvidia-smi"))


def test_the_boot_guard_verdict_is_exported(tmp_path: Path):
    state = tmp_path / "nvidia-kernel-guard"
    state.write_text(
        "time=2026-12-04T10:00:00Z\ntrigger=postinst.d 6.1.0-57-amd64\nnewest=6.1.0-57-amd64\n"
        "with_module=6.1.0-56-amd64\nverdict=kept-on-6.1.0-56-amd64\nboot=GRUB boots 6.1.0-56-amd64\n"
    )
    text = render(parse_rows(NEW_ROWS), guard_state=read_guard_state(str(state)), module_version="580.159.04")
    assert value(text, "rigkit_nvidia_kernel_guard_ok") == 0
    assert 'verdict="kept-on-6.1.0-56-amd64",newest="6.1.0-57-amd64"' in text
    assert 'rigkit_nvidia_module_loaded{version="580.159.04"} 1' in text
    assert read_guard_state(str(tmp_path / "absent")) is None


def test_while_serving_on_the_gpu_the_memory_shows_and_on_the_cpu_it_does_not():
    """The samples tests/gpu/run.sh took on the H200 while the same server served as is and with
    CUDA_VISIBLE_DEVICES= (the signal the 'model left the GPU' alert reads). Recorded as the collector wrote them
    then, with the GPU's index labelled `gpu` (now `index`): only the values are read here."""
    on_gpu = (DATA / "h200-serving-gpu.prom").read_text()
    on_cpu = (DATA / "h200-serving-cpu.prom").read_text()
    assert value(on_gpu, "rigkit_gpu_memory_used_bytes") > 256 * 2**20
    assert value(on_cpu, "rigkit_gpu_memory_used_bytes") == 0


def test_the_textfile_passes_promtool(tool: Path, tmp_path: Path):
    for text in (
        render(parse_rows(NEW_ROWS), guard_state={"verdict": "ok", "newest": "6.1.0-57-amd64"}, module_version="1"),
        render(None, error='nvidia-smi failed (exit 9): "quoted" \\ and a\nnewline'),
        (DATA / "h200-serving-gpu.prom").read_text(),
    ):
        done = subprocess.run([str(tool), "check", "metrics"], input=text, capture_output=True, text=True,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_only_ascii_numbers_are_read():
    """nvidia-smi's text is untrusted: another script's digits are not a number (float() would take them)."""
    row = NEW_ROWS.replace(", 700.00, ", ", \u0667\u0660\u0660, ", 1)
    (gpu,) = parse_rows(row)
    assert "rigkit_gpu_power_limit_watts" not in gpu.values
    assert parse_rows(NEW_ROWS.replace(", P0, ", ", P\u0660, ", 1))[0].pstate is None
