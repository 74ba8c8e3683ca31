"""`make status`: the fleet's table from what playbooks/status.yml read back (module rig_deployed).

The same rows feed the terminal table and `--json`; a value that differs from what the inventory expects is
marked with `!` so drift shows at a glance. The default table is the few columns a person reads (rig, state,
model, URL, acceptance, tokens/s); `wide` shows every column (`make status wide=1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ansible.module_utils.printable import printable

COLUMNS = (
    "rig",
    "reachable",
    "gpu",
    "driver/cuda",
    "kernel",
    "llama.cpp",
    "image",
    "target",
    "drafter",
    "service",
    "draft/ctx",
    "acceptance",
    "decode t/s",
    "url",
)
COMPACT_COLUMNS = ("rig", "state", "model", "url", "accept", "tok/s")
# Shown when a fleet host's Prometheus answered (roles/fleet_monitor): the last hour, not the server's lifetime.
HISTORY_COLUMNS = ("accept 1h", "t/s 1h")


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if days else (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m")


def _model(found: dict[str, Any] | None) -> str:
    if not found:
        return "-"
    if not found.get("sha256"):
        return f"{found['name']} (unpinned)"
    return f"{found['name']} ({'verified' if found['verified'] else 'UNVERIFIED!'})"


def _draft_ctx(expected: dict[str, Any], server: dict[str, Any], running: dict[str, Any] | None) -> str:
    """Draft length / context per slot x slots, as the server runs them: the draft length from the container's
    argv (the API does not report it), the slots from /slots. ' !' when any differs from the inventory."""
    running = running or {}
    drafting = server.get("spec_types") not in (None, "none")
    spec = str(running.get("draft_n_max", "?")) if drafting else "off"
    text = f"{spec}/{server.get('ctx_per_slot')}x{server.get('slots')}"
    differs = bool(server.get("speculative")) == (expected.get("spec_type") == "none")
    for key in ("draft_n_max", "ctx_size", "parallel"):
        if key == "draft_n_max" and not drafting:
            continue
        if key in expected and str(running.get(key)) != str(expected[key]):
            differs = True
    return text + " !" if differs else text


def _kernel(kernels: dict[str, Any] | None) -> str:
    """The running kernel and, when another is newer (the next boot's), that one; each with its NVIDIA module
    (yes/no). ' !' when the next boot would land in a kernel without the module."""
    if not kernels or not kernels.get("kernels"):
        return "-"
    by_release = {entry["release"]: entry for entry in kernels["kernels"]}

    def one(release: str) -> str:
        entry = by_release.get(release)
        if entry is None:
            return f"{release} (not under /boot)"
        return f"{release} nvidia {'yes' if entry['has_module'] else 'NO'}"

    text = one(kernels["running"])
    if kernels["newest"] != kernels["running"]:
        text += f" -> {one(kernels['newest'])}"
    return text + " !" if kernels.get("reboot_strands_gpu") else text


def example_address(host: str) -> str:
    """The placeholder address the kit's seed and example host_vars carry for a rig (inventory/host_vars/,
    inventory/examples/): the owner replaces it with the machine's own."""
    return f"{host}.local"


def never_set_up(host: str, status: dict[str, Any]) -> tuple[str, str]:
    """(state, what to do) of an unreachable rig that was never set up: a sandbox whose container was never
    created, a rig still at its example address; ("", "") for a rig that was, and is down."""
    if status.get("reachable"):
        return "", ""
    if str(status.get("connection", "")).endswith("docker") and "No such container" in str(status.get("error", "")):
        return "not created", f"make provision host={host} creates it"
    if status.get("address") == example_address(host):
        return (
            "not set up",
            f"ansible_host is the example {example_address(host)}: set it in inventory/host_vars/{host}.yml",
        )
    return "", ""


def row(host: str, status: dict[str, Any]) -> dict[str, Any]:
    """One rig's row: display strings plus the raw figures (for --json)."""
    expected = status.get("expected") or {}
    if not status.get("reachable"):
        cells = dict.fromkeys(COLUMNS, "")
        state, todo = never_set_up(host, status)
        cells.update(
            rig=host,
            reachable="-" if state else "no",
            service=state or "unreachable",
            state=state or "unreachable",
            model="-",
            url="-",
            accept="-",
            **{"tok/s": "-"},
        )
        # its note says what to do; the connection's own words are for a rig that is down
        return {"cells": cells, "raw": {**status, "error": todo} if state else status}
    deployed = status.get("deployed") or {}
    gpu = deployed.get("gpu")
    want_gpu = expected.get("gpu") or {}
    image = deployed.get("image") or {}
    container = deployed.get("container") or {}
    server = deployed.get("server") or {}
    unit = deployed.get("unit") or {}
    models = deployed.get("models") or {}

    gpu_text = "none (CPU)"
    if gpu:
        gpu_text = f"{gpu['name']} {gpu['memory_mib'] // 1024} GB"
        if want_gpu.get("name") and want_gpu["name"] != gpu["name"]:
            gpu_text += " !"
    image_text = (expected.get("image") or "").split(":", 1)[-1] or "-"
    if not image:
        image_text += " (missing!)"
    elif container.get("image_id") and container["image_id"] != image.get("id"):
        image_text += " (container runs another image!)"
    draft_ctx = _draft_ctx(expected, server, container.get("settings")) if server.get("answers") else "-"
    acceptance = server.get("acceptance")
    service = f"{unit.get('active', '?')}"
    if unit.get("uptime_s") is not None:
        service += f" {_uptime(unit['uptime_s'])}"
    if container.get("health"):
        service += f" ({container['health']})"
    cells = {
        "rig": host,
        "reachable": "yes",
        "gpu": gpu_text,
        "driver/cuda": f"{gpu['driver']}/{gpu.get('cuda') or '?'}" if gpu else "-",
        "kernel": _kernel(deployed.get("kernels")),
        "llama.cpp": server.get("build_info") or ("not answering" if not server.get("answers") else "?"),
        "image": image_text,
        "target": _model(models.get("target")),
        "drafter": _model(models.get("drafter")),
        "service": service,
        "draft/ctx": draft_ctx,
        "acceptance": f"{acceptance:.2f} ({server.get('accepted_tokens')}/{server.get('drafted_tokens')})"
        if acceptance is not None
        else "-",
        "decode t/s": f"{server['decode_tps']:.1f}" if server.get("decode_tps") else "-",
        "url": str(expected.get("url") or "-"),
    }
    cells["model"] = _compact_model(models)
    drafting = server.get("spec_types") not in (None, "none")
    cells["accept"] = (
        "-" if not server.get("answers") else f"{acceptance:.2f}" if drafting and acceptance is not None else "off"
    )
    cells["tok/s"] = cells["decode t/s"]
    cells["state"] = _state(server, unit, container, differs=any("!" in value for value in cells.values()))
    return {"cells": cells, "raw": status}


