"""Jinja filters for the nvidia_container_toolkit role: the device nodes a CDI container needs, and whether the CDI
spec must be generated again (decided from what is on the rig, never from what changed in this run).

``nvidia-ctk cdi generate`` lists only the device nodes that exist when it runs and names the driver's libraries by
version, so the spec is stale when the loaded driver or the set of NVIDIA device nodes differs from the ones it was
made for. The role records both next to the spec (the stamp) and compares them on every converge."""

from __future__ import annotations

import base64
import re
from typing import Any

from ansible.errors import AnsibleFilterError

# Nodes CUDA needs in the container besides one /dev/nvidiaN per GPU (nvidia-uvm-tools and nvidia-modeset are
# created too, but CUDA runs without them).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
MINOR_RE = re.compile(r"^Device Minor:[ \t]*([0-9]+)[ \t]*$", re.MULTILINE)
STAMP_VERSION = "rigkit-cdi-stamp 1"


def _text(item: Any) -> str:
    """A file's text: a string, or an ansible.builtin.slurp result (base64 ``content``)."""
    if isinstance(item, dict) and "content" in item:
        return base64.b64decode(item["content"]).decode("utf-8", "replace")
    if isinstance(item, str):
        return item
    raise AnsibleFilterError(f"expected a file's text or a slurp result, got {type(item).__name__}")


def gpu_minors(informations: Any) -> list[int]:
    """The GPUs' minor numbers from their /proc/driver/nvidia/gpus/<pci>/information files."""
    if not isinstance(informations, list):
        raise AnsibleFilterError("nvidia_required_device_nodes expects a list of information files")
    minors = []
    for item in informations:
        text = _text(item)
        found = MINOR_RE.search(text)
        if not found:
            source = item.get("source", "an information file") if isinstance(item, dict) else "an information file"
            raise AnsibleFilterError(
                f"{source} has no 'Device Minor:' line: this driver reports its GPUs in another format; "
                "read it on the rig and report it"
            )
        minors.append(int(found.group(1)))
    return sorted(set(minors))


def required_device_nodes(informations: Any) -> list[str]:
    """What must exist before the CDI spec is generated: the control nodes and /dev/nvidiaN for every GPU."""
    return [*CONTROL_NODES, *(f"/dev/nvidia{minor}" for minor in gpu_minors(informations))]


def stamp(driver_version: Any, device_paths: Any) -> str:
    """The stamp text: the loaded driver's version and the device nodes present, one per line, sorted."""
    version = str(driver_version or "").strip()
    if not version:
        raise AnsibleFilterError("no loaded NVIDIA driver version (/sys/module/nvidia/version is empty)")
    if not isinstance(device_paths, list) or not all(isinstance(path, str) for path in device_paths):
        raise AnsibleFilterError("nvidia_cdi_stamp expects the device node paths as a list of strings")
    lines = [STAMP_VERSION, f"driver {version}", *(f"device {path}" for path in sorted(set(device_paths)))]
    return "\n".join(lines) + "\n"


def _parse(text: str) -> tuple[str | None, set[str]]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or lines[0] != STAMP_VERSION:
        return None, set()
    driver = next((line.split(" ", 1)[1] for line in lines if line.startswith("driver ")), None)
    return driver, {line.split(" ", 1)[1] for line in lines if line.startswith("device ")}


def spec_plan(recorded: Any, driver_version: Any, device_paths: Any, spec_exists: Any) -> dict[str, Any]:
    """Whether to run ``nvidia-ctk cdi generate``: ``regenerate``, the ``stamp`` to record after it, and the
    ``reason`` (empty when the spec is current). ``recorded`` is the stamp on the rig (None or '' when absent)."""
    wanted = stamp(driver_version, device_paths)
    version = str(driver_version).strip()
    if not spec_exists:
        reason = "no CDI spec yet"
    elif not recorded:
        reason = "no stamp next to the spec: its driver and device nodes are unknown"
    else:
        old_driver, old_devices = _parse(str(recorded))
        if old_driver is None:
            reason = f"the stamp is from an older kit (it recorded {str(recorded).strip()!r}, not the device nodes)"
        else:
            changes = []
            if old_driver != version:
                changes.append(f"driver {old_driver} -> {version}")
            now = set(device_paths)
            if now - old_devices:
                changes.append("device nodes added: " + ", ".join(sorted(now - old_devices)))
            if old_devices - now:
                changes.append("device nodes gone: " + ", ".join(sorted(old_devices - now)))
            reason = "; ".join(changes)
    return {"regenerate": bool(reason), "stamp": wanted, "reason": reason}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_required_device_nodes": required_device_nodes,
            "nvidia_cdi_stamp": stamp,
            "nvidia_cdi_spec_plan": spec_plan,
        }
