"""Read back what the kit deployed on a rig, as it is now (stdlib only: runs on rigs).

One reader for `make status` (everything, live server figures included) and for the lock file (the pinned
inputs only). Nothing here changes the rig; every probe that cannot answer says why instead of failing.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ansible.module_utils.fetch.model import sha256_file, verified_record
from ansible.module_utils.llama_server.api import Endpoint, ServerApiError, metrics
from ansible.module_utils.llama_server.config import serving
from ansible.module_utils.llama_server.settings import status_flags
from ansible.module_utils.rig_command import run

# What makes up the NVIDIA stack and the container engine on a rig (the lock pins their versions).
PACKAGE_PATTERN = re.compile(
    r"^(nvidia-|libnvidia-|libcuda1|libnvcuvid1|cuda-|firmware-nvidia|docker|containerd|runc|moby-)"
)


def _run(argv: list[str], timeout: float = 20.0) -> tuple[int, str]:
    """(exit code, stdout when it succeeded, else what it said on stderr or stdout)."""
    code, out, err = run(argv, timeout)
    return code, out if code == 0 else (err or out)


def packages(pattern: re.Pattern[str] = PACKAGE_PATTERN) -> dict[str, dict[str, Any]]:
    """Installed packages matching `pattern`: {name: {version, held}}."""
    code, out = _run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\t${db:Status-Want}\n"])
    if code != 0:
        return {}
    found = {}
    for line in out.splitlines():
        name, version, status, want = [*line.split("\t"), "", "", "", ""][:4]
        # Status-Abbrev: want (i install, h hold, ...) then state (i = installed)
        if status[1:2] == "i" and pattern.match(name):
            found[name] = {"version": version, "held": want == "hold"}
    return found


def gpu() -> dict[str, Any] | None:
    """What nvidia-smi says about the first GPU (None where there is no nvidia-smi or no GPU)."""
    code, out = _run(
        ["nvidia-smi", "--query-gpu=name,memory.total,compute_cap,driver_version", "--format=csv,noheader,nounits"]
    )
    if code != 0 or not out.strip():
        return None
    name, memory, capability, driver = (part.strip() for part in out.splitlines()[0].split(","))
    _, banner = _run(["nvidia-smi"])
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
    return {
        "name": name,
        "memory_mib": int(float(memory)),
        "compute_capability": capability,
        "driver": driver,
        "cuda": cuda.group(1) if cuda else None,
    }


def file_sha256(path: str) -> str | None:
    """The file's sha256 (model_fetch's streaming hasher), None when it cannot be read."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def unit_state(unit: str) -> dict[str, Any]:
    code, out = _run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,ActiveEnterTimestampMonotonic,FragmentPath"]
    )
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if code == 0 else {}
    state: dict[str, Any] = {
        "active": props.get("ActiveState", "unknown"),
        "sub": props.get("SubState", "unknown"),
        "uptime_s": None,
        "path": props.get("FragmentPath") or None,
    }
    entered = int(props.get("ActiveEnterTimestampMonotonic", "0") or 0)
    if state["active"] == "active" and entered:
        state["uptime_s"] = round(time.clock_gettime(time.CLOCK_MONOTONIC) - entered / 1e6, 1)
    return state


def docker_inspect(kind: str, name: str) -> dict[str, Any] | None:
    code, out = _run(["docker", kind, "inspect", name])
    if code != 0:
        return None
    found = json.loads(out)
    return found[0] if found else None