def _compact_model(models: dict[str, Any]) -> str:
    """The target's name; ' (UNVERIFIED!)' when it or the drafter is not verified."""
    target, drafter = models.get("target"), models.get("drafter")
    if not target:
        return "-"
    unverified = any(found and found.get("sha256") and not found.get("verified") for found in (target, drafter))
    return f"{target['name']} (UNVERIFIED!)" if unverified else str(target["name"])


def _state(server: dict[str, Any], unit: dict[str, Any], container: dict[str, Any], *, differs: bool) -> str:
    """One word a person reads first: serving (with its uptime), or what is wrong; ' !' when a wide column differs
    from the inventory."""
    if server.get("answers"):
        text = "serving"
        if unit.get("uptime_s") is not None:
            text += f" {_uptime(unit['uptime_s'])}"
        if container.get("health") not in (None, "", "healthy"):
            text += f" ({container['health']})"
    elif unit.get("active") in (None, "", "inactive"):
        text = "stopped"
    else:
        text = f"{unit['active']}, not answering"
    return text + " !" if differs else text


def rows(
    fleet: dict[str, dict[str, Any]], last_hour: dict[str, dict[str, float]] | None = None
) -> list[dict[str, Any]]:
    """The table's rows; with ``last_hour`` ({rig: {acceptance_1h, decode_tps_1h}} from Prometheus), its columns."""
    table = [row(host, fleet[host]) for host in sorted(fleet)]
    if last_hour is not None:
        for entry in table:
            figures = last_hour.get(entry["cells"]["rig"]) or {}
            acceptance, rate = figures.get("acceptance_1h"), figures.get("decode_tps_1h")
            entry["cells"]["accept 1h"] = f"{acceptance:.2f}" if acceptance is not None else "-"
            entry["cells"]["t/s 1h"] = f"{rate:.1f}" if rate is not None else "-"
            entry["raw"] = {**entry["raw"], "last_hour": figures}
    return table


def render(table_rows: list[dict[str, Any]], archive_notes: Sequence[str] = (), *, wide: bool = False) -> str:
    """The table and its notes (``archive_notes``: what the controller says of the GPU rigs: the Debian archive on
    their pins and next kernel, rigkit.cli.plan.archive_notes; their driver branch's support,
    rigkit.validation.driver_support_rows.status_notes). ``wide``: every column, else the compact few."""
    cells = [entry["cells"] for entry in table_rows]
    columns = (COLUMNS if wide else COMPACT_COLUMNS) + tuple(
        column for column in HISTORY_COLUMNS if any(column in line for line in cells)
    )
    # what the rigs report (GPU name, versions, errors) is shown with its control characters escaped
    cells = [{column: printable(line.get(column, "")) for column in columns} for line in cells]
    widths = {column: max([len(column), *(len(str(line[column])) for line in cells)]) for column in columns}
    lines = ["  ".join(column.upper().ljust(widths[column]) for column in columns).rstrip()]
    lines += ["  ".join(str(line[column]).ljust(widths[column]) for column in columns).rstrip() for line in cells]
    notes = [
        f"{printable(entry['cells']['rig'])}: {printable(entry['raw']['error'])}"
        for entry in table_rows
        if entry["raw"].get("error")
    ]
    notes += [printable(note) for note in archive_notes]
    every = [entry["cells"] for entry in table_rows]
    if any(str(line.get("kernel", "")).endswith(" !") for line in every):
        notes.append("kernel !: the next boot starts a kernel without the NVIDIA module (`make provision host=NAME`)")
    if any("!" in str(value) for line in cells for value in line.values()):
        where = "" if wide else "`make status wide=1` shows where, "
        notes.append(f"!: differs from what the inventory says ({where}`make check host=NAME` the change)")
    return "\n".join(lines + (["", *notes] if notes else []))
