"""Jinja filter for the llama_server role's GPU proof (tasks/gpu_proof.yml): the freshly built image, run with the
server's own container flags, must list CUDA0 (``llama-server --list-devices``). This reads what that run printed
and, when CUDA0 is not there, names the cause and the next step."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

# `llama-server --list-devices` (common/arg.cpp common_print_available_devices at the pin):
#   Available devices:
#     CUDA0: NVIDIA GeForce RTX 3050 (8192 MiB, 7801 MiB free)
# or "  (none)" when no backend but the CPU's has a device.
DEVICE_RE = re.compile(r"^\s+([A-Za-z][A-Za-z0-9_-]*[0-9]+): (.*)$")
CUDA_INIT_RE = re.compile(r"ggml_cuda_init: failed to initialize CUDA: (.+)")
CDI_RE = re.compile(r"CDI|failed to stat CDI host device|unresolvable CDI devices", re.IGNORECASE)


def _lines(text: Any) -> list[str]:
    return [line.rstrip() for line in str(text or "").splitlines() if line.strip()]


def listed_devices(stdout: Any) -> dict[str, str]:
    """{name: description} of the devices ``--list-devices`` printed, in order."""
    devices: dict[str, str] = {}
    listing = False
    for line in str(stdout or "").splitlines():
        if line.strip() == "Available devices:":
            listing = True
            continue
        found = DEVICE_RE.match(line) if listing else None
        if found:
            devices[found.group(1)] = found.group(2).strip()
    return devices


def gpu_proof(result: Any, device: Any = "CUDA0", unit: Any = "rigkit-nvidia-devices.service") -> dict[str, Any]:
    """``result``: the registered ``docker run ... --list-devices`` (rc, stdout, stderr). Returns ``ok``, the
    ``devices`` listed and, when ``device`` is not among them, a ``message`` with the cause and the next step."""
    if not isinstance(result, dict) or "rc" not in result:
        raise AnsibleFilterError("llama_server_gpu_proof expects the registered result of the docker run")
    devices = listed_devices(result.get("stdout"))
    if device in devices:
        return {"ok": True, "devices": devices, "message": f"{device}: {devices[device]}"}
    errors = _lines(result.get("stderr"))
    check = (
        f"Next: `systemctl status {unit}` (it creates /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidiaN at boot), "
        "`nvidia-ctk cdi list` (it must list the container's device), and the driver (`nvidia-smi`, "
        "`cat /sys/module/nvidia/version`); then run the nvidia_container_toolkit role again "
        "(make provision host=<rig>: its CDI spec follows the driver and the device nodes)."
    )
    if int(result["rc"]) != 0:
        cdi = [line for line in errors if CDI_RE.search(line)]
        if cdi:
            cause = (
                "Docker could not give the container the GPU: " + cdi[-1] + " (the CDI spec names a device node "
                "that does not exist, or does not describe the device)"
            )
        else:
            tail = " | ".join(errors[-3:]) or "no output"
            cause = f"the container exited with status {result['rc']}: {tail}"
        return {"ok": False, "devices": devices, "message": f"{cause}. {check}"}
    init = next((CUDA_INIT_RE.search(line) for line in errors if CUDA_INIT_RE.search(line)), None)
    listed = ", ".join(f"{name} ({text})" for name, text in devices.items()) or "none"
    if init:
        reason = init.group(1).strip()
        hint = (
            " (the driver is older than the image's CUDA runtime: upgrade the driver or build the image on an "
            "older CUDA base)"
            if "insufficient" in reason.lower()
            else " (most often /dev/nvidia-uvm or /dev/nvidiaN missing from the CDI spec or the host)"
        )
        cause = (
            f"CUDA did not initialise in the container: {reason}{hint}; devices listed: {listed}; llama-server "
            "would ignore --n-gpu-layers and serve on the CPU"
        )
    elif not any("cuda" in line.lower() for line in errors):
        cause = (
            f"the image lists no CUDA device and says nothing of CUDA (devices listed: {listed}): it was built "
            "without CUDA (llamacpp_image_cuda must be true on a GPU rig)"
        )
    else:
        tail = " | ".join(errors[-3:])
        cause = f"{device} is not among the devices the image lists ({listed}){': ' + tail if tail else ''}"
    return {"ok": False, "devices": devices, "message": f"{cause}. {check}"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"llama_server_gpu_proof": gpu_proof}
