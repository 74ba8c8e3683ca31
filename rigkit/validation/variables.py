"""What a rig's description may contain, as data: the kit's variable prefixes, the role entry points that run on
each kind of rig, the kit's own inventory keys, the names plays set at run time, and the ranges and formats the
argument specs' types cannot express. rigkit/validation/rules.py checks a rig against these.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.module_utils.llama_server.settings import DRAFT_N_MAX, PORT, POSITIVE
from ansible.module_utils.llama_server.settings import ranges as server_ranges
from ansible.module_utils.nvidia_compat import DRIVER_PINS

from rigkit import REPO
from rigkit.validation.entry_points import bench_only_roles, entry_points

# rig_os (make discover writes it from os-release): each supported release, as DRIVER_PINS knows them.
RIG_OS = {f"{distro}{version}": (distro, version) for distro, version in DRIVER_PINS}

# The role entry points that run on a rig of each kind, read from playbooks/ (rigkit/validation/entry_points.py).
ENTRY_POINTS = entry_points()

# Variable-name prefixes owned by the kit, one per role under roles/: such a variable must be declared somewhere.
# The broader ones catch a typo inside a role's prefix (nvidia_drvier_version) too.
KIT_ROLES = tuple(sorted(path.name for path in (REPO / "roles").iterdir() if (path / "tasks").is_dir()))
PREFIXES = (*(f"{role}_" for role in KIT_ROLES), "rig_", "nvidia_", "llama_")
# The roles whose variables shape a rig (every entry point but the bench's): rigkit/rig_inputs.py digests them.
SHAPING_ROLES = tuple(sorted({role for points in ENTRY_POINTS.values() for role, _ in points} - bench_only_roles()))

# Inventory keys of the kit itself and of the models play (playbooks/models.yml), which no role declares.
# Same shape as an argument spec's options (README, "Inventory keys").
KIT_VARIABLES: dict[str, dict[str, Any]] = {
    "rig_kind": {"type": "str", "choices": ["gpu", "sandbox"], "description": "What the rig is."},
    "rig_gpu": {"type": "dict", "description": "The GPU: name, vram_mib, compute_capability, headless, pci_device_id."},
    "rig_os": {
        "type": "str",
        "choices": sorted(RIG_OS),
        "description": "The rig's release (make discover writes it from os-release): its driver pins are checked "
        "against it.",
    },
    "rig_wants_cuda": {"type": "bool", "description": "Install the host CUDA toolkit (role cuda)."},
    "rig_accepted_llamacpp_issues": {
        "type": "list",
        "elements": "int",
        "description": "Known llama.cpp issues (rigkit/validation/llamacpp-known-issues.yml) this rig's owner accepts "
        "instead of the refusal, by number, where the file says they may.",
    },
    "rig_controller_cache_dir": {"type": "path", "description": "Controller cache (downloads, builds)."},
    "rig_expected_min_acceptance": {"type": "float", "description": "Canary acceptance the rig tests expect."},
    "rig_workload": {"type": "dict", "description": "{mix: {kind: weight}, concurrency: N} for make tune."},
    "models_upstream_base_url": {"type": "str", "description": "Where the controller downloads models from."},
    "models_upstream_allow_insecure_http": {"type": "bool", "description": "Accept a plain http:// upstream."},
    "models_mirror_port": {"type": "int", "description": "Port of the controller's model mirror."},
    "models_mirror_idle_timeout": {"type": "int", "description": "Seconds the idle mirror waits before stopping."},
    "models_mirror_max_age": {"type": "int", "description": "Seconds after which the mirror stops, busy or not."},
    "models_controller_address": {"type": "str", "description": "The controller's address as the rigs reach it."},
    "models_sandbox_hub_dir": {"type": "path", "description": "The sandbox's stand-in Hugging Face hub."},
    "models_sandbox_hub_port": {"type": "int", "description": "Port of the sandbox's stand-in hub."},
}

# What roles/rig_context names for a rig from its inputs (pure functions of the inventory and the kit's code).
CONTEXT_NAMES = frozenset(
    {
        "models_target_entry",
        "models_drafter_entry",
        "models_target_path",
        "models_drafter_path",
        "container_harness_base_image",
        "container_harness_rig_image",
        "llamacpp_image_tag",
        "llama_server_effective",
        "rig_context_ready",
    }
)
# Facts and registered results the kit's plays set at run time (never inventory keys, but present in later plays).
RUNTIME_VARIABLES = frozenset(
    {
        *CONTEXT_NAMES,
        "models_fleet_arrived",
        "rig_status_output",
    }
)
RUNTIME_PREFIXES = ("models_molecule_",)

# rig_gpu's fields (a GPU rig's inventory).
RIG_GPU_FIELDS = ("name", "vram_mib", "compute_capability", "headless", "pci_device_id")
COMPUTE_CAPABILITY_RE = re.compile(r"^[0-9]+\.[0-9]\Z")
# The llama.cpp image's inputs (roles/llamacpp_image/tasks/tag.yml asserts the same on the effective values).
COMMIT_RE = re.compile(r"^[0-9a-f]{40}\Z")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
CUDA_ARCHITECTURES_RE = re.compile(r"^[0-9]+(-real|-virtual)?(;[0-9]+(-real|-virtual)?)*\Z")
# Every API key (a rig's llama_server_api_key, the gateway's fleet_gateway_api_key): one token of printable ASCII, as an
# env file line, a key file line and an Authorization header carry it whole; \Z, so a final newline is refused; no
# leading # (a comment in HAProxy's key file).
API_KEY_RE = re.compile(r"^(?!#)[\x21-\x7e]{16,256}\Z")
API_KEY_SHAPE = "16 to 256 printable ASCII characters, no spaces or newlines, not starting with #"

# Integer ranges the specs' types cannot say: (lowest, highest or None, what is accepted). The preflight's budget and
# headroom (auto or MiB) have theirs with their auto rule, in module_utils/preflight/memory.py MEMORY_SETTINGS.
NON_NEGATIVE = (0, None, "an integer >= 0")
RANGES: dict[str, tuple[int, int | None, str]] = {
    **server_ranges(),  # the server's own settings: module_utils/llama_server/settings.py
    "llama_server_health_timeout": POSITIVE,
    "llama_server_canary_tokens": POSITIVE,
    "llama_server_restart_sec": NON_NEGATIVE,
    "llama_server_stop_timeout": POSITIVE,
    "llama_server_container_memory_margin_mib": NON_NEGATIVE,
    "llama_server_container_memory_floor_mib": NON_NEGATIVE,
    "llama_server_container_pids_limit": (
        64,
        None,
        "64 or more (llama-server runs a thread per core and its HTTP workers)",
    ),
    "llama_server_container_log_max_file": (1, 999, "1-999 rotated files"),
    "models_fetch_retries": NON_NEGATIVE,
    "models_mirror_port": PORT,
    "models_sandbox_hub_port": PORT,
    "models_mirror_idle_timeout": POSITIVE,
    "models_mirror_max_age": POSITIVE,
    "nvidia_driver_reboot_timeout": POSITIVE,
    "nvidia_driver_dkms_build_timeout": POSITIVE,
    "nvidia_driver_vram_tolerance_mib": NON_NEGATIVE,
    "llamacpp_image_build_number": POSITIVE,
    "llamacpp_image_build_timeout": POSITIVE,
    "llama_bench_draft_max": DRAFT_N_MAX,
    "llama_bench_concurrency_max": POSITIVE,
    "llama_bench_n_predict": POSITIVE,
    "llama_bench_warmup": NON_NEGATIVE,
    "llama_bench_repeats": POSITIVE,
    "llama_bench_passes": POSITIVE,
    "llama_bench_request_timeout": POSITIVE,
    "container_harness_rig_boot_timeout": POSITIVE,
}
GPU_LAYER_VARIABLES = ("llama_server_gpu_layers", "llama_server_gpu_layers_draft")
# docker's --log-opt max-size: a number and a unit (k, m, g).
LOG_SIZE_RE = re.compile(r"^[1-9][0-9]{0,5}[kmg]\Z")
MIN_CONTAINER_MEMORY_MIB = 256