def image(tag: str) -> dict[str, Any] | None:
    inspected = docker_inspect("image", tag)
    if inspected is None:
        return None
    labels = (inspected.get("Config") or {}).get("Labels") or {}
    return {
        "tag": tag,
        "id": inspected.get("Id"),
        "llamacpp_commit": labels.get("io.rigkit.llamacpp.commit"),
        "llamacpp_build_number": labels.get("io.rigkit.llamacpp.build-number"),
        "source_sha256": labels.get("io.rigkit.llamacpp.source-sha256"),
        "cuda": labels.get("io.rigkit.ggml-cuda"),
        "cuda_architectures": labels.get("io.rigkit.cuda-architectures"),
        # what cuobjdump found in the binary at build time (the build fails unless it is what was asked)
        "cuda_sass": labels.get("io.rigkit.cuda-sass"),
        "cuda_ptx": labels.get("io.rigkit.cuda-ptx"),
        "build_base_image": labels.get("io.rigkit.build-base-image"),
        "runtime_base_image": labels.get("io.rigkit.runtime-base-image"),
        "toolchain_packages": labels.get("io.rigkit.toolchain-packages"),
        "runtime_packages": labels.get("io.rigkit.runtime-packages"),
    }


# llama-server's flags whose values `make status` shows and compares with the inventory (both spellings).
def server_settings(argv: list[str]) -> dict[str, Any]:
    """The settings llama-server was started with, from its argv (the container's Args): what runs, whatever
    the unit file or the inventory say now. The server's API does not report the draft length itself."""
    found: dict[str, Any] = {}
    flags = status_flags()
    args = iter(argv)
    for arg in args:
        flag, sep, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        key = flags.get(flag)
        if key is None:
            continue
        if not sep:
            value = next(args, "")
        found[key] = int(value) if re.fullmatch(r"[0-9]+", value) else value
    return found


def container(name: str, proven_path: str | None = None) -> dict[str, Any] | None:
    """The server's container as it runs: image, state, settings, and (``proven``) whether the configuration it
    started from passed its canary (the instance's ``.proven`` file at ``proven_path``)."""
    inspected = docker_inspect("container", name)
    if inspected is None:
        return None
    args = inspected.get("Args") or []
    return {
        **serving(inspected, proven_path),
        "image": (inspected.get("Config") or {}).get("Image"),
        "health": ((inspected.get("State") or {}).get("Health") or {}).get("Status"),
        "settings": server_settings([str(arg) for arg in args]),
    }


def model(path: str, sha256: str, size: int) -> dict[str, Any]:
    """Whether the file is there and still the one that was verified (its record matches the file)."""
    record = verified_record(path, sha256, size) if path else None
    return {"path": path, "sha256": sha256, "verified": record is not None}


def server(url: str, api_key: str | None = None, timeout: float = 5.0, ca_file: str | None = None) -> dict[str, Any]:
    """The running server's own account: build, slots (context, drafting), lifetime draft and decode figures."""
    endpoint = Endpoint(url, api_key, timeout=timeout, ca_file=ca_file)
    found: dict[str, Any] = {"answers": False}
    try:
        props = endpoint.get_json("/props")
        slots = endpoint.get_json("/slots")
    except (ServerApiError, ValueError) as exc:
        found["error"] = str(exc)
        return found
    found.update(
        answers=True,
        build_info=props.get("build_info"),
        slots=len(slots),
        ctx_per_slot=slots[0].get("n_ctx") if slots else None,
        speculative=bool(slots) and all(slot.get("speculative") for slot in slots),
        spec_types=(slots[0].get("params") or {}).get("speculative.types") if slots else None,
    )
    try:
        values = metrics(endpoint)
    except ServerApiError:
        return found
    drafted = values.get("llamacpp:spec_decode_num_draft_tokens_total", 0.0)
    accepted = values.get("llamacpp:spec_decode_num_accepted_tokens_total", 0.0)
    found.update(
        tokens_predicted=int(values.get("llamacpp:tokens_predicted_total", 0)),
        # lifetime rate from the totals (predicted_tokens_seconds is reset by every scrape)
        decode_tps=(values["llamacpp:tokens_predicted_total"] / values["llamacpp:tokens_predicted_seconds_total"])
        if values.get("llamacpp:tokens_predicted_seconds_total")
        else None,
        drafted_tokens=int(drafted),
        accepted_tokens=int(accepted),
        acceptance=(accepted / drafted) if drafted else None,
    )
    return found
